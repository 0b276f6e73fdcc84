"""The caller's columns, named and checked on this rank alone (no communication).

``aggregate`` takes keys and values as one array, a tuple/list of arrays or a mapping
name -> array, and ``aggs`` as a name, a list of names or a mapping value name -> names.
:func:`parse` turns them into a :class:`Call`. A problem found here is not raised at once:
it is recorded as ``Call.error`` and travels in the schema, so that every rank of the
group raises it (a rank that raised alone would leave its peers waiting in a collective).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

#: Aggregations ``aggregate`` computes, with pandas' names and meaning.
AGGS = ("sum", "count", "mean", "min", "max", "var", "std", "first", "last")
#: Merge modes of ``aggregate``.
MERGES = ("root", "shuffle", "gather", "none")
KEY_KINDS = "biufUS"
VALUE_KINDS = "biuf"


class InputError(Exception):
    """A problem with this rank's arguments; ``kind`` is ``"value"`` or ``"type"``."""

    def __init__(self, kind: str, text: str) -> None:
        super().__init__(text)
        self.kind = kind
        self.text = text


@dataclass
class Call:
    """One rank's parsed arguments: named 1-D columns and the aggregations per value column."""

    key_names: tuple[str, ...] = ()
    keys: list[np.ndarray] = field(default_factory=list)
    key_form: str = "array"  # how the caller passed keys: "array", "tuple", "list" or "dict"
    value_names: tuple[str, ...] = ()
    values: list[np.ndarray] = field(default_factory=list)
    value_form: str = "array"
    aggs: dict[str, tuple[str, ...]] = field(default_factory=dict)
    error: InputError | None = None

    @property
    def rows(self) -> int:
        return len(self.keys[0]) if self.keys else 0


def _column(obj: Any, what: str) -> np.ndarray:
    if isinstance(obj, (str, bytes)) or np.isscalar(obj) or obj is None:
        raise InputError("type", f"{what} must be a 1-D array, got {type(obj).__name__} {obj!r}")
    try:
        arr = np.asarray(obj)
    except (TypeError, ValueError) as exc:
        raise InputError("type", f"{what} cannot be converted to an array ({exc})") from None
    if arr.ndim != 1:
        raise InputError("value", f"{what} must be 1-D, got shape {arr.shape}")
    return arr


def _named(obj: Any, prefix: str, what: str) -> tuple[tuple[str, ...], list[np.ndarray], str]:
    if isinstance(obj, Mapping):
        names = tuple(str(n) for n in obj)
        if not names:
            raise InputError("value", f"{what} mapping is empty")
        cols = [_column(obj[n], f"{what} column {str(n)!r}") for n in obj]
        return names, cols, "dict"
    if isinstance(obj, (tuple, list)) and not (obj and np.isscalar(obj[0])):
        if not obj:
            raise InputError("value", f"{what} is an empty {type(obj).__name__}; pass at least one column")
        names = tuple(f"{prefix}{i}" for i in range(len(obj)))
        cols = [_column(c, f"{what} column {n!r}") for n, c in zip(names, obj)]
        return names, cols, type(obj).__name__
    return (prefix,), [_column(obj, f"{what} column {prefix!r}")], "array"


def _aggs(aggs: Any, value_names: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    def names(spec: Any, where: str) -> tuple[str, ...]:
        out = (spec,) if isinstance(spec, str) else tuple(spec) if isinstance(spec, (list, tuple)) else None
        if not out:
            raise InputError("type", f"aggs{where} must be an aggregation name or a non-empty list of "
                             f"names, got {spec!r}")
        for a in out:
            if a not in AGGS:
                raise InputError("value", f"aggs{where} has unknown aggregation {a!r}; "
                                 f"supported: {', '.join(AGGS)}")
        if len(set(out)) != len(out):
            raise InputError("value", f"aggs{where} lists an aggregation twice: {list(out)}")
        return out

    if isinstance(aggs, Mapping):
        for v in aggs:
            if str(v) not in value_names:
                raise InputError("value", f"aggs names value column {str(v)!r}, which is not among the "
                                 f"values {list(value_names)}")
        return {str(v): names(spec, f"[{str(v)!r}]") for v, spec in aggs.items()}
    common = names(aggs, "")
    return {v: common for v in value_names}


def parse(keys: Any, values: Any, aggs: Any) -> Call:
    """Name, convert and check this rank's arguments; a problem is kept in ``error``."""
    call = Call()
    try:
        call.key_names, call.keys, call.key_form = _named(keys, "key", "keys")
        call.value_names, call.values, call.value_form = _named(values, "value", "values")
        overlap = set(call.key_names) & set(call.value_names)
        if overlap:
            raise InputError("value", f"column name(s) {sorted(overlap)} used for both a key and a value")
        call.aggs = _aggs(aggs, call.value_names)
        n = call.rows
        for kind, names, cols, allowed in (("key", call.key_names, call.keys, KEY_KINDS),
                                           ("value", call.value_names, call.values, VALUE_KINDS)):
            for name, col in zip(names, cols):
                if len(col) != n:
                    raise InputError("value", f"{kind} column {name!r} has {len(col)} rows, key column "
                                     f"{call.key_names[0]!r} has {n}")
                # an empty column may carry any dtype (an empty DataFrame's is object); it takes
                # the group's dtype once the schema is known
                if n and col.dtype.kind not in allowed:
                    raise InputError("type", f"{kind} column {name!r} has unsupported dtype {col.dtype}; "
                                     f"{kind}s must be {_describe(allowed)}")
    except InputError as exc:
        call.error = exc
    return call


def _describe(kinds: str) -> str:
    words = {"b": "bool", "i": "int", "u": "uint", "f": "float", "U": "str", "S": "bytes"}
    return "/".join(words[k] for k in kinds)


def valid_key_rows(keys: Sequence[np.ndarray]) -> np.ndarray | None:
    """Rows whose keys are all non-NaN (pandas drops NaN keys), or ``None`` when all are."""
    mask = None
    for col in keys:
        if col.dtype.kind == "f":
            bad = np.isnan(col)
            if bad.any():
                mask = ~bad if mask is None else mask & ~bad
    return mask

"""Agreement on the call before any data moves: one small ``MPI_Allgather`` of a schema.

Every rank sends what it was asked to do (merge mode, root, column names, dtypes, row
count, aggregations) or the error it found in its own arguments. Every rank then checks
the same list, so all of them raise the same exception, naming the rank and the column,
instead of one rank failing while the others wait inside the data exchange.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core import errors
from ..core.groups import ProcessGroup
from .columns import KEY_KINDS, VALUE_KINDS, Call


def _dtype_word(dt: np.dtype) -> str:
    """Strings agree on kind only (widths differ by rank); numbers on the exact dtype."""
    return {"U": "str", "S": "bytes"}.get(dt.kind, dt.name)


def local(call: Call, extra: tuple) -> dict[str, Any]:
    """This rank's schema; ``extra`` holds the scalar arguments every rank must agree on."""
    if call.error is not None:
        return {"error": (call.error.kind, call.error.text)}
    return {
        "error": None,
        "extra": extra,
        "rows": call.rows,
        "keys": [(n, c.dtype.str, c.dtype.itemsize) for n, c in zip(call.key_names, call.keys)],
        "values": [(n, c.dtype.str) for n, c in zip(call.value_names, call.values)],
        "aggs": call.aggs,
    }


def _raise(kind: str, name: str, text: str) -> None:
    raise (errors.type_error if kind == "type" else errors.value_error)(name, text)


def agree(pg: ProcessGroup, call: Call, extra: tuple, name: str, extra_names: tuple[str, ...]
          ) -> tuple[list[np.dtype], list[np.dtype]]:
    """Allgather the schema; raise on every rank if any rank's input is bad or differs.

    Returns the common key and value dtypes, strings widened to the widest on any rank (columns
    move as fixed-width bytes, so every rank must use the same width). A rank with no
    rows takes the common dtypes (an empty DataFrame's columns are often ``object``);
    when no rank has rows, a column of no usable dtype becomes float64.
    """
    schemas = pg.comm.allgather(local(call, extra))
    for r, s in enumerate(schemas):
        if s["error"] is not None:
            kind, text = s["error"]
            _raise(kind, name, f"input on rank {r} is invalid: {text}")
    filled = [r for r, s in enumerate(schemas) if s["rows"]]
    ref = filled[0] if filled else 0
    want = schemas[ref]
    for r, s in enumerate(schemas):
        for i, label in enumerate(extra_names):
            if s["extra"][i] != want["extra"][i]:
                _raise("value", name, f"rank {r} passed {label}={s['extra'][i]!r}, rank {ref} passed "
                       f"{want['extra'][i]!r}; every rank must pass the same")
        for what in ("keys", "values"):
            mine, theirs = s[what], want[what]
            if [c[0] for c in mine] != [c[0] for c in theirs]:
                _raise("value", name, f"rank {r} passed {what[:-1]} columns {[c[0] for c in mine]}, "
                       f"rank {ref} passed {[c[0] for c in theirs]}")
            if not s["rows"]:
                continue
            for a, b in zip(mine, theirs):
                da, db = np.dtype(a[1]), np.dtype(b[1])
                if _dtype_word(da) != _dtype_word(db):
                    _raise("value", name, f"rank {r} passed {what[:-1]} column {a[0]!r} with dtype {da}, "
                           f"rank {ref} passed {db}")
        if s["aggs"] != want["aggs"]:
            _raise("value", name, f"rank {r} passed aggs {s['aggs']}, rank {ref} passed {want['aggs']}")
    key_dtypes = []
    for i, (col, dt, _) in enumerate(want["keys"]):
        dt = np.dtype(dt)
        if dt.kind not in KEY_KINDS:
            if not filled:  # no rows anywhere: any dtype will do
                key_dtypes.append(np.dtype(np.float64))
                continue
            _raise("type", name, f"key column {col!r} has unsupported dtype {dt} on every rank")
        if dt.kind in "US":
            nbytes = max([schemas[r]["keys"][i][2] for r in filled] or [dt.itemsize])
            dt = np.dtype(f"{dt.kind}{max(1, nbytes // (4 if dt.kind == 'U' else 1))}")
        key_dtypes.append(dt)
    value_dtypes = [np.dtype(dt) if filled or np.dtype(dt).kind in VALUE_KINDS else np.dtype(np.float64)
                    for _, dt in want["values"]]
    for (col, _), dt in zip(want["values"], value_dtypes):
        if dt.kind not in VALUE_KINDS:
            _raise("type", name, f"value column {col!r} has unsupported dtype {dt} on every rank")
    return key_dtypes, value_dtypes


def conform(call: Call, key_dtypes: list[np.dtype], value_dtypes: list[np.dtype]) -> None:
    """Give this rank's columns the agreed dtypes (widen strings; type the empty columns)."""
    call.keys = [c if c.dtype == d else c.astype(d) for c, d in zip(call.keys, key_dtypes)]
    call.values = [c if c.dtype == d else c.astype(d) for c, d in zip(call.values, value_dtypes)]

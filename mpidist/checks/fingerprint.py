"""Fingerprints: what of a call's arguments must agree on every rank, as text.

Each call declares its fingerprint with :func:`agree` (in its :func:`~mpidist.core.registry.define`),
naming how each argument is described: :data:`ARRAY` (dtype and shape), :data:`DTYPE`,
:data:`OP`, :data:`ROOT` (the root's global rank from ``src``/``group_src`` or
``dst``/``group_dst``) or :data:`LENGTH` (of a list). Calls whose counts legitimately differ per
rank (the all-to-alls) add a ``counts`` function: what each rank sends to and expects from each
peer, which debug mode checks pairwise.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..core import errors
from ..core.groups import ProcessGroup, group_rank_of

ARRAY, DTYPE, OP, ROOT, LENGTH = "array", "dtype", "op", "root", "length"


def describe(x: Any) -> str:
    """``float32 (4,)`` for an array or tensor, ``[...]`` for a list, else the type name."""
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(describe(v) for v in x) + "]"
    shape = getattr(x, "shape", None)
    dtype = getattr(x, "dtype", None)
    if shape is None or dtype is None:
        return errors.type_name(x)
    return f"{str(dtype).rpartition('.')[2]} {tuple(shape)}"


def dtype_of(x: Any) -> str:
    if isinstance(x, (list, tuple)):
        return dtype_of(x[0]) if x else "-"
    d = getattr(x, "dtype", None)
    return errors.type_name(x) if d is None else str(d).rpartition(".")[2]


def numel(x: Any) -> int:
    return int(np.prod(getattr(x, "shape", ()), dtype=np.int64))


def _op(op: Any) -> str:
    return getattr(op, "name", None) or repr(op)


def _root(pg: ProcessGroup, a: dict, what: str, call: str) -> str:
    try:
        return str(pg.ranks[group_rank_of(pg, a.get(what), a.get(f"group_{what}"), call, what)])
    except Exception:
        return f"invalid ({what}={a.get(what)!r}, group_{what}={a.get(f'group_{what}')!r})"


_DESCRIBE: dict[str, Callable[[Any], str]] = {
    ARRAY: describe, DTYPE: dtype_of, OP: _op, LENGTH: lambda x: f"list of {len(x)}",
}

Counts = Callable[[ProcessGroup, dict], tuple[list[int], list[int]]]


def agree(counts: Counts | None = None, **how: str | tuple[str, str]) -> Callable[..., tuple]:
    """A fingerprint: ``how`` maps each field, in order, to how its argument is described.

    A field is an argument's name with a description kind (or ``ROOT``), or any name with
    ``(kind, argument)``. The fingerprint returns ``({field: text}, (sends, expects) or None)``.
    """
    def fingerprint(pg: ProcessGroup, a: dict, call: str) -> tuple[dict[str, str], Any]:
        f: dict[str, str] = {"group": pg.group_name}
        for field, kind in how.items():
            kind, arg = kind if isinstance(kind, tuple) else (kind, field)
            f[field] = _root(pg, a, arg, call) if kind == ROOT else _DESCRIBE[kind](a[arg])
        return f, None if counts is None else counts(pg, a)
    fingerprint.pairwise = counts is not None  # type: ignore[attr-defined]
    return fingerprint


def list_counts(pg: ProcessGroup, a: dict) -> tuple[list[int], list[int]]:
    """``all_to_all``: elements this rank sends to / expects from each peer."""
    return [numel(t) for t in a["input_tensor_list"]], [numel(t) for t in a["output_tensor_list"]]


def split_counts(pg: ProcessGroup, a: dict) -> tuple[list[int], list[int]]:
    """``all_to_all_single``: elements sent to / expected from each peer, from the split sizes."""
    out, inp = a["output"], a["input"]
    row = numel(inp) // max(inp.shape[0], 1) if len(inp.shape) else 1
    counts = []
    for t, splits in ((inp, a.get("input_split_sizes")), (out, a.get("output_split_sizes"))):
        rows = t.shape[0] if len(t.shape) else 1
        rows_each = list(splits) if splits else [rows // pg._size] * pg._size
        counts.append([int(r) * row for r in rows_each])
    return counts[0], counts[1]

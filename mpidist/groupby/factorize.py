"""Group ids: which group each row belongs to, groups numbered in sorted key order.

Integer keys spanning a range not much wider than the row count are numbered by direct
addressing (a presence table and a running count: O(rows), no sort). Other keys go
through ``np.unique`` (hash-based in numpy >= 2.3) and ``np.searchsorted``. A composite
key combines its columns' group ids in mixed radix, which keeps lexicographic order.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

# direct addressing when the key range is at most this many times the row count (plus slack)
_DENSE_FACTOR = 4
_DENSE_SLACK = 1 << 16


def _dense(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Direct addressing for integer ``codes``; ``None`` when their range is too wide."""
    n = len(codes)
    lo, hi = int(codes.min()), int(codes.max())
    span = hi - lo + 1
    if span > _DENSE_FACTOR * n + _DENSE_SLACK:
        return None
    if codes.dtype.itemsize < 8:
        off = codes.astype(np.intp) - lo
    else:  # wrapping 64-bit subtraction is exact here: the true difference is below span
        off = (codes - codes.dtype.type(lo)).view(np.intp)
    present = np.zeros(span, dtype=bool)
    present[off] = True
    slots = np.flatnonzero(present)
    number = np.empty(span, dtype=np.intp)
    number[slots] = np.arange(len(slots), dtype=np.intp)
    if codes.dtype.itemsize < 8:
        uniq = (slots + lo).astype(codes.dtype)
    else:
        uniq = slots.astype(codes.dtype) + codes.dtype.type(lo)
    return number[off], uniq


def _one(col: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(group id per row, sorted unique values)`` of one key column."""
    if len(col) == 0:
        return np.empty(0, dtype=np.intp), col[:0]
    if col.dtype.kind in "biu":
        ints = col.view(np.uint8) if col.dtype.kind == "b" else col
        hit = _dense(ints)
        if hit is not None:
            gid, uniq = hit
            return gid, uniq.view(col.dtype)
    uniq = np.unique(col)
    return np.searchsorted(uniq, col).astype(np.intp, copy=False), uniq


def group_ids(cols: Sequence[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Number the groups of the key ``cols`` (equal length, no NaN).

    Returns ``(gid, keys)``: ``gid[i]`` in ``0..G-1`` is row ``i``'s group, and
    ``keys[j][g]`` is column ``j``'s value for group ``g``. Groups are numbered in
    ascending key order (lexicographic for several columns), as pandas sorts them.
    """
    if len(cols) == 1:
        gid, uniq = _one(cols[0])
        return gid, [uniq]
    parts = [_one(c) for c in cols]
    code, card = parts[0][0].astype(np.int64), len(parts[0][1])
    for gid_j, uniq_j in parts[1:]:
        nj = len(uniq_j)
        if card * nj >= 1 << 62:  # renumber the prefix before it overflows
            code, kept = _one(code)
            card = len(kept)
        code = code * nj + gid_j
        card *= nj
    gid, _ = _one(code)
    ngroups = int(gid.max()) + 1 if len(gid) else 0
    rep = np.empty(ngroups, dtype=np.intp)
    rep[gid] = np.arange(len(gid), dtype=np.intp)  # any row of each group: all share its key
    return gid, [c[rep] for c in cols]

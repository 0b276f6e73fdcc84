"""Deterministic 64-bit key hashes, the same on every rank and in every run.

Python's ``hash()`` of ``str``/``bytes`` is salted per process, so ranks would disagree on
where a key lives; these hashes depend only on the key's value. Numbers hash their
float64/uint64 bit pattern (``-0.0`` as ``0.0``, every NaN as one NaN), strings their
fixed-width bytes in 8-byte words with the all-zero padding words skipped, so a string
hashes the same at any width.
Mixing is the splitmix64 finaliser, vectorised over rows; the only Python loop runs over
the 8-byte words of a string column's width.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic, new array)."""
    x = x ^ (x >> np.uint64(30))
    x *= _M1
    x ^= x >> np.uint64(27)
    x *= _M2
    x ^= x >> np.uint64(31)
    return x


def _words(col: np.ndarray) -> np.ndarray:
    """A string column as an ``(n, words)`` uint64 matrix, zero-padded to whole words."""
    n, width = len(col), col.dtype.itemsize
    raw = np.ascontiguousarray(col).view(np.uint8).reshape(n, width)
    pad = -width % 8
    if pad:
        raw = np.concatenate([raw, np.zeros((n, pad), dtype=np.uint8)], axis=1)
    return raw.view(np.uint64)


def hash_column(col: np.ndarray) -> np.ndarray:
    """uint64 hash of every element of one key column."""
    kind = col.dtype.kind
    if kind in "US":
        h = np.full(len(col), _GOLDEN, dtype=np.uint64)
        words = _words(col)
        for j in range(words.shape[1]):
            w = words[:, j]
            h = np.where(w != 0, _mix(h ^ w), h)
        return h
    if kind == "f":
        x = col.astype(np.float64) + 0.0  # + 0.0 turns -0.0 into 0.0
        bits = np.where(np.isnan(x), np.nan, x).view(np.uint64)  # one NaN pattern, sign included
    else:
        bits = col.astype(np.uint64)
    return _mix(bits ^ _GOLDEN)


def hash_keys(cols: Sequence[np.ndarray]) -> np.ndarray:
    """One uint64 hash per row of a (possibly composite) key."""
    h = hash_column(cols[0])
    for col in cols[1:]:
        h = _mix(h * _GOLDEN + hash_column(col))
    return h


def owners(cols: Sequence[np.ndarray], size: int) -> np.ndarray:
    """The rank (``0..size-1``) that owns each row's key."""
    if size == 1:
        return np.zeros(len(cols[0]), dtype=np.intp)
    return (hash_keys(cols) % np.uint64(size)).astype(np.intp)

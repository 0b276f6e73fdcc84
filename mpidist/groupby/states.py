"""Partial aggregation states: built from rows, merged across ranks, finished into results.

One value column's state per group is a few arrays, only those its aggregations need:
``count`` (non-NaN rows, always kept), ``sum``, ``mean`` and ``m2`` (sum of squared
deviations from the mean, for var/std), ``min``, ``max``, ``first``, ``last``. States from
several ranks merge exactly: counts and sums add, min/max take the extreme, first/last
take the earliest/latest rank that saw a value, and (count, mean, m2) combine by Chan et
al.'s parallel formula, ``M2 = sum(M2_i) + sum(n_i * (mean_i - mean)**2)``, which never
subtracts two large sums of squares. Everything is a ``bincount`` or an unbuffered
``ufunc.at`` over group ids; nothing loops over rows or groups in Python.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

_ORDER = ("count", "sum", "mean", "m2", "min", "max", "first", "last")
_NEEDS = {"count": (), "sum": ("sum",), "mean": ("sum",), "var": ("mean", "m2"), "std": ("mean", "m2"),
          "min": ("min",), "max": ("max",), "first": ("first",), "last": ("last",)}


def needed(aggs: Sequence[str]) -> tuple[str, ...]:
    """The states that ``aggs`` need, ``count`` first, in a fixed order every rank shares."""
    want = {"count"}.union(*(_NEEDS[a] for a in aggs))
    return tuple(s for s in _ORDER if s in want)


def _sum_dtype(dt: np.dtype) -> np.dtype:
    return np.dtype(np.uint64 if dt.kind == "u" else np.int64 if dt.kind in "bi" else np.float64)


def state_dtype(name: str, value_dtype: np.dtype) -> np.dtype:
    """The dtype of state ``name`` for a value column of ``value_dtype`` (same on every rank)."""
    if name == "count":
        return np.dtype(np.int64)
    if name == "sum":
        return _sum_dtype(value_dtype)
    return np.dtype(np.float64) if name in ("mean", "m2") else value_dtype


def _wsum(g: np.ndarray, w: np.ndarray, ngroups: int) -> np.ndarray:
    """Per-group float64 sum of ``w`` (``bincount`` returns int64 when there are no rows)."""
    return np.bincount(g, weights=w, minlength=ngroups).astype(np.float64, copy=False)


def _add(g: np.ndarray, ngroups: int, x: np.ndarray, dt: np.dtype) -> np.ndarray:
    """Per-group sum; integers exactly (wrapping like numpy/pandas), floats in float64."""
    if dt.kind == "f":
        return _wsum(g, x, ngroups)
    out = np.zeros(ngroups, dtype=dt)
    np.add.at(out, g, x)
    return out


def _extreme(ufunc: np.ufunc, g: np.ndarray, ngroups: int, x: np.ndarray, count: np.ndarray
             ) -> np.ndarray:
    dt = x.dtype
    if dt.kind == "f":
        init = np.inf if ufunc is np.minimum else -np.inf
    elif dt.kind == "b":
        init = ufunc is np.minimum
    else:
        info = np.iinfo(dt)
        init = info.max if ufunc is np.minimum else info.min
    out = np.full(ngroups, init, dtype=dt)
    ufunc.at(out, g, x)
    if dt.kind == "f":
        out[count == 0] = np.nan
    return out


def _pick(ufunc: np.ufunc, g: np.ndarray, ngroups: int, x: np.ndarray) -> np.ndarray:
    """The first (``np.minimum``) or last (``np.maximum``) ``x`` of each group, in row order."""
    n = len(x)
    pos = np.full(ngroups, n if ufunc is np.minimum else -1, dtype=np.intp)
    ufunc.at(pos, g, np.arange(n, dtype=np.intp))
    # one sentinel after the data: index n and index -1 both land on it (empty groups)
    ext = np.empty(n + 1, dtype=x.dtype)
    ext[:n] = x
    ext[n] = np.nan if x.dtype.kind == "f" else 0
    return ext[pos]


def _shared(states: dict[str, np.ndarray], names: tuple[str, ...], g: np.ndarray, ngroups: int,
            cols: dict[str, np.ndarray]) -> None:
    """min/max/first/last: the same reduction for rows and for states (valid entries only)."""
    count = states["count"]
    for name, fn in (("min", _extreme), ("max", _extreme), ("first", _pick), ("last", _pick)):
        if name in names:
            ufunc = np.minimum if name in ("min", "first") else np.maximum
            x = cols[name]
            states[name] = fn(ufunc, g, ngroups, x, count) if fn is _extreme else fn(ufunc, g, ngroups, x)


def from_rows(gid: np.ndarray, ngroups: int, v: np.ndarray, names: tuple[str, ...]
              ) -> dict[str, np.ndarray]:
    """States of one value column ``v`` from raw rows; NaN values are skipped, as pandas does."""
    g, x = gid, v
    if v.dtype.kind == "f":
        ok = ~np.isnan(v)
        if not ok.all():
            g, x = gid[ok], v[ok]
    states = {"count": np.bincount(g, minlength=ngroups).astype(np.int64, copy=False)}
    count = states["count"]
    with np.errstate(invalid="ignore", divide="ignore"):
        if "sum" in names:
            states["sum"] = _add(g, ngroups, x, _sum_dtype(v.dtype))
        if "mean" in names:
            s = states["sum"] if v.dtype.kind == "f" and "sum" in names else _wsum(g, x, ngroups)
            mean = s / count
            states["mean"] = mean
            dev = x - mean[g]
            states["m2"] = _wsum(g, dev * dev, ngroups)
    _shared(states, names, g, ngroups, {k: x for k in ("min", "max", "first", "last")})
    return states


def merge(gid: np.ndarray, ngroups: int, parts: dict[str, np.ndarray], names: tuple[str, ...],
          value_dtype: np.dtype) -> dict[str, np.ndarray]:
    """Merge partial states (one row per (rank, key), in rank order) into one row per group."""
    cnt = parts["count"]
    count = np.zeros(ngroups, dtype=np.int64)
    np.add.at(count, gid, cnt)
    states = {"count": count}
    if "sum" in names:
        states["sum"] = _add(gid, ngroups, parts["sum"], _sum_dtype(value_dtype))
    valid = cnt > 0
    if "mean" in names:
        w = cnt.astype(np.float64)
        mu = np.where(valid, parts["mean"], 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = _wsum(gid, w * mu, ngroups) / count
        dev = np.where(valid, mu - mean[gid], 0.0)
        states["mean"] = mean
        states["m2"] = (_wsum(gid, np.where(valid, parts["m2"], 0.0), ngroups)
                        + _wsum(gid, w * dev * dev, ngroups))
    if valid.all():
        _shared(states, names, gid, ngroups, parts)
    else:
        _shared(states, names, gid[valid], ngroups, {k: v[valid] for k, v in parts.items()})
    return states


def finish(states: dict[str, np.ndarray], aggs: Sequence[str], value_dtype: np.dtype
           ) -> dict[str, np.ndarray]:
    """The requested aggregations from merged states, with pandas' result dtypes.

    ``count`` is int64; ``sum`` is int64 (uint64 for unsigned) for integers and bool, the
    value dtype for floats; ``mean``, ``var`` and ``std`` (ddof=1, NaN below two values)
    keep a float value dtype and are float64 for integers and bools; ``min``/``max``/``first``/``last``
    keep the value dtype. A group whose values are all NaN gets sum 0 and NaN elsewhere.
    """
    count = states["count"]
    out = {}
    var = None
    for a in aggs:
        if a == "count":
            out[a] = count
        elif a == "sum":
            s = states["sum"]
            out[a] = s.astype(value_dtype) if value_dtype.kind == "f" else s
        elif a == "mean":
            with np.errstate(invalid="ignore", divide="ignore"):
                mean = states["sum"] / count
            out[a] = mean.astype(value_dtype) if value_dtype.kind == "f" else mean
        elif a in ("var", "std"):
            if var is None:
                with np.errstate(invalid="ignore", divide="ignore"):
                    var = np.where(count > 1, states["m2"] / (count - 1), np.nan)
                if value_dtype.kind == "f":
                    var = var.astype(value_dtype)
            out[a] = var if a == "var" else np.sqrt(var)
        else:
            out[a] = states[a]
    return out

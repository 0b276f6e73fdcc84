"""The pandas front: ``aggregate_frame(df, by, aggs)`` with ``DataFrame.groupby(by).agg(aggs)``'s result.

pandas is imported when the function is called, never by ``import mpidist.groupby``.
Columns leave the DataFrame as numpy arrays (numeric columns without a copy; string
columns as fixed-width numpy strings), rows with a missing key are dropped as pandas'
``dropna=True`` does, and the result is rebuilt with the index and column labels pandas
would give.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..core.groups import ProcessGroup
from . import api
from .columns import Call, InputError, parse
from .result import GroupByResult


def _key_array(s: Any, label: Any) -> np.ndarray:
    import pandas as pd

    dt = s.dtype
    if isinstance(dt, np.dtype) and dt.kind in "biuf":
        return s.to_numpy()
    if len(s) == 0:
        return np.empty(0, dtype=np.float64)  # an empty rank's column takes the group's dtype later
    kind = pd.api.types.infer_dtype(s, skipna=True)
    if kind == "string":
        return s.to_numpy(dtype=str)
    if kind == "bytes":
        return np.asarray(s.to_numpy(), dtype=bytes)
    if kind in ("integer", "floating", "boolean") and not isinstance(dt, np.dtype):  # nullable dtypes
        return s.to_numpy(dtype=np.float64 if kind == "floating" else None)
    raise InputError("type", f"key column {label!r} has dtype {dt} (inferred {kind}); keys must be "
                     "numbers, bools or strings")


def _value_array(s: Any, label: Any) -> np.ndarray:
    dt = s.dtype
    if isinstance(dt, np.dtype):
        return s.to_numpy()
    if len(s) == 0:
        return np.empty(0, dtype=np.float64)
    try:  # nullable numeric dtypes: missing values become NaN, which aggregation skips
        return s.to_numpy(dtype=np.float64, na_value=np.nan)
    except (TypeError, ValueError):
        raise InputError("type", f"value column {label!r} has non-numeric dtype {dt}") from None


def _split(df: Any, by: Any, aggs: Any) -> tuple[list, list, Any, bool]:
    """``(key labels, value labels, aggs by str name, MultiIndex columns?)`` of a call."""
    import pandas as pd

    if not isinstance(df, pd.DataFrame):
        raise InputError("type", f"df must be a pandas.DataFrame, got {type(df).__name__}")
    by_list = list(by) if isinstance(by, (list, tuple)) else [by]
    if not by_list:
        raise InputError("value", "by names no column")
    for b in by_list:
        if b not in df.columns:
            raise InputError("value", f"by names column {b!r}, which is not in the DataFrame "
                             f"(columns {list(df.columns)})")
    if isinstance(aggs, Mapping):
        for c in aggs:
            if c not in df.columns:
                raise InputError("value", f"aggs names column {c!r}, which is not in the DataFrame "
                                 f"(columns {list(df.columns)})")
        value_labels = list(aggs)
        multi = any(not isinstance(a, str) for a in aggs.values())
        core_aggs = {str(c): a for c, a in aggs.items()}
    else:
        value_labels = [c for c in df.columns if c not in by_list]
        multi = not isinstance(aggs, str)
        core_aggs = aggs
    return by_list, value_labels, core_aggs, multi


def _to_frame(res: GroupByResult, by: list, values: list, multi: bool) -> Any:
    import pandas as pd

    key_cols = list(res.keys.values())
    if len(by) == 1:
        index = pd.Index(key_cols[0], name=by[0])
    else:
        index = pd.MultiIndex.from_arrays(key_cols, names=by)
    label = {str(v): v for v in values}
    names = [(label[v], a) if multi else label[v] for v, a in res.columns]
    columns = pd.MultiIndex.from_tuples(names) if multi else pd.Index(names)
    data = dict(zip(range(len(names)), res.columns.values()))
    out = pd.DataFrame(data, index=index)
    out.columns = columns
    return out


def aggregate_frame(df: Any, by: Any, aggs: Any, *, merge: str = "root", root: int = 0,
                    group: ProcessGroup | None = None, sort_by: Any = None, ascending: bool = True,
                    limit: int | None = None) -> Any:
    """``df.groupby(by).agg(aggs)`` over the rows of every rank's ``df`` (see ``aggregate``).

    Every rank passes its own DataFrame with the same columns and dtypes (a rank may have
    no rows). ``by`` is a column label or a list of them; ``aggs`` is an aggregation name
    or a list of them (applied to every other column), or a dict column -> name(s), as
    pandas takes them.

    Returns
    -------
    pandas.DataFrame or None
        With ``merge="root"``, on ``root``: the DataFrame that
        ``pandas.concat(<every rank's df>).groupby(by).agg(aggs)`` returns (same index,
        columns and values up to float rounding; ``None`` on the other ranks). With
        ``"shuffle"``: on each rank the rows of the keys it owns; their union is that
        DataFrame and no key is on two ranks. ``"gather"``/``"none"``: the unmerged local
        results, as in ``aggregate``. ``sort_by`` takes key labels or ``(column, agg)``.

    Becomes one ``MPI_Allgather`` of the schema, then ``MPI_Gatherv`` or ``MPI_Alltoallv``
    of partial states (with ``merge="none"`` only the schema).
    """
    call: Call
    by_list: list = []
    value_labels: list = []
    multi = True
    try:
        by_list, value_labels, core_aggs, multi = _split(df, by, aggs)
        import pandas as pd

        keep = None
        for b in by_list:
            missing = pd.isna(df[b]).to_numpy()
            if missing.any():
                keep = ~missing if keep is None else keep & ~missing
        frame = df if keep is None else df[keep]
        keys = {str(b): _key_array(frame[b], b) for b in by_list}
        values = {str(c): _value_array(frame[c], c) for c in value_labels}
        call = parse(keys, values, core_aggs)
    except InputError as exc:
        call = Call(error=exc)
    if isinstance(sort_by, tuple) and sort_by and not multi:
        sort_by = (str(sort_by[0]), sort_by[1])
    res = api.run("aggregate_frame", call, merge, root, group, sort_by, ascending, limit)
    if res is None:
        return None
    return _to_frame(res, by_list, value_labels, multi)

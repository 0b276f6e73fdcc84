"""``aggregate`` and ``partition_by_key``: the merge modes, composed from the other modules.

Every mode starts alike: check the arguments on every rank together (schema), drop rows
with a NaN key, number the local groups, build per-group partial states. Then:

``root``     ``MPI_Gatherv`` the partial states to ``root``, which merges them.
``shuffle``  ``MPI_Alltoallv`` each partial-state row to the rank its key hashes to,
             which merges it; every key ends on exactly one rank.
``gather``   finish the local result, ``MPI_Gatherv`` it to ``root`` and concatenate
             (optionally sorted and limited there), without merging.
``none``     finish the local result; only the schema agreement communicates.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from ..core.groups import ProcessGroup, resolve
from . import exchange, hashing, schema, states
from .columns import MERGES, Call, InputError, parse, valid_key_rows
from .factorize import group_ids
from .result import GroupByResult, Name

_EXTRA_NAMES = ("merge", "root", "sort_by", "ascending", "limit")


def _check_options(call: Call, pg: ProcessGroup, merge: Any, root: Any, sort_by: Any, limit: Any) -> None:
    """Checks of the scalar arguments; a failure joins ``call.error`` (raised on every rank)."""
    if call.error is not None:
        return
    try:
        if merge not in MERGES:
            raise InputError("value", f"merge must be one of {', '.join(map(repr, MERGES))}, got {merge!r}")
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)):
            raise InputError("type", f"root must be an int group rank, got {root!r}")
        if not 0 <= root < pg.size():
            raise InputError("value", f"root={root} is out of range for a group of size {pg.size()}")
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 0:
                raise InputError("value", f"limit must be None or an int >= 0, got {limit!r}")
        known = [*call.key_names, *((v, a) for v, aggs in call.aggs.items() for a in aggs)]
        for name in _sort_names(sort_by):
            if name not in known:
                raise InputError("value", f"sort_by names {name!r}, which is not a result column; "
                                 f"columns: {known}")
    except InputError as exc:
        call.error = exc


def _sort_names(sort_by: Any) -> list[Name]:
    if sort_by is None:
        return []
    if isinstance(sort_by, (str, tuple)):
        return [sort_by]
    return list(sort_by)


class _Layout:
    """Where each value column's states sit in a flat table of columns after the keys."""

    def __init__(self, call: Call, value_dtypes: dict[str, np.dtype]) -> None:
        self.nkeys = len(call.key_names)
        self.key_names = call.key_names
        self.aggs = call.aggs
        self.dtypes = value_dtypes
        self.states = {v: states.needed(aggs) for v, aggs in call.aggs.items()}

    def flatten(self, keys: list[np.ndarray], st: dict[str, dict[str, np.ndarray]]) -> list[np.ndarray]:
        return [*keys, *(st[v][s].astype(states.state_dtype(s, self.dtypes[v]), copy=False)
                         for v, names in self.states.items() for s in names)]

    def merge(self, table: list[np.ndarray]) -> tuple[list[np.ndarray], dict[str, dict[str, np.ndarray]]]:
        """Merge a table of partial states (rows in rank order) into one row per key."""
        gid, keys = group_ids(table[:self.nkeys])
        ngroups = len(keys[0])
        out, i = {}, self.nkeys
        for v, names in self.states.items():
            parts = dict(zip(names, table[i:i + len(names)]))
            i += len(names)
            out[v] = states.merge(gid, ngroups, parts, names, self.dtypes[v])
        return keys, out

    def finish(self, keys: list[np.ndarray], st: dict[str, dict[str, np.ndarray]]) -> GroupByResult:
        columns = {}
        for v, aggs in self.aggs.items():
            for a, col in states.finish(st[v], aggs, self.dtypes[v]).items():
                columns[(v, a)] = col
        return GroupByResult(dict(zip(self.key_names, keys)), columns)


def _local_states(call: Call, layout: _Layout) -> tuple[list[np.ndarray], dict[str, dict[str, np.ndarray]]]:
    keys, values = call.keys, dict(zip(call.value_names, call.values))
    ok = valid_key_rows(keys)
    if ok is not None:
        keys = [k[ok] for k in keys]
        values = {v: c[ok] for v, c in values.items()}
    gid, ukeys = group_ids(keys)
    ngroups = len(ukeys[0])
    return ukeys, {v: states.from_rows(gid, ngroups, values[v], names) for v, names in layout.states.items()}


def _order(result: GroupByResult, sort_by: Any, ascending: bool, limit: int | None) -> GroupByResult:
    names = _sort_names(sort_by)
    if names:
        result = result.sort(names, ascending)
    return result if limit is None else result.head(limit)


def run(name: str, call: Call, merge: str = "root", root: int = 0, group: Any = None, sort_by: Any = None,
        ascending: bool = True, limit: int | None = None) -> GroupByResult | None:
    """``aggregate`` on already parsed arguments (also the pandas front's entry point)."""
    pg = resolve(group, name)
    _check_options(call, pg, merge, root, sort_by, limit)
    # every mode agrees first, "none" too: a rank that skipped it while another passed a
    # different merge would leave that rank waiting for it
    extra = (merge, int(root) if call.error is None else root, _sort_names(sort_by), bool(ascending), limit)
    key_dtypes, value_dtypes = schema.agree(pg, call, extra, name, _EXTRA_NAMES)
    schema.conform(call, key_dtypes, value_dtypes)
    layout = _Layout(call, dict(zip(call.value_names, value_dtypes)))
    comm, size = pg.comm, pg.size()
    keys, st = _local_states(call, layout)
    if merge == "none":
        return _order(layout.finish(keys, st), sort_by, ascending, limit)

    if merge == "gather":
        mine = _order(layout.finish(keys, st), sort_by, ascending, limit)  # top-N per rank is enough
        cols = exchange.gatherv(comm, [*mine.keys.values(), *mine.columns.values()], root)
        if cols is None:
            return None
        nk = len(mine.keys)
        whole = GroupByResult(dict(zip(mine.keys, cols[:nk])), dict(zip(mine.columns, cols[nk:])))
        return _order(whole, sort_by, ascending, limit)

    if size > 1:
        table = layout.flatten(keys, st)
        if merge == "root":
            table = exchange.gatherv(comm, table, root)
            if table is None:
                return None
        else:
            table = exchange.alltoallv(comm, table, hashing.owners(keys, size))
        keys, st = layout.merge(table)
    return _order(layout.finish(keys, st), sort_by, ascending, limit)


def aggregate(keys: Any, values: Any, aggs: Any = ("sum",), *, merge: str = "root", root: int = 0,
              group: ProcessGroup | None = None, sort_by: Name | Iterable[Name] | None = None,
              ascending: bool = True, limit: int | None = None) -> GroupByResult | None:
    """Group rows by key across the ranks of ``group`` and aggregate the values.

    Every rank of ``group`` calls it with its own rows (the row counts may differ, zero
    included) and the same ``aggs``, ``merge``, ``root``, ``sort_by``, ``ascending`` and
    ``limit``. Rows whose key is NaN are dropped and NaN values are skipped, as pandas does.

    Parameters
    ----------
    keys : array, tuple/list of arrays, or dict name -> array
        The grouping key: 1-D columns of int, uint, bool, float, str (``U``) or bytes
        (``S``) dtype; several columns make a composite key. Names default to ``"key"``
        for one array and ``"key0"``, ``"key1"``, ... for a tuple.
    values : array, tuple/list of arrays, or dict name -> array
        Numeric (int, uint, bool, float) columns, as long as the keys. Names default to
        ``"value"`` / ``"value0"``, ...
    aggs : str, list of str, or dict value name -> str or list of str
        Any of ``sum``, ``count``, ``mean``, ``min``, ``max``, ``var``, ``std`` (ddof=1),
        ``first``, ``last``; a list applies to every value column, a dict names the
        value columns to aggregate, in its order.
    merge : {"root", "shuffle", "gather", "none"}
        ``"root"``: partial states go to ``root`` (``MPI_Gatherv``), which merges them
        into the exact global result; other ranks get ``None``. ``"shuffle"``: partial
        states go to the rank their key hashes to (``MPI_Alltoallv``); every rank gets
        the final rows of the keys it owns, each key on exactly one rank, and no rank
        holds the whole result. ``"gather"``: each rank's local result goes to ``root``
        unmerged (``MPI_Gatherv``) and is concatenated in rank order, then sorted and
        limited by ``sort_by``/``limit`` there; a key may repeat. ``"none"``: each rank
        returns its own local result (only the schema check communicates); this is the global
        answer only when the rows are already partitioned by key (no key on two ranks),
        e.g. after :func:`partition_by_key`.
    root : int
        The group rank that receives the result in the ``"root"`` and ``"gather"`` modes.
    group : ProcessGroup, optional
        The ranks taking part (default: the world).
    sort_by, ascending, limit
        Optional ordering of the result wherever it is returned: column name(s) (key
        names or ``(value, agg)`` pairs, first most significant) and the number of rows
        to keep. With ``"gather"`` each rank also keeps only its own top ``limit`` rows
        before sending (ClickHouse's order-and-limit on the initiator).

    Returns
    -------
    GroupByResult or None
        Key columns (``result.keys``) and one column per ``(value, agg)``
        (``result.columns``), one row per group; ``"root"``/``"shuffle"`` results are
        sorted by key unless ``sort_by`` says otherwise. ``None`` on non-root ranks in
        the ``"root"`` and ``"gather"`` modes.

    Raises
    ------
    ValueError, TypeError
        On every rank of the group, naming the rank and the column, when any rank's
        input is bad (unknown agg, ragged columns, unsupported dtype) or the ranks
        disagree (column names, dtypes, aggs, merge, root). One small
        ``MPI_Allgather`` of a schema runs first in every mode, ``"none"`` included, so no
        rank is left waiting.

    Example
    -------
    >>> r = aggregate(store_id, {"amount": amount}, ["sum", "mean"])   # doctest: +SKIP
    >>> if r is not None:                                             # doctest: +SKIP
    ...     print(r["key"], r[("amount", "sum")])
    """
    return run("aggregate", parse(keys, values, aggs), merge, root, group, sort_by, ascending, limit)


def _rebuild(form: str, names: tuple[str, ...], cols: list[np.ndarray]) -> Any:
    if form == "array":
        return cols[0]
    if form == "dict":
        return dict(zip(names, cols))
    return tuple(cols) if form == "tuple" else list(cols)


def partition_by_key(keys: Any, values: Any, *, group: ProcessGroup | None = None) -> tuple[Any, Any]:
    """Move every row to the rank that owns its key (``MPI_Alltoallv``); returns ``(keys, values)``.

    Afterwards no key is on two ranks, so ``aggregate(..., merge="none")`` is the global
    answer, with no further communication (and repeated group-bys of the same rows
    stay local). The owner of a key is the one ``merge="shuffle"`` uses: a deterministic
    hash of the key's value modulo the group size. ``keys`` and ``values`` take the forms
    ``aggregate`` accepts and come back in the same form; rows keep their relative order
    within each source rank and arrive in source-rank order. Every rank calls it.
    """
    name = "partition_by_key"
    pg = resolve(group, name)
    call = parse(keys, values, "count")
    key_dtypes, value_dtypes = schema.agree(pg, call, ("partition",), name, ("mode",))
    schema.conform(call, key_dtypes, value_dtypes)
    dest = hashing.owners(call.keys, pg.size())
    cols = exchange.alltoallv(pg.comm, [*call.keys, *call.values], dest)
    nk = len(call.keys)
    return (_rebuild(call.key_form, call.key_names, cols[:nk]),
            _rebuild(call.value_form, call.value_names, cols[nk:]))

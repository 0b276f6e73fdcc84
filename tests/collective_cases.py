"""Every collective, run on one group and checked against numpy; shared by the world and subgroup tests.

``run_all(dist, pg, members, async_op)`` is called by every member of ``pg`` (``None``
= the world; ``members`` = the global ranks in group-rank order). Each case builds its
inputs from values any rank can recompute, runs one call, and records a message for
every mismatch; the caller asserts the list is empty after all ranks are done, so a
wrong result on one rank never leaves its peers waiting in a later collective.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from helpers import rank_data


def _finish(dist, w: Any, async_op: bool, what: str, bad: list[str]) -> None:
    """Complete ``w`` the torch way and check it is what the call should have returned."""
    if async_op:
        if not isinstance(w, dist.Work):
            bad.append(f"{what}: async_op=True returned {w!r}, not a Work")
            return
        if w.wait() is not True:
            bad.append(f"{what}: Work.wait() did not return True")
        if not w.is_completed() or w.exception() is not None:
            bad.append(f"{what}: Work not completed cleanly after wait()")
    elif w is not None:
        bad.append(f"{what}: blocking call returned {w!r}, expected None")


def _close(got: np.ndarray, want: np.ndarray, what: str, bad: list[str], rtol: float = 1e-12) -> None:
    if got.shape != want.shape or not np.allclose(got, want, rtol=rtol, atol=0):
        bad.append(f"{what}: got {got!r}, expected {want!r}")


def _pair(i: int, j: int, n: int) -> np.ndarray:
    """What group rank ``i`` sends group rank ``j`` in the uneven all_to_all: 0..2 elements."""
    length = (2 * i + j) % 3
    return np.arange(length, dtype=np.float64) + 1000 * i + 10 * j


def _root_arg(members: list[int], k: int, name: str) -> dict[str, int]:
    """Name the root by global rank for even ``k`` and by group rank for odd ``k``."""
    return {name: members[k]} if k % 2 == 0 else {f"group_{name}": k}


def run_all(dist, pg: Any, members: list[int], async_op: bool) -> list[str]:
    me = dist.get_rank()
    n = len(members)
    gi = members.index(me)
    bad: list[str] = []
    kw = {"group": pg, "async_op": async_op}

    def done(w: Any, what: str) -> None:
        _finish(dist, w, async_op, what, bad)

    def data(r: int, shape: Any = (2, 3), dtype: Any = np.float64, seed: int = 1) -> np.ndarray:
        return rank_data(r, shape, dtype, seed)

    # all_reduce: SUM and AVG
    for op, fold in ((dist.ReduceOp.SUM, lambda s: s), (dist.ReduceOp.AVG, lambda s: s / n)):
        t = data(me)
        done(dist.all_reduce(t, op=op, **kw), f"all_reduce {op}")
        _close(t, fold(sum(data(m) for m in members)), f"all_reduce {op}", bad)

    # broadcast from every root, by global and by group rank
    for k in range(n):
        t = data(me, seed=2)
        done(dist.broadcast(t, **_root_arg(members, k, "src"), **kw), f"broadcast root {k}")
        _close(t, data(members[k], seed=2), f"broadcast root {k}", bad)

    # reduce onto every root; the others keep their input
    for k in range(n):
        t = data(me, dtype=np.int64, seed=3)
        done(dist.reduce(t, **_root_arg(members, k, "dst"), op=dist.ReduceOp.MAX, **kw), f"reduce {k}")
        want = np.max([data(m, dtype=np.int64, seed=3) for m in members], axis=0) if gi == k \
            else data(me, dtype=np.int64, seed=3)
        _close(t, want, f"reduce root {k}", bad)

    # all_gather: separate arrays, then chunks of one buffer, then uneven sizes
    outs = [np.zeros((2, 3)) for _ in range(n)]
    done(dist.all_gather(outs, data(me, seed=4), **kw), "all_gather")
    for j in range(n):
        _close(outs[j], data(members[j], seed=4), f"all_gather[{j}]", bad)
    whole = np.zeros((n, 4), np.float32)
    chunks = list(whole)
    done(dist.all_gather(chunks, data(me, (4,), np.float32, 5), **kw), "all_gather chunks")
    _close(whole, np.stack([data(m, (4,), np.float32, 5) for m in members]), "all_gather chunks", bad)
    outs = [np.zeros(j + 1) for j in range(n)]
    done(dist.all_gather(outs, data(me, (gi + 1,), seed=6), **kw), "all_gather uneven")
    for j in range(n):
        _close(outs[j], data(members[j], (j + 1,), seed=6), f"all_gather uneven[{j}]", bad)

    # all_gather_into_tensor: concatenated, stacked, and in place from this rank's slice
    everyone = np.concatenate([data(m, (2, 3), seed=7) for m in members])
    out = np.zeros((2 * n, 3))
    done(dist.all_gather_into_tensor(out, data(me, (2, 3), seed=7), **kw), "all_gather_into_tensor")
    _close(out, everyone, "all_gather_into_tensor concat", bad)
    out = np.zeros((n, 2, 3))
    done(dist.all_gather_into_tensor(out, data(me, (2, 3), seed=7), **kw), "all_gather_into_tensor")
    _close(out, everyone.reshape(n, 2, 3), "all_gather_into_tensor stacked", bad)
    out = np.zeros((n, 2, 3))
    out[gi] = data(me, (2, 3), seed=7)
    done(dist.all_gather_into_tensor(out, out[gi], **kw), "all_gather_into_tensor in place")
    _close(out, everyone.reshape(n, 2, 3), "all_gather_into_tensor in place", bad)

    # gather onto every root
    for k in range(n):
        lst = [np.zeros(3, np.int32) for _ in range(n)] if gi == k else None
        done(dist.gather(data(me, (3,), np.int32, 8), lst, **_root_arg(members, k, "dst"), **kw),
             f"gather {k}")
        if gi == k:
            for j in range(n):
                _close(lst[j], data(members[j], (3,), np.int32, 8), f"gather root {k} [{j}]", bad)

    # scatter from every root
    for k in range(n):
        lst = [data(members[j], (3,), seed=9 + k) for j in range(n)] if gi == k else None
        t = np.zeros(3)
        done(dist.scatter(t, lst, **_root_arg(members, k, "src"), **kw), f"scatter {k}")
        _close(t, data(me, (3,), seed=9 + k), f"scatter root {k}", bad)

    # reduce_scatter (list) and reduce_scatter_tensor: block j of every input, summed, to rank j
    def block(r: int, j: int) -> np.ndarray:
        return data(r, (2,), seed=20 + j)

    out = np.zeros(2)
    done(dist.reduce_scatter(out, [block(me, j) for j in range(n)], **kw), "reduce_scatter")
    _close(out, sum(block(m, gi) for m in members), "reduce_scatter", bad)
    out = np.zeros(2)
    done(dist.reduce_scatter_tensor(out, np.concatenate([block(me, j) for j in range(n)]),
                                    op=dist.ReduceOp.AVG, **kw), "reduce_scatter_tensor")
    _close(out, sum(block(m, gi) for m in members) / n, "reduce_scatter_tensor AVG", bad)

    # all_to_all with uneven (and empty) pieces
    outs = [np.full(_pair(j, gi, n).size, -1.0) for j in range(n)]
    done(dist.all_to_all(outs, [_pair(gi, j, n) for j in range(n)], **kw), "all_to_all")
    for j in range(n):
        _close(outs[j], _pair(j, gi, n), f"all_to_all[{j}]", bad)

    # all_to_all_single: equal splits, then uneven splits of 2-column rows
    inp = np.concatenate([np.full(2, 100 * gi + j, np.int16) for j in range(n)])
    out = np.zeros(2 * n, np.int16)
    done(dist.all_to_all_single(out, inp, **kw), "all_to_all_single")
    _close(out, np.concatenate([np.full(2, 100 * j + gi, np.int16) for j in range(n)]),
           "all_to_all_single equal", bad)
    rows: Callable[[int, int], np.ndarray] = lambda i, j: (  # noqa: E731
        np.arange(2 * ((i + 2 * j) % 3), dtype=np.float32).reshape(-1, 2) + 1000 * i + 10 * j)
    inp = np.concatenate([rows(gi, j) for j in range(n)])
    want = np.concatenate([rows(j, gi) for j in range(n)])
    out = np.full_like(want, -1)
    done(dist.all_to_all_single(out, inp, [rows(j, gi).shape[0] for j in range(n)],
                                [rows(gi, j).shape[0] for j in range(n)], **kw), "all_to_all_single v")
    _close(out, want, "all_to_all_single uneven", bad)

    done(dist.barrier(**kw), "barrier")
    return bad

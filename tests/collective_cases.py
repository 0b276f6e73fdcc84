"""One case per collective, checked against numpy; shared by the world and subgroup tests.

:data:`CASES` maps a call's name to its case, in the order :func:`run_all` runs them. A case
is run by every member of a group (``pg``: ``None`` = the world; ``members``: the global ranks
in group-rank order): it builds its inputs from values any rank can recompute, makes the call
(every root in turn where the call has one), and records a message for every mismatch. The
caller asserts the list is empty after all ranks are done, so a wrong result on one rank never
leaves its peers waiting in a later collective.
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


class On:
    """One group a case runs on: who is in it, how calls complete, and the mismatches seen."""

    def __init__(self, dist, pg: Any, members: list[int], async_op: bool) -> None:
        self.dist = dist
        self.members = members
        self.n = len(members)
        self.me = dist.get_rank()
        self.gi = members.index(self.me)
        self.async_op = async_op
        self.kw = {"group": pg, "async_op": async_op}
        self.bad: list[str] = []

    def done(self, w: Any, what: str) -> None:
        _finish(self.dist, w, self.async_op, what, self.bad)

    def close(self, got: np.ndarray, want: np.ndarray, what: str) -> None:
        _close(got, want, what, self.bad)

    @staticmethod
    def data(r: int, shape: Any = (2, 3), dtype: Any = np.float64, seed: int = 1) -> np.ndarray:
        return rank_data(r, shape, dtype, seed)


CASES: dict[str, Callable[[On], None]] = {}


def case(fn: Callable[[On], None]) -> Callable[[On], None]:
    CASES[fn.__name__] = fn
    return fn


@case
def all_reduce(c: On) -> None:
    """SUM and AVG."""
    for op, fold in ((c.dist.ReduceOp.SUM, lambda s: s), (c.dist.ReduceOp.AVG, lambda s: s / c.n)):
        t = c.data(c.me)
        c.done(c.dist.all_reduce(t, op=op, **c.kw), f"all_reduce {op}")
        c.close(t, fold(sum(c.data(m) for m in c.members)), f"all_reduce {op}")


@case
def broadcast(c: On) -> None:
    """From every root, by global and by group rank."""
    for k in range(c.n):
        t = c.data(c.me, seed=2)
        c.done(c.dist.broadcast(t, **_root_arg(c.members, k, "src"), **c.kw), f"broadcast root {k}")
        c.close(t, c.data(c.members[k], seed=2), f"broadcast root {k}")


@case
def reduce(c: On) -> None:
    """Onto every root; the others keep their input."""
    for k in range(c.n):
        t = c.data(c.me, dtype=np.int64, seed=3)
        c.done(c.dist.reduce(t, **_root_arg(c.members, k, "dst"), op=c.dist.ReduceOp.MAX, **c.kw),
               f"reduce {k}")
        want = np.max([c.data(m, dtype=np.int64, seed=3) for m in c.members], axis=0) if c.gi == k \
            else c.data(c.me, dtype=np.int64, seed=3)
        c.close(t, want, f"reduce root {k}")


@case
def all_gather(c: On) -> None:
    """Separate arrays, then chunks of one buffer, then uneven sizes."""
    n, me, members = c.n, c.me, c.members
    outs = [np.zeros((2, 3)) for _ in range(n)]
    c.done(c.dist.all_gather(outs, c.data(me, seed=4), **c.kw), "all_gather")
    for j in range(n):
        c.close(outs[j], c.data(members[j], seed=4), f"all_gather[{j}]")
    whole = np.zeros((n, 4), np.float32)
    chunks = list(whole)
    c.done(c.dist.all_gather(chunks, c.data(me, (4,), np.float32, 5), **c.kw), "all_gather chunks")
    c.close(whole, np.stack([c.data(m, (4,), np.float32, 5) for m in members]), "all_gather chunks")
    outs = [np.zeros(j + 1) for j in range(n)]
    c.done(c.dist.all_gather(outs, c.data(me, (c.gi + 1,), seed=6), **c.kw), "all_gather uneven")
    for j in range(n):
        c.close(outs[j], c.data(members[j], (j + 1,), seed=6), f"all_gather uneven[{j}]")


@case
def all_gather_into_tensor(c: On) -> None:
    """Concatenated, stacked, and in place from this rank's slice."""
    n, me, gi = c.n, c.me, c.gi
    everyone = np.concatenate([c.data(m, (2, 3), seed=7) for m in c.members])
    out = np.zeros((2 * n, 3))
    c.done(c.dist.all_gather_into_tensor(out, c.data(me, (2, 3), seed=7), **c.kw), "all_gather_into_tensor")
    c.close(out, everyone, "all_gather_into_tensor concat")
    out = np.zeros((n, 2, 3))
    c.done(c.dist.all_gather_into_tensor(out, c.data(me, (2, 3), seed=7), **c.kw), "all_gather_into_tensor")
    c.close(out, everyone.reshape(n, 2, 3), "all_gather_into_tensor stacked")
    out = np.zeros((n, 2, 3))
    out[gi] = c.data(me, (2, 3), seed=7)
    c.done(c.dist.all_gather_into_tensor(out, out[gi], **c.kw), "all_gather_into_tensor in place")
    c.close(out, everyone.reshape(n, 2, 3), "all_gather_into_tensor in place")


@case
def gather(c: On) -> None:
    """Onto every root."""
    n, gi = c.n, c.gi
    for k in range(n):
        lst = [np.zeros(3, np.int32) for _ in range(n)] if gi == k else None
        c.done(c.dist.gather(c.data(c.me, (3,), np.int32, 8), lst, **_root_arg(c.members, k, "dst"), **c.kw),
               f"gather {k}")
        if gi == k:
            for j in range(n):
                c.close(lst[j], c.data(c.members[j], (3,), np.int32, 8), f"gather root {k} [{j}]")


@case
def scatter(c: On) -> None:
    """From every root."""
    n, gi = c.n, c.gi
    for k in range(n):
        lst = [c.data(c.members[j], (3,), seed=9 + k) for j in range(n)] if gi == k else None
        t = np.zeros(3)
        c.done(c.dist.scatter(t, lst, **_root_arg(c.members, k, "src"), **c.kw), f"scatter {k}")
        c.close(t, c.data(c.me, (3,), seed=9 + k), f"scatter root {k}")


def _block(c: On, r: int, j: int) -> np.ndarray:
    """Block ``j`` of rank ``r``'s reduce_scatter input: summed over ranks, it goes to group rank ``j``."""
    return c.data(r, (2,), seed=20 + j)


@case
def reduce_scatter(c: On) -> None:
    """A list of blocks, summed."""
    out = np.zeros(2)
    c.done(c.dist.reduce_scatter(out, [_block(c, c.me, j) for j in range(c.n)], **c.kw), "reduce_scatter")
    c.close(out, sum(_block(c, m, c.gi) for m in c.members), "reduce_scatter")


@case
def reduce_scatter_tensor(c: On) -> None:
    """One concatenated input, averaged."""
    out = np.zeros(2)
    c.done(c.dist.reduce_scatter_tensor(out, np.concatenate([_block(c, c.me, j) for j in range(c.n)]),
                                        op=c.dist.ReduceOp.AVG, **c.kw), "reduce_scatter_tensor")
    c.close(out, sum(_block(c, m, c.gi) for m in c.members) / c.n, "reduce_scatter_tensor AVG")


@case
def all_to_all(c: On) -> None:
    """Uneven (and empty) pieces."""
    n, gi = c.n, c.gi
    outs = [np.full(_pair(j, gi, n).size, -1.0) for j in range(n)]
    c.done(c.dist.all_to_all(outs, [_pair(gi, j, n) for j in range(n)], **c.kw), "all_to_all")
    for j in range(n):
        c.close(outs[j], _pair(j, gi, n), f"all_to_all[{j}]")


@case
def all_to_all_single(c: On) -> None:
    """Equal splits, then uneven splits of 2-column rows."""
    n, gi = c.n, c.gi
    inp = np.concatenate([np.full(2, 100 * gi + j, np.int16) for j in range(n)])
    out = np.zeros(2 * n, np.int16)
    c.done(c.dist.all_to_all_single(out, inp, **c.kw), "all_to_all_single")
    c.close(out, np.concatenate([np.full(2, 100 * j + gi, np.int16) for j in range(n)]),
            "all_to_all_single equal")

    def rows(i: int, j: int) -> np.ndarray:
        return np.arange(2 * ((i + 2 * j) % 3), dtype=np.float32).reshape(-1, 2) + 1000 * i + 10 * j

    inp = np.concatenate([rows(gi, j) for j in range(n)])
    want = np.concatenate([rows(j, gi) for j in range(n)])
    out = np.full_like(want, -1)
    c.done(c.dist.all_to_all_single(out, inp, [rows(j, gi).shape[0] for j in range(n)],
                                    [rows(gi, j).shape[0] for j in range(n)], **c.kw), "all_to_all_single v")
    c.close(out, want, "all_to_all_single uneven")


@case
def barrier(c: On) -> None:
    c.done(c.dist.barrier(**c.kw), "barrier")


#: The calls, for ``pytest.mark.parametrize``: ``-k broadcast`` selects one.
CALLS = list(CASES)


def run(dist, call: str, pg: Any, members: list[int], async_op: bool) -> list[str]:
    """Run the case of ``call`` on ``pg``; return this rank's mismatches."""
    on = On(dist, pg, members, async_op)
    CASES[call](on)
    return on.bad


def run_all(dist, pg: Any, members: list[int], async_op: bool) -> list[str]:
    """Every case back to back on one group, in :data:`CASES` order; return this rank's mismatches."""
    on = On(dist, pg, members, async_op)
    for fn in CASES.values():
        fn(on)
    return on.bad

"""One job at the rank counts real nodes run (48 to 128 ranks on one host), started by
``test_node_sizes_jobs.py``: ``mpiexec -n N python tests/stress/node_job.py {calls|sums}``.

``calls``: the everyday calls on small arrays, each checked against numpy (every rank's input is a
function of its rank, so any rank computes what every other rank passed), then a group timeout
whose report must name the ranks as ranges. ``sums``: the same 5 MiB sum of ones, several times.

Each rank prints ``OK <rank> <what>`` when every check passed; the first failing check raises,
and the uncaught exception ends the job (``MPI_Abort``), naming the rank and the check.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta

import numpy as np

import mpidist as dist

#: The group timeout of the timeout report; the other ranks must have raised well before the
#: job's own timeout, which is what bounds the time here (no timed assertion).
LIMIT = 2.0
#: Element count of the 5 MiB float64 sum (the size whose sums were taken for different paths).
BIG = 655360
ROUNDS = 5


def data(rank: int, dtype, n: int = 7) -> np.ndarray:
    """Rank ``rank``'s input: small exact values (sums of 128 ranks stay exact in float64)."""
    return ((np.arange(n) * 3 + rank * 5) % 17 + 1).astype(dtype)


def check(ok: bool, what: str, got=None, want=None) -> None:
    if not ok:
        raise AssertionError(f"rank {dist.get_rank()}: {what}: got {got!r}, want {want!r}")


def equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    check(got.dtype == want.dtype and np.array_equal(got, want), what, got, want)


def divisor(n: int, most: int = 16) -> int:
    """The largest divisor of ``n`` in 2..``most`` (``new_subgroups`` needs one); ``n`` if none."""
    return next((d for d in range(most, 1, -1) if n % d == 0), n)


def calls(rank: int, n: int) -> None:
    everyone = np.stack([data(r, np.float64) for r in range(n)])
    ints = np.stack([data(r, np.int64) for r in range(n)])

    x = data(rank, np.float64)
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    equal(x, everyone.sum(axis=0), "all_reduce SUM float64")
    i = data(rank, np.int64)
    dist.all_reduce(i, op=dist.ReduceOp.SUM)
    equal(i, ints.sum(axis=0), "all_reduce SUM int64")
    i = data(rank, np.int64)
    dist.all_reduce(i, op=dist.ReduceOp.MAX)
    equal(i, ints.max(axis=0), "all_reduce MAX int64")
    x = data(rank, np.float64)
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    # AVG is a sum then a division; the sum is exact, so this is the same float as numpy's
    equal(x, everyone.sum(axis=0) / n, "all_reduce AVG float64")

    # broadcast from the last rank: a root that is neither 0 nor in the first "node" of anything
    root = n - 1
    b = data(rank, np.float64, 9)
    dist.broadcast(b, src=root)
    equal(b, data(root, np.float64, 9), f"broadcast from {root}")

    out = [np.zeros(3, np.int64) for _ in range(n)]
    dist.all_gather(out, data(rank, np.int64, 3))
    equal(np.stack(out), ints[:, :3], "all_gather")

    # 1 MiB: past the small-message paths
    m = np.full(1 << 17, float(rank + 1))
    dist.all_reduce(m)
    equal(m, np.full(1 << 17, n * (n + 1) / 2), "all_reduce 1 MiB")

    # new_subgroups(): one subgroup per node, here the whole world
    own, _ = dist.new_subgroups()
    y = data(rank, np.float64)
    dist.all_reduce(y, group=own)
    members = list(own.ranks)  # the global ranks of this rank's node: here all of them
    check(dist.get_world_size(own) == n, "new_subgroups() size on one node", dist.get_world_size(own), n)
    equal(y, everyone[members].sum(axis=0), "all_reduce on new_subgroups()")

    # new_subgroups(group_size=k): consecutive blocks of k ranks
    k = divisor(n)
    sub, allsubs = dist.new_subgroups(group_size=k)
    check(len(allsubs) == n // k, "number of subgroups", len(allsubs), n // k)
    block = list(range(rank - rank % k, rank - rank % k + k))
    check(dist.get_world_size(sub) == k and dist.get_rank(sub) == rank % k, "subgroup size/rank",
          (dist.get_world_size(sub), dist.get_rank(sub)), (k, rank % k))
    y = data(rank, np.float64)
    dist.all_reduce(y, group=sub)
    equal(y, everyone[block].sum(axis=0), f"all_reduce on subgroup of {k}")
    i = data(rank, np.int64)
    dist.all_reduce(i, op=dist.ReduceOp.MAX, group=sub)
    equal(i, ints[block].max(axis=0), f"all_reduce MAX on subgroup of {k}")

    # new_group of the odd ranks: called by every rank, a member only where odd
    odd = list(range(1, n, 2))
    og = dist.new_group(odd)
    if rank % 2:
        me = odd.index(rank)
        check(dist.get_rank(og) == me, "rank in the odd group", dist.get_rank(og), me)
        y = data(rank, np.float64)
        dist.all_reduce(y, group=og)
        equal(y, everyone[odd].sum(axis=0), "all_reduce on the odd ranks")
        g = np.zeros(2)
        if rank == odd[-1]:
            g[:] = [7.0, rank]
        dist.broadcast(g, src=odd[-1], group=og)
        equal(g, np.array([7.0, odd[-1]]), "broadcast on the odd ranks")
    dist.barrier()


def timeout_report(rank: int, n: int) -> None:
    """Every rank but the last calls all_reduce on a group with a 2 s timeout: each of them raises
    GroupTimeoutError naming the call, the group and the missing rank, with the group's ranks as
    a range: a report that named ranks one by one would grow with the job."""
    g = dist.new_group(timeout=timedelta(seconds=LIMIT))
    late = n - 1
    if rank != late:
        t0 = time.monotonic()
        try:
            dist.all_reduce(np.ones(4), group=g)
        except dist.GroupTimeoutError as exc:
            text = str(exc)
        else:
            raise AssertionError(f"rank {rank}: all_reduce returned without rank {late}")
        took = time.monotonic() - t0
        print(f"TIMEOUT {rank} raised after {took:.1f} s", flush=True)
        for want in (f"all_reduce: rank {rank}: ", f"all_reduce #1 on group {g.group_name!r}",
                     f"global ranks 0–{late}", "Timed out", f"not heard from rank {late} ("):
            check(want in text, "the timeout report", text, want)
        # ranges, not lists: no run of three ranks spelled out, and short at any size
        check(", ".join(map(str, range(3))) not in text and "1, 2, 3" not in text,
              "the timeout report names ranks one by one", text)
        check(len(text) < 1500, "the timeout report's length", len(text), "< 1500")
        if rank == 0:
            print(f"REPORT {text}", flush=True)
    # the world still works, and the late rank joins the others here
    dist.barrier()
    w = np.ones(1)
    dist.all_reduce(w)
    equal(w, np.array([float(n)]), "all_reduce after the timeout")


def sums(rank: int, n: int) -> None:
    for i in range(ROUNDS):
        x = np.full(BIG, 1.0)
        dist.all_reduce(x)
        # every element, not a sample: the bug gave a wrong result or an error, never a slow one
        check(bool(np.all(x == n)), f"5 MiB all_reduce round {i}", x[x != n][:4], float(n))


def main() -> None:
    what = sys.argv[1]
    dist.init_process_group(backend="mpi")
    rank, n = dist.get_rank(), dist.get_world_size()
    if what == "calls":
        calls(rank, n)
        timeout_report(rank, n)
    elif what == "sums":
        sums(rank, n)
    else:
        raise SystemExit(f"node_job.py: unknown case {what!r}")
    dist.barrier()
    print(f"OK {rank} {what}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

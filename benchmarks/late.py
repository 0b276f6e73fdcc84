"""How soon a waiting rank learns that the last rank has arrived, and what its wait costs.

In training the ranks reach each all_reduce at different times (one was still in backward, or
waited for its data loader). Every round here, one rank (a different one each round) arrives
late by a random 0.2-2 ms, and every other rank is already waiting. Per way of waiting, the
table gives, over every waiting rank and round:

* ``wake``: the time from the last rank's arrival to the waiting rank's return (median and
  90th percentile; every rank runs on this node and reads the same ``CLOCK_MONOTONIC``);
* ``cpu``: the CPU time the waiting rank spent per wait, as a share of the wait's length
  (1.0: it kept a core busy throughout; a sleeping wait is near 0).

The ways: ``MPI_Allreduce`` (MPI's own blocking wait), mpidist's ``all_reduce``, and with
``torch`` installed, the ``"mpidist"`` torch backend's blocking call, its overlapped call
(``async_op=True`` on a group whose asynchronous calls all overlap, completed by the progress
thread) and gloo's::

    mpiexec -n 4 python benchmarks/late.py
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

import mpidist as dist


def ways(comm: MPI.Intracomm) -> dict[str, Callable[[], Any]]:
    """Each way to wait, as a function that starts and completes one 8 B all_reduce."""
    x = np.ones(1)
    y = np.empty(1)
    out: dict[str, Callable[[], Any]] = {
        "MPI_Allreduce": lambda: comm.Allreduce(x, y),
        "mpidist all_reduce": lambda: dist.all_reduce(x),
    }
    try:
        import torch
        import torch.distributed as tdist

        import mpidist.torch  # noqa: F401
        from mpidist.torch import backend
    except ImportError:
        return out
    if not tdist.is_initialized():
        torch.set_num_threads(1)
        tdist.init_process_group("mpidist")
    t = torch.ones(2)
    limit = backend.SYNC_BYTES
    backend.SYNC_BYTES = 0  # read when a group is made: this one overlaps every asynchronous call
    overlapped = tdist.new_group(list(range(comm.Get_size())))
    backend.SYNC_BYTES = limit
    gloo = tdist.new_group(backend="gloo")
    for g in (None, overlapped, gloo):  # past the calls the default check blocks on
        for _ in range(12):
            tdist.all_reduce(t, group=g)
    out["torch mpidist"] = lambda: tdist.all_reduce(t)
    out["torch mpidist overlapped"] = lambda: tdist.all_reduce(t, group=overlapped, async_op=True).wait()
    out["torch gloo"] = lambda: tdist.all_reduce(t, group=gloo, async_op=True).wait()
    return out


def measure(comm: MPI.Intracomm, fn: Callable[[], Any], rounds: int, rng: random.Random
            ) -> tuple[list[float], list[float]]:
    """Per round where this rank waited: the wake time after the last arrival, and the CPU share."""
    rank, size = comm.Get_rank(), comm.Get_size()
    wakes, cpus = [], []
    for r in range(rounds):
        late = r % size
        delay = rng.uniform(2e-4, 2e-3)  # every rank draws it: the same generator, seeded alike
        comm.Barrier()
        if rank == late:
            time.sleep(delay)
        c0, t0 = time.process_time(), time.monotonic()
        fn()
        t1, c1 = time.monotonic(), time.process_time()
        arrived = comm.bcast(t0, root=late)
        if rank != late:
            wakes.append(t1 - arrived)
            cpus.append((c1 - c0) / max(t1 - t0, 1e-9))
    return wakes, cpus


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=200, help="waits per way (each rank late in turn)")
    ap.add_argument("--json", help="append the results here (rank 0), one line per run")
    args = ap.parse_args()
    dist.init_process_group("mpi")
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if size < 2:
        raise SystemExit("late.py needs at least 2 ranks")
    table = {}
    for name, fn in ways(comm).items():
        wakes, cpus = measure(comm, fn, args.rounds, random.Random(7))
        every = comm.gather((wakes, cpus), root=0)
        if rank == 0:
            w = sorted(v for ws, _ in every for v in ws)
            c = [v for _, cs in every for v in cs]
            table[name] = {"wake_median_us": statistics.median(w) * 1e6,
                           "wake_p90_us": w[int(0.9 * (len(w) - 1))] * 1e6,
                           "cpu_share": statistics.median(c)}
    if rank == 0:
        print(f"\nOne rank 0.2-2 ms late, 8 B all_reduce, {size} ranks, {args.rounds} rounds")
        print(f" {'way':<26} {'wake median':>12} {'wake p90':>10} {'cpu share':>10}")
        for name, row in table.items():
            print(f" {name:<26} {row['wake_median_us']:>9.0f} us {row['wake_p90_us']:>7.0f} us"
                  f" {row['cpu_share']:>10.2f}")
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({"ranks": size, "ways": table}) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

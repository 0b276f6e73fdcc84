"""Ways to wait for a nonblocking all_reduce, side by side in one job, against ``MPI_Allreduce``.

How mpidist's bounded wait was chosen (issue 23): each candidate completes the same 8 B
``Iallreduce``, rounds interleaved, and is given as its median time and as the median of its
per-round ratio to the blocking ``Allreduce`` of the same round::

    mpiexec -n 4 python benchmarks/waits.py                 # 8 B, 7 rounds
    mpiexec -n 16 python benchmarks/waits.py --rounds 5     # more ranks than cores
    mpiexec -n 2 python benchmarks/waits.py --busy 1        # a busy compute thread per rank

The candidates: ``Wait`` (MPI blocks), ``Waitany`` over the call and a posted notice receive
(the design that would let a watchdog wake a blocked wait), a ``Test`` loop that never yields,
``Test`` + ``sched_yield``, the loop mpidist 0.1 waited in (32 tests a step, the first 100 µs
without yielding), 4 and 16 tests back to back between yields (mpidist's wait: 4), a persistent
request (``MPI_Allreduce_init`` once, then ``MPI_Start``, with a copy in and out), and mpidist's
``all_reduce`` (``MPI_Iallreduce`` and the bounded wait). ``--busy N`` runs N threads of
matrix products per rank (numpy, which lets go of the GIL), as torch's threads do in training.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent))

from suite.timing import interleave, python_loop  # noqa: E402

import mpidist as dist  # noqa: E402

NOTICE_TAG = 77


def candidates(comm: MPI.Intracomm, nbytes: int
               ) -> tuple[dict[str, Callable[[], None]], Callable[[], None]]:
    """Each way to wait, as a function that runs one all_reduce of ``nbytes``; and the cleanup."""
    x = np.ones(max(1, nbytes // 8))
    y = np.empty_like(x)
    xd = np.ones_like(x)
    notice = np.zeros(4, np.int64)
    side = comm.Dup()
    posted = side.Irecv([notice, MPI.INT64_T], MPI.ANY_SOURCE, NOTICE_TAG)

    def waitany() -> None:
        MPI.Request.Waitany([comm.Iallreduce(x, y), posted])

    def test_spin() -> None:
        r = comm.Iallreduce(x, y)
        while not r.Test():
            pass

    def test_yield() -> None:
        r = comm.Iallreduce(x, y)
        while not r.Test():
            os.sched_yield()

    def spin_then_yield() -> None:  # mpidist 0.1's wait: 32 tests a step, 100 us without yielding
        r = [comm.Iallreduce(x, y)]
        busy_until = time.monotonic() + 100e-6
        while not any(MPI.Request.Testall(r) for _ in range(32)):
            if time.monotonic() >= busy_until:
                os.sched_yield()

    def tests_per_yield(k: int, start: Callable[[], MPI.Request]) -> Callable[[], None]:
        def run() -> None:  # k tests back to back, then sched_yield (mpidist's wait: k = 4)
            test = start().Test
            while True:
                for _ in range(k):
                    if test():
                        return
                os.sched_yield()
        return run

    pbuf = np.ones_like(x)
    persistent = comm.Allreduce_init(MPI.IN_PLACE, pbuf)

    def started() -> MPI.Request:  # the persistent request, with its copy in and out
        pbuf[...] = xd
        persistent.Start()
        return persistent

    def persistent_call() -> None:
        tests_per_yield(4, started)()
        xd[...] = pbuf

    def cleanup() -> None:
        posted.Cancel()
        posted.Wait()
        persistent.Free()
        side.Free()

    return {
        "Allreduce": lambda: comm.Allreduce(x, y),
        "Wait": lambda: comm.Iallreduce(x, y).Wait(),
        "Waitany+notice": waitany,
        "Test loop": test_spin,
        "Test+sched_yield": test_yield,
        "mpidist 0.1 loop": spin_then_yield,
        "4 Tests+sched_yield": tests_per_yield(4, lambda: comm.Iallreduce(x, y)),
        "16 Tests+sched_yield": tests_per_yield(16, lambda: comm.Iallreduce(x, y)),
        "persistent Start+4 Tests": persistent_call,
        "mpidist": lambda: dist.all_reduce(xd),
    }, cleanup


def busy(stop: threading.Event) -> None:
    a = np.random.default_rng(0).random((256, 256))
    while not stop.is_set():
        a @ a


def measure(fns: dict[str, Callable[[], None]], comm: MPI.Intracomm, rounds: int, target: float,
            skip: set[str]) -> dict[str, list[float]]:
    """Seconds per call (the slowest rank's), for each round: interleaved, the order rotating."""
    loops = {k: python_loop(fn, ()) for k, fn in fns.items() if k not in skip}
    return {k: v["samples"] for k, v in interleave(comm, loops, rounds, target).items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", type=int, default=8)
    ap.add_argument("--target", type=float, default=0.01, help="seconds per sample")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--busy", type=int, default=0, help="compute threads per rank")
    ap.add_argument("--skip", default="", help="candidates to leave out (comma-separated)")
    ap.add_argument("--json", help="append the results here (rank 0), one line per run")
    args = ap.parse_args()
    dist.init_process_group()
    comm = dist.group.WORLD.comm.Dup()
    stop = threading.Event()
    threads = [threading.Thread(target=busy, args=(stop,), daemon=True) for _ in range(args.busy)]
    for t in threads:
        t.start()
    fns, cleanup = candidates(comm, args.bytes)
    try:
        res = measure(fns, comm, args.rounds, args.target, set(filter(None, args.skip.split(","))))
    finally:
        stop.set()
    cleanup()
    if comm.rank == 0:
        base = np.array(res["Allreduce"])
        row = {"ranks": comm.size, "cores": os.cpu_count(), "busy": args.busy, "bytes": args.bytes,
               "load": os.getloadavg()[0],
               "us": {k: float(np.median(v)) * 1e6 for k, v in res.items()},
               "ratio": {k: float(np.median(np.array(v) / base)) for k, v in res.items()}}
        print(f"{comm.size} ranks on {os.cpu_count()} cores, {args.bytes} B, busy threads "
              f"{args.busy}, load {row['load']:.1f}: median us (median ratio to Allreduce)")
        print("  " + "  ".join(f"{k} {row['us'][k]:.1f} ({row['ratio'][k]:.2f}x)" for k in res))
        if args.json:
            with open(args.json, "a") as fh:
                fh.write(json.dumps(row) + "\n")
    for t in threads:
        t.join()
    comm.Free()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Large all_reduce within one node: the shared segment against MPI's own, in the same job.

    mpiexec -n 2 python benchmarks/node_reduce.py
    mpiexec -n 3 python benchmarks/node_reduce.py --sizes 1M,4M,16M --warm

Each round times, interleaved in an order that turns with each round, raw mpi4py
``Allreduce(IN_PLACE)``, mpidist's all_reduce through MPI (``nodereduce.ON`` off) and mpidist's
all_reduce through the group's shared segment (``mpidist/calls/nodereduce.py``), on float32
arrays. By default a 64 MiB array is written between calls, so each starts with cold caches, as
a DDP bucket's does after backward (``--warm``: not).
Prints the slowest rank's median per round, then each size's medians and the ratios segment ÷
raw as the min–max over the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent))
from suite.sizes import parse_size  # noqa: E402

import mpidist  # noqa: E402
from mpidist.calls import nodereduce  # noqa: E402

IMPLS = ("raw MPI_Allreduce", "mpidist via MPI", "mpidist segment")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1M,4M,16M,29M,64M", help="bytes per array (K/M suffixes)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    ap.add_argument("--reps", type=int, default=8, help="calls timed per implementation per round")
    ap.add_argument("--warm", action="store_true", help="no cache flush between calls")
    args = ap.parse_args()
    mpidist.init_process_group("mpi")
    world, rank = MPI.COMM_WORLD, MPI.COMM_WORLD.Get_rank()
    flush = None if args.warm else np.ones(16 << 20, np.float32)
    results: dict[tuple[int, str], list[float]] = {}
    for nbytes in (parse_size(s) for s in args.sizes.split(",")):
        x = np.ones(nbytes // 4, np.float32)
        for k in range(args.rounds):
            # each implementation leaves the memory and MPI's buffers in a state the next one
            # meets (docs/benchmarks.md): the order turns with each round
            for impl in IMPLS[k % 3:] + IMPLS[:k % 3]:
                nodereduce.ON = impl == "mpidist segment"
                times = []
                for _ in range(args.reps):
                    if flush is not None:
                        np.add(flush, 1, out=flush)
                    np.multiply(x, 0.5, out=x)  # written just before, as DDP's divide leaves a bucket
                    world.Barrier()
                    t0 = time.perf_counter()
                    if impl == "raw MPI_Allreduce":
                        world.Allreduce(MPI.IN_PLACE, x)
                    else:
                        mpidist.all_reduce(x)
                    times.append(time.perf_counter() - t0)
                slowest = world.allreduce(statistics.median(times), op=MPI.MAX)
                results.setdefault((nbytes, impl), []).append(slowest * 1e3)
    nodereduce.ON = True
    if rank == 0:
        size = world.Get_size()
        print(f"all_reduce within one node, {size} ranks, float32, "
              f"{'warm' if args.warm else 'cold'} caches (ms, slowest rank, median of {args.rounds} rounds)")
        print(f"{'bytes':>10} " + " ".join(f"{i:>18}" for i in IMPLS) + "   segment/raw (min-max)")
        for nbytes in sorted({k[0] for k in results}):
            med = [statistics.median(results[(nbytes, i)]) for i in IMPLS]
            ratios = [s / r for s, r in zip(results[(nbytes, IMPLS[2])], results[(nbytes, IMPLS[0])])]
            print(f"{nbytes:>10} " + " ".join(f"{m:>18.3f}" for m in med)
                  + f"   {min(ratios):.2f}-{max(ratios):.2f}")
    mpidist.destroy_process_group()


if __name__ == "__main__":
    main()

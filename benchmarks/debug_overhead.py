"""Cost of MPIDIST_DEBUG per call: OFF vs INFO vs DETAIL on small collectives.

DETAIL adds one ``MPI_Allreduce`` of two int64 (the fingerprint hash) and the hashing
itself before each collective; INFO adds the timing and a log record (the logger is
silenced here, so this measures mpidist's side, not the terminal)::

    mpiexec -n 2 python benchmarks/debug_overhead.py [--calls 2000] [--rounds 5]

Prints, per call and level, the median over rounds of the mean µs per call on rank 0,
and DETAIL's overhead over OFF.
"""

from __future__ import annotations

import argparse
import logging
import time

import numpy as np

import mpidist as dist
from mpidist import debug


def per_call_us(fn, calls: int, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    dist.init_process_group("mpi", abort_on_error=False)
    logging.getLogger("mpidist").disabled = True
    small, page, out = np.ones(2, np.float32), np.ones(1024, np.float32), np.empty(2, np.float32)
    cases = {
        "all_reduce 8 B": lambda: dist.all_reduce(small),
        "all_reduce 4 KiB": lambda: dist.all_reduce(page),
        "broadcast 8 B": lambda: dist.broadcast(small, src=0),
        "all_to_all_single 8 B": lambda: dist.all_to_all_single(
            np.empty(2 * dist.get_world_size(), np.float32), np.ones(2 * dist.get_world_size(), np.float32)),
        "barrier": lambda: dist.barrier(),
    }
    del out
    rows = []
    for name, fn in cases.items():
        res = {}
        for level in ("OFF", "INFO", "DETAIL"):
            debug.set_debug_level(level)
            fn()
            res[level] = per_call_us(fn, a.calls, a.rounds)
        debug.set_debug_level("OFF")
        rows.append((name, res))
    if dist.get_rank() == 0:
        print(f"debug overhead, {dist.get_world_size()} ranks, {a.calls} calls x {a.rounds} rounds "
              "(median of per-round means, us/call)")
        print(f"{'call':24s} {'OFF':>9s} {'INFO':>9s} {'DETAIL':>9s} {'DETAIL-OFF':>11s}")
        for name, r in rows:
            print(f"{name:24s} {r['OFF']:9.2f} {r['INFO']:9.2f} {r['DETAIL']:9.2f} "
                  f"{r['DETAIL'] - r['OFF']:11.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

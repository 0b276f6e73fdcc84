"""Interleaved timing: implementations take turns (A B C A B C …) within one job.

Each implementation is first warmed up and calibrated to run ``iters`` operations per
sample (about ``target`` seconds, agreed on by all ranks). Then, for every round, each
implementation runs one sample after a barrier, in an order that rotates every round so
that none is always first. A sample's time per operation is the slowest rank's. Medians
over rounds are reported, and ratios are medians of the per-round (paired) ratios,
which cancel the slow drifts of a shared machine.
"""

from __future__ import annotations

import statistics
from time import perf_counter
from typing import Any, Callable

Loop = Callable[[int], float]  # loop(iters) -> elapsed seconds on this rank


def python_loop(fn: Callable, args: tuple) -> Loop:
    """``fn(*args)`` ``iters`` times under ``perf_counter``: the same loop for every Python impl."""
    def loop(iters: int) -> float:
        t0 = perf_counter()
        for _ in range(iters):
            fn(*args)
        return perf_counter() - t0
    return loop


def slowest(ctl: Any, seconds: float) -> float:
    """The largest of every rank's ``seconds`` (``ctl`` is an mpi4py communicator)."""
    from mpi4py import MPI

    return ctl.allreduce(seconds, op=MPI.MAX)


def calibrate(ctl: Any, loop: Loop, target: float, max_iters: int) -> int:
    """Iterations per sample for about ``target`` seconds (the same on every rank)."""
    loop(1)  # first touch: page faults, lazily built plans and connections
    probe = 2
    per = slowest(ctl, loop(probe)) / probe
    if per * 20 < target:  # fast call: a longer probe for a steadier estimate
        probe = max(2, min(max_iters, int(target / 4 / max(per, 1e-9))))
        per = slowest(ctl, loop(probe)) / probe
    return max(1, min(max_iters, int(target / max(per, 1e-9))))


def interleave(ctl: Any, loops: dict[str, Loop], rounds: int, target: float,
               max_iters: int = 1_000_000, per_op: float = 1.0) -> dict[str, dict]:
    """Time every loop ``rounds`` times, interleaved; per implementation: samples and iters.

    ``per_op`` divides each operation's time (2 for a ping-pong: one-way latency).
    """
    names = list(loops)
    iters = {n: calibrate(ctl, loops[n], target, max_iters) for n in names}
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            ctl.Barrier()
            t = loops[n](iters[n])
            samples[n].append(slowest(ctl, t) / iters[n] / per_op)
    return {n: {"samples": samples[n], "iters": iters[n]} for n in names}


def summary(samples: list[float]) -> dict[str, float]:
    """Median, min and quartiles of a sample list (seconds per operation)."""
    s = sorted(samples)
    q = statistics.quantiles(s, n=4) if len(s) > 1 else [s[0]] * 3
    return {"median": statistics.median(s), "min": s[0], "q1": q[0], "q3": q[2]}


def paired_ratio(a: list[float], b: list[float]) -> float:
    """Median over rounds of ``a[i] / b[i]`` (the same round: adjacent in time)."""
    return statistics.median(x / y for x, y in zip(a, b) if y > 0)

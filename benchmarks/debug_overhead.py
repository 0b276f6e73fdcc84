"""Cost of the cross-rank checks per call: MPIDIST_DEBUG=OFF vs the default check vs INFO vs DETAIL.

The modes are measured in the same run, interleaved: each round times ``--calls`` calls of a
case in every mode, in an order that rotates from round to round, so that a loaded machine
slows every mode alike. ``default`` is the sampled check of ``mpidist.checks.signature`` (on
unless ``MPIDIST_DEBUG=OFF``); ``DETAIL`` checks every call::

    mpiexec -n 2 python benchmarks/debug_overhead.py [--calls 2000] [--rounds 15]
    mpiexec -n 2 python benchmarks/debug_overhead.py --ddp [--rounds 15]   # a DDP step, OFF vs default

Prints, per case and mode, the median over rounds of the mean µs per call on rank 0, each
mode's ratio to OFF, and the median of the per-round ratios (the robust figure on a shared
machine). INFO's log records go to a disabled logger, so INFO measures mpidist's side only.
"""

from __future__ import annotations

import argparse
import logging
import time

import numpy as np

import mpidist as dist
from mpidist.checks import debug, signature

MODES = ("OFF", "default", "INFO", "DETAIL")


def set_mode(mode: str) -> None:
    debug.set_debug_level("OFF" if mode in ("OFF", "default") else mode)
    signature.enable(mode != "OFF")


def timed(fn, calls: int) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def cases(n: int) -> dict:
    small, k64, m1 = np.ones(2, np.float32), np.ones(16384, np.float32), np.ones(262144, np.float32)
    return {
        "all_reduce 8 B": lambda: dist.all_reduce(small),
        "all_reduce 64 KiB": lambda: dist.all_reduce(k64),
        "all_reduce 1 MiB": lambda: dist.all_reduce(m1),
        "broadcast 8 B": lambda: dist.broadcast(small, src=0),
        "broadcast 64 KiB": lambda: dist.broadcast(k64, src=0),
        "all_to_all_single 8 B": lambda: dist.all_to_all_single(
            np.empty(2 * n, np.float32), np.ones(2 * n, np.float32)),
        "barrier": lambda: dist.barrier(),
    }


def ddp_rows(rounds: int, steps: int = 5) -> list:
    """A DDP step of a small MLP through torch.distributed on "mpidist": OFF vs default, interleaved."""
    import torch
    import torch.distributed as tdist

    import mpidist.torch  # noqa: F401  (registers the backend)

    torch.set_num_threads(1)
    tdist.init_process_group("mpidist")
    torch.manual_seed(0)
    layers = [torch.nn.Linear(512, 512) for _ in range(4)]
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers), bucket_cap_mb=1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(32, 512)

    def step() -> None:
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    times: dict[str, list[float]] = {"OFF": [], "default": []}
    for r in range(rounds):
        for mode in (("OFF", "default") if r % 2 else ("default", "OFF")):
            set_mode(mode)
            step()
            tdist.barrier()
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            times[mode].append((time.perf_counter() - t0) / steps * 1e6)
    return [("DDP step (4x512x512)", times)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--only", default="", help="run only the cases whose name contains this")
    ap.add_argument("--ddp", action="store_true", help="time a DDP step instead (INFO/DETAIL not run)")
    a = ap.parse_args()
    dist.init_process_group("mpi", abort_on_error=False)
    logging.getLogger("mpidist").disabled = True
    rows = ddp_rows(a.rounds) if a.ddp else []
    for name, fn in ({} if a.ddp else cases(dist.get_world_size())).items():
        if a.only not in name:
            continue
        calls = a.calls if "1 MiB" not in name and "64 KiB" not in name else max(a.calls // 10, 50)
        times: dict[str, list[float]] = {m: [] for m in MODES}
        for r in range(a.rounds):
            for i in range(len(MODES)):
                mode = MODES[(i + r) % len(MODES)]
                set_mode(mode)
                fn()
                times[mode].append(timed(fn, calls))
        rows.append((name, times))
    set_mode("default")
    if dist.get_rank() == 0:
        print(f"check overhead, {dist.get_world_size()} ranks, {a.calls} calls (1/10 at >= 64 KiB) x "
              f"{a.rounds} interleaved rounds; median us/call, and [median of per-round ratios to OFF]")
        print(f"{'call':24s} " + " ".join(f"{m:>17s}" for m in MODES))
        for name, t in rows:
            off = np.asarray(t["OFF"])
            cells = []
            for m in MODES:
                if m not in t:
                    cells.append(f"{'-':>17s}")
                    continue
                ratio = float(np.median(np.asarray(t[m]) / off))
                cells.append(f"{np.median(t[m]):8.2f} [{ratio:5.3f}]")
            print(f"{name:24s} " + " ".join(cells))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

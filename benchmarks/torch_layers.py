"""Where a torch backend all_reduce spends its time, layer by layer, and what a large call does to the rest.

Five ways to all_reduce the same float32 tensor, interleaved in one job (medians of the
rounds, slowest rank), each layer adding one step to the one below it:

* ``torch.distributed.all_reduce`` on the ``"mpidist"`` default group (torch's Python and C++
  dispatch, then the backend);
* the backend's own ``allreduce`` method, called from Python (torch's dispatch left out);
* ``mpidist.all_reduce`` on the tensor (the backend's wrapper left out);
* ``mpidist.all_reduce`` on the tensor's numpy view (the tensor conversion left out);
* mpi4py's ``Allreduce`` on that view (mpidist left out).

Then, on each rank alone, the time of ``Tensor.numpy()`` and of an empty Python call right after
``--sweep`` bytes were copied with ``numpy.copyto``: a large call streams its buffer through
the core's L2 cache and evicts the interpreter's and torch's own working set, so the Python
of the next call runs several times slower than in a loop that never leaves the cache. That is
why each layer's cost grows with the message once it passes the L2 size (docs/benchmarks.md,
"The torch backend after a large call").

    mpiexec -n 2 python benchmarks/torch_layers.py
    mpiexec -n 2 python benchmarks/torch_layers.py --sizes 4,1MiB --rounds 9 --json layers.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable

import numpy as np
import torch
import torch.distributed as tdist
from mpi4py import MPI
from suite.sizes import parse_sizes
from suite.timing import interleave

import mpidist
import mpidist.torch  # noqa: F401  (registers the backend)
from mpidist.torch import backend

LAYERS = ("torch.distributed", "backend method", "mpidist(tensor)", "mpidist(ndarray)", "mpi4py")


def _loop(fn: Callable[[], object]) -> Callable[[int], float]:
    def loop(iters: int) -> float:
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return time.perf_counter() - t0
    return loop


def the_backend(t: torch.Tensor) -> backend.MpidistProcessGroup:
    """The default group's backend object, caught in the one call torch makes to it."""
    seen: list[backend.MpidistProcessGroup] = []
    method = backend.MpidistProcessGroup.allreduce

    def catch(self: backend.MpidistProcessGroup, tensors: list, opts: object = None) -> object:
        seen.append(self)
        return method(self, tensors, opts)

    backend.MpidistProcessGroup.allreduce = catch
    try:
        tdist.all_reduce(t)
    finally:
        backend.MpidistProcessGroup.allreduce = method
    return seen[0]


def layers(comm: MPI.Comm, nbytes: int, rounds: int, target: float) -> dict[str, float]:
    """Microseconds per call of each layer (median over the rounds, slowest rank)."""
    t = torch.ones(max(nbytes // 4, 1))
    arr = t.numpy()
    pg = the_backend(t)
    group = pg.mpi_group
    raw = group.comm
    opts = tdist.AllreduceOptions()
    opts.asyncOp = False  # as torch.distributed.all_reduce(t) passes it
    loops = {
        "torch.distributed": _loop(lambda: tdist.all_reduce(t)),
        "backend method": _loop(lambda: pg.allreduce([t], opts).wait()),
        "mpidist(tensor)": _loop(lambda: mpidist.all_reduce(t, group=group)),
        "mpidist(ndarray)": _loop(lambda: mpidist.all_reduce(arr, group=group)),
        "mpi4py": _loop(lambda: raw.Allreduce(MPI.IN_PLACE, [arr, MPI.FLOAT])),
    }
    res = interleave(comm, loops, rounds, target)
    return {k: statistics.median(res[k]["samples"]) * 1e6 for k in LAYERS}


def l2_bytes() -> int:
    """The first core's L2 cache size from sysfs (0 where it does not say)."""
    try:
        text = open("/sys/devices/system/cpu/cpu0/cache/index2/size").read().strip().upper()
    except OSError:
        return 0
    return int(text[:-1]) << {"K": 10, "M": 20}[text[-1]] if text[-1] in "KM" else int(text)


def after_sweep(nbytes: int, reps: int) -> dict[str, float]:
    """Microseconds of ``Tensor.numpy()`` and of an empty call right after ``nbytes`` were copied."""
    t = torch.ones(16)
    dst = np.ones(max(nbytes // 8, 1))
    src = np.ones_like(dst)
    out = {}
    for name, fn in (("Tensor.numpy()", t.numpy), ("empty call", lambda: None)):
        total = 0.0
        for _ in range(reps):
            if nbytes:
                np.copyto(dst, src)
            t0 = time.perf_counter()
            fn()
            total += time.perf_counter() - t0
        out[name] = total / reps * 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4,64KiB,1MiB,4MiB", help="all_reduce bytes, comma-separated")
    ap.add_argument("--sweep", default="0,512KiB,1MiB,2MiB,4MiB,16MiB",
                    help="bytes copied before each timed call")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--target", type=float, default=0.05, help="seconds per sample")
    ap.add_argument("--sweep-reps", type=int, default=300)
    ap.add_argument("--json", help="also write the results here (rank 0)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    mpidist.init_process_group()
    tdist.init_process_group("mpidist")
    comm = MPI.COMM_WORLD.Dup()
    rank = comm.rank
    rows = [{"bytes": n, **layers(comm, n, args.rounds, args.target)} for n in parse_sizes(args.sizes)]
    sweeps = [{"bytes": n, **after_sweep(n, args.sweep_reps)} for n in parse_sizes(args.sweep)]
    if rank == 0:
        l2 = l2_bytes()
        print(f"all_reduce float32, {comm.size} ranks: us per call (over mpi4py's); "
              f"L2 {l2 >> 10} KiB per core")
        print(f"{'bytes':>9} " + " ".join(f"{k:>22}" for k in LAYERS))
        for r in rows:
            base = r["mpi4py"]
            print(f"{r['bytes']:>9} " + " ".join(f"{r[k]:>12.1f} (+{r[k] - base:6.1f})" for k in LAYERS))
        print("\nright after copying N bytes (one rank): us")
        print(f"{'N':>9} {'Tensor.numpy()':>15} {'empty call':>11}")
        for s in sweeps:
            print(f"{s['bytes']:>9} {s['Tensor.numpy()']:>15.2f} {s['empty call']:>11.2f}")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"ranks": comm.size, "l2_bytes": l2, "layers": rows, "after_sweep": sweeps},
                          fh, indent=1)
    comm.Free()
    tdist.destroy_process_group()


if __name__ == "__main__":
    main()

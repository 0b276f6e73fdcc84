"""float32 / float16 / bfloat16 all_reduce bandwidth side by side, plus the 16-bit alternatives.

Run under MPI, e.g.::

    mpiexec -n 2 python benchmarks/mixed_precision.py --quick
    mpiexec -n 2 python benchmarks/mixed_precision.py --sizes 1K,64K,1M,4M,16M --all-methods

Sizes are message bytes per rank (the same bytes for every dtype, so a 16-bit message has
twice the elements). The implementations take turns within one job (``benchmarks/suite/timing``:
interleaved rounds, medians, per-round paired ratios), which cancels most of a shared
machine's drift. Rank 0 prints one row per (size, implementation):

* ``float32`` / ``float16`` / ``bfloat16`` -- ``mpidist.all_reduce`` on that dtype
* ``float32-n``   -- float32 with as many *elements* as the 16-bit message (the per-element
  comparison for small messages)

and with ``--all-methods`` the 16-bit means side by side (float16 words):

* ``gather``  -- ``MPI_Allgather`` of the words, every rank reduces (in chunks)
* ``split``   -- two exchanges: at 2 ranks ``MPI_Sendrecv`` of halves, sum, ``MPI_Sendrecv``; on
  more ranks ``MPI_Alltoallv`` + one reduction per slice + ``MPI_Allgatherv``
* ``wide``    -- widen to float32, ``MPI_Allreduce`` on float32, round once
* ``numpy``   -- lowprec's choice, with the C kernel switched off (the fallback)
* ``mpi-float16`` -- MPI's own float16 type where the MPI has one

``ratio`` is bandwidth / float32's bandwidth at that size (paired per round), ``per-el``
float32-n's time / this row's time (>= 1: no slower per element than float32).
``--json PATH`` writes every sample.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent))

from suite.sizes import parse_size  # noqa: E402
from suite.timing import interleave, paired_ratio, python_loop, summary  # noqa: E402

import mpidist as dist  # noqa: E402
from mpidist.calls import lowprec, lowprec_math  # noqa: E402
from mpidist.core.buffers import as_buffer  # noqa: E402


def make_array(dtype: str, count: int) -> np.ndarray:
    # zeros: repeated in-place sums stay finite (random data overflows float16 after a few reps)
    if dtype == "bfloat16":
        return np.zeros(count, np.uint16).view(lowprec_math.bf16_dtype() or np.uint16)
    return np.zeros(count, dtype)


def allreduce_wide(comm: MPI.Comm, w16: np.ndarray, red: lowprec.Reduction) -> None:
    """The alternative lowprec does not take: widen, ``MPI_Allreduce`` on float32, round once."""
    wide = np.empty(w16.size, np.float32)
    lowprec.widen(w16, red.kind, wide)
    comm.Allreduce(MPI.IN_PLACE, [wide, MPI.FLOAT], MPI.SUM)
    lowprec.narrow(wide, red.kind, w16)


def forced(comm: MPI.Comm, w16: np.ndarray, how: str):
    """A loop body running one of lowprec's means on float16 words, whatever it would choose."""
    red = lowprec.Reduction("f16", np.add, False)
    saved = (lowprec._gather_all, lowprec_math._kernel)

    def run() -> None:
        if how == "wide":
            allreduce_wide(comm, w16, red)
            return
        if how == "numpy":
            lowprec_math._kernel = None
        else:
            lowprec._gather_all = lambda n, size: how == "gather"
        try:
            lowprec.allreduce(comm, w16, red)
        finally:
            lowprec._gather_all, lowprec_math._kernel = saved
    return run


def loops_for(nbytes: int, comm: MPI.Comm, dtypes: list[str], all_methods: bool) -> dict:
    out = {}
    for dtype in dtypes:
        x = make_array(dtype, nbytes // (4 if dtype == "float32" else 2))
        out[dtype] = python_loop(dist.all_reduce, (x,))
    if any(d != "float32" for d in dtypes):
        out["float32-n"] = python_loop(dist.all_reduce, (make_array("float32", nbytes // 2),))
    if not all_methods:
        return out
    for how in ("gather", "split", "wide", "numpy"):
        w16 = as_buffer(make_array("float16", nbytes // 2), "bench", "x", True)[0].reshape(-1)
        run = forced(comm, w16, how)
        out[how] = python_loop(run, ())
    f16 = getattr(MPI, "FLOAT16_T", MPI.DATATYPE_NULL)
    if f16 != MPI.DATATYPE_NULL:
        x = make_array("float16", nbytes // 2)
        out["mpi-float16"] = python_loop(comm.Allreduce, (MPI.IN_PLACE, [x, f16], MPI.SUM))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1K,64K,1M,4M,16M", help="message bytes, comma separated")
    parser.add_argument("--quick", action="store_true", help="sizes 1K,1M,16M, 5 rounds")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--target", type=float, default=0.02, help="seconds per sample")
    parser.add_argument("--dtypes", default="float32,float16,bfloat16")
    parser.add_argument("--all-methods", action="store_true",
                        help="also time the 16-bit means one by one (gather, split, wide, numpy)")
    parser.add_argument("--numpy-only", action="store_true",
                        help="do not import torch (without the C kernel, float16 casts then use numpy)")
    parser.add_argument("--json", help="write the samples here")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.rounds = "1K,1M,16M", 5
    if not args.numpy_only:
        try:
            import torch  # noqa: F401  (lowprec's fallback uses torch's casts once it is loaded)
        except ImportError:
            pass
    dist.init_process_group("mpi")
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    kern = lowprec.kernel("f16") if hasattr(lowprec, "kernel") else None
    if rank == 0:
        print(f"# mixed_precision: {size} ranks, {args.rounds} rounds, kernel: "
              f"{kern.isa if kern else 'none'}, {MPI.Get_library_version().splitlines()[0]}")
        print(f"{'bytes':>10} {'impl':>12} {'ms':>9} {'MB/s':>9} {'ratio':>6} {'per-el':>6}")
    results = []
    dtypes = args.dtypes.split(",")
    for nbytes in (parse_size(s) for s in args.sizes.split(",")):
        loops = loops_for(nbytes, comm, dtypes, args.all_methods)
        res = interleave(comm, loops, args.rounds, args.target)
        base = res.get("float32")
        per_el = res.get("float32-n")
        for name, r in res.items():
            med = summary(r["samples"])["median"]
            ratio = paired_ratio(base["samples"], r["samples"]) if base else float("nan")
            pe = paired_ratio(per_el["samples"], r["samples"]) if per_el else float("nan")
            results.append({"bytes": nbytes, "impl": name, "median_s": med, "ratio": ratio,
                            "per_element": pe, "samples": r["samples"]})
            if rank == 0:
                bw = (nbytes if name != "float32-n" else 2 * nbytes) / med / 1e6
                print(f"{nbytes:>10} {name:>12} {med * 1e3:9.3f} {bw:9.1f} {ratio:6.2f} {pe:6.2f}",
                      flush=True)
    if rank == 0 and args.json:
        Path(args.json).write_text(json.dumps({"ranks": size, "results": results}, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

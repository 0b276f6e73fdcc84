"""float32 / float16 / bfloat16 all_reduce bandwidth side by side, plus the 16-bit alternatives.

Run under MPI, e.g. (the full measurement)::

    mpiexec -n 2 python benchmarks/mixed_precision.py --sizes 64K,1M,4M,16M --reps 10
    mpiexec -n 4 python benchmarks/mixed_precision.py --sizes 64K,1M,4M,16M --reps 10

Sizes are message bytes per rank (the same bytes for every dtype, so a 16-bit message has
twice the elements). Bandwidth is message bytes / median seconds of one all_reduce.
Rank 0 prints one row per (size, dtype, method):

* ``mpidist``      -- ``mpidist.all_reduce`` (16-bit: lowprec's gather / reduce-scatter paths)
* ``userop``       -- ``MPI_Allreduce`` with the numpy user-defined op (rounds at every step)
* ``gather``       -- lowprec's small-message path forced at every size
* ``rs-ag``        -- lowprec's reduce-scatter/all-gather path forced at every size
* ``mpi-float16``  -- MPI's own float16 type (``MPIX_C_FLOAT16``) where the MPI has it

and ``ratio`` = bandwidth / float32's bandwidth at that size (the goal: >= 0.5 from 1 MiB).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import mpidist as dist
from mpidist import lowprec
from mpidist.buffers import as_buffer


def parse_size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * mult)


def timed(fn, reps: int, comm: MPI.Comm) -> float:
    fn()  # warm-up (allocations, first-touch)
    out = []
    for _ in range(reps):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    # the slowest rank decides a collective's time
    return comm.allreduce(statistics.median(out), op=MPI.MAX)


_USER_OPS: dict[str, MPI.Op] = {}


def _user_op(kind: str) -> MPI.Op:
    """The peer a user would write: an ``MPI.Op`` that sums 16-bit words in float32 per step."""
    if kind not in _USER_OPS:
        def add(inbuf, inoutbuf, datatype):
            a = np.frombuffer(inbuf, np.uint16)
            b = np.frombuffer(inoutbuf, np.uint16)
            if kind == "f16":
                b.view(np.float16)[...] = a.view(np.float16).astype(np.float32) + b.view(np.float16)
            else:
                lowprec.f32_to_bf16(lowprec.bf16_to_f32(a) + lowprec.bf16_to_f32(b), out=b)
        _USER_OPS[kind] = MPI.Op.Create(add, commute=True)
    return _USER_OPS[kind]


def methods(dtype: str, comm: MPI.Comm):
    """(name, make(buffer) -> callable) pairs for one dtype."""
    yield "mpidist", lambda x: (lambda: dist.all_reduce(x))
    if dtype == "float32":
        return
    kind = "f16" if dtype == "float16" else "bf16"
    red = lowprec.Reduction(kind, np.add, False)

    def userop(x):
        arr, d = as_buffer(x, "bench", "x", True)
        op = _user_op(kind)
        return lambda: comm.Allreduce(MPI.IN_PLACE, [arr, d.mpi], op)

    def forced(small: bool):
        def make(x):
            words = as_buffer(x, "bench", "x", True)[0].reshape(-1)

            def run():
                saved = lowprec._gather_all
                lowprec._gather_all = lambda n, size: small
                try:
                    lowprec.allreduce(comm, words, red)
                finally:
                    lowprec._gather_all = saved
            return run
        return make

    yield "userop", userop
    yield "gather", forced(True)
    yield "rs-ag", forced(False)
    f16 = getattr(MPI, "FLOAT16_T", MPI.DATATYPE_NULL)
    if dtype == "float16" and f16 != MPI.DATATYPE_NULL:
        yield "mpi-float16", lambda x: (lambda: comm.Allreduce(MPI.IN_PLACE, [x, f16], MPI.SUM))


def make_array(dtype: str, nbytes: int, rank: int) -> np.ndarray:
    # zeros: repeated in-place sums stay finite (random data overflows float16 after a few reps)
    itemsize = 4 if dtype == "float32" else 2
    if dtype == "bfloat16":
        return np.zeros(nbytes // itemsize, np.uint16).view(lowprec._bf16_dtype() or np.uint16)
    return np.zeros(nbytes // itemsize, dtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="64K,1M,4M", help="message bytes, comma separated")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dtypes", default="float32,float16,bfloat16")
    parser.add_argument("--all-methods", action="store_true",
                        help="also time the 16-bit alternatives (userop, gather, rs-ag, mpi-float16)")
    parser.add_argument("--numpy-only", action="store_true",
                        help="do not import torch (float16 casts then use numpy's slower loops)")
    args = parser.parse_args()
    if not args.numpy_only:
        try:
            import torch  # noqa: F401  (lowprec uses torch's vectorised casts once it is loaded)
        except ImportError:
            pass
    dist.init_process_group("mpi")
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if rank == 0:
        import sys
        casts = "torch" if "torch" in sys.modules else "numpy"
        print(f"# mixed_precision: {size} ranks, reps={args.reps}, float16 casts: {casts}, "
              f"{MPI.Get_library_version().splitlines()[0]}")
        print(f"{'bytes':>10} {'dtype':>9} {'method':>12} {'ms':>9} {'MB/s':>9} {'ratio':>6}")
    for nbytes in (parse_size(s) for s in args.sizes.split(",")):
        base = None
        for dtype in args.dtypes.split(","):
            for name, make in methods(dtype, comm):
                if name != "mpidist" and not args.all_methods:
                    continue
                x = make_array(dtype, nbytes, rank)
                secs = timed(make(x), args.reps, comm)
                bw = nbytes / secs / 1e6
                if dtype == "float32":
                    base = bw
                ratio = f"{bw / base:6.2f}" if base else "     -"
                if rank == 0:
                    print(f"{nbytes:>10} {dtype:>9} {name:>12} {secs * 1e3:9.2f} {bw:9.1f} {ratio}",
                          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

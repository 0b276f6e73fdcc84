"""mpidist's per-call overhead, counted in instructions (callgrind) or profiled (cProfile).

Timings on a shared machine are noise; instruction counts are not. ``--callgrind`` runs
this script again under ``valgrind --tool=callgrind`` as a world of 1 (an MPI singleton:
the MPI call itself is a local copy, so the count is the software path) and, for each
call and implementation, counts the instructions of ``-n`` operations between two
client-request markers (benchmarks/c/cgmark.c)::

    python benchmarks/hotpath.py --callgrind                      # every array + object call
    python benchmarks/hotpath.py --callgrind --calls all_reduce,broadcast --bytes 8
    MPIDIST_THREAD_LEVEL=single python benchmarks/hotpath.py --callgrind
    PYTHONPATH=/tmp/scratch python benchmarks/hotpath.py --callgrind   # a patched mpidist

``--cprofile`` profiles ``-n`` mpidist operations of each call (any world size) and prints
the functions that cost the most::

    mpiexec -n 2 python benchmarks/hotpath.py --cprofile --calls all_reduce -n 20000
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import io
import os
import pstats
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

DEFAULT_CALLS = ("all_reduce,broadcast,reduce,all_gather,all_gather_into_tensor,reduce_scatter_tensor,"
                 "all_to_all_single,gather,scatter,barrier,broadcast_object_list,all_gather_object,"
                 "gather_object,scatter_object_list")


def _ctx(with_c: bool, with_torch: bool):
    import mpidist  # before mpi4py.MPI loads: mpidist applies MPIDIST_THREAD_LEVEL

    mpidist.init_process_group("mpi", abort_on_error=False)
    from mpi4py import MPI
    from mpi4py.util import pkl5
    from suite import cases, cfloor

    pg = mpidist.group.WORLD
    x = cases.Ctx(pg.rank(), pg.size(), mpidist, pg.comm, pkl5.Intracomm(pg.comm),
                  ctl=MPI.COMM_WORLD)
    if with_torch:  # importing torch under valgrind takes minutes: only when asked
        import torch

        x.torch = torch
    if with_c:
        x.clib, _ = cfloor.load(MPI.COMM_WORLD)
    return x


def _loops(call: str, x, nbytes: int, impls: list[str]):
    from suite import cases, timing

    b = cases.alloc(call, nbytes, x.rank, x.size)
    out = {}
    for impl in impls:
        if cases.supports(impl, call, x):
            continue
        if impl == "c":
            out[impl] = cases.c_body(call, x, b)
            continue
        if impl == "mpidist_torch":
            fn, args = cases.mpidist_body(call, x, b, x.torch.from_numpy)
        elif impl == "mpidist":
            fn, args = cases.mpidist_body(call, x, b)
        else:
            fn, args = cases.mpi4py_body(call, x, b)
        out[impl] = timing.python_loop(fn, args)
    return out


def inner(args: argparse.Namespace) -> None:
    """Under callgrind: one dump per (call, impl) region of ``args.n`` operations."""
    import mpidist

    mark = ctypes.CDLL(args.marklib)
    mark.cgmark_dump.argtypes = [ctypes.c_char_p]
    x = _ctx(with_c="c" in args.impls, with_torch="mpidist_torch" in args.impls)
    print(f"# mpidist from {Path(mpidist.__file__).parent}", flush=True)
    mark.cgmark_zero()  # the first dump carries one-off costs: spend it on nothing
    mark.cgmark_dump(b"first")
    for call in args.calls:
        for impl, loop in _loops(call, x, args.bytes, args.impls).items():
            loop(args.warmup)
            mark.cgmark_zero()
            loop(args.n)
            mark.cgmark_dump(f"{call}:{impl}".encode())
            mark.cgmark_zero()
            loop(0)  # the loop's own fixed cost (and the ctypes call, for C)
            mark.cgmark_dump(f"{call}:{impl}:empty".encode())
    mpidist.destroy_process_group()


def _build_marklib() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        sys.exit("no C compiler for benchmarks/c/cgmark.c")
    out = Path(tempfile.gettempdir()) / f"mpidist-bench-{os.getuid()}" / "libcgmark.so"
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(out), str(HERE / "c" / "cgmark.c")],
                   check=True, timeout=120)
    return str(out)


_TRIGGER = "desc: Trigger: Client Request: "


def _totals(path: Path) -> tuple[str, int]:
    name, total = "", 0
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith(_TRIGGER):
            name = line[len(_TRIGGER):].strip()
        elif line.startswith("summary:"):
            total = int(line.split()[1])
    return name, total


def outer(args: argparse.Namespace) -> None:
    """Start the callgrind child, then print instructions per operation from its dumps."""
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed")
    marklib = _build_marklib()
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=yes",
               f"--callgrind-out-file={tmp}/cg.%p", sys.executable, __file__, "--inner",
               "--marklib", marklib, "-n", str(args.n), "--warmup", str(args.warmup),
               "--bytes", str(args.bytes), "--calls", ",".join(args.calls),
               "--impls", ",".join(args.impls)]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
        if proc.returncode:
            sys.exit(f"callgrind run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        counts = {}
        for f in Path(tmp).glob("cg.*.*"):
            name, total = _totals(f)
            if name:
                counts[name] = total
    print(proc.stdout.strip())
    level = os.environ.get("MPIDIST_THREAD_LEVEL") or "multiple (mpi4py default)"
    print(f"# instructions per operation, world of 1, {args.bytes} B, thread level {level}, "
          f"n={args.n}")
    impls = [i for i in args.impls if any(k.endswith(f":{i}") for k in counts)]
    head = f"{'call':<24}" + "".join(f"{i:>15}" for i in impls) + f"{'mpidist-mpi4py':>16}"
    print(head)
    print("-" * len(head))
    for call in args.calls:
        per = {}
        for impl in impls:
            if f"{call}:{impl}" in counts:
                per[impl] = (counts[f"{call}:{impl}"] - counts.get(f"{call}:{impl}:empty", 0)) / args.n
        line = f"{call:<24}" + "".join(f"{per[i]:>15.0f}" if i in per else f"{'-':>15}" for i in impls)
        if "mpidist" in per and "mpi4py" in per:
            line += f"{per['mpidist'] - per['mpi4py']:>16.0f}"
        print(line)


def profile(args: argparse.Namespace) -> None:
    """cProfile ``args.n`` mpidist operations per call; rank 0 prints the top functions."""
    import mpidist

    x = _ctx(with_c=False, with_torch=False)
    for call in args.calls:
        loops = _loops(call, x, args.bytes, ["mpidist"])
        if "mpidist" not in loops:
            continue
        loop = loops["mpidist"]
        loop(args.warmup)
        prof = cProfile.Profile()
        prof.enable()
        loop(args.n)
        prof.disable()
        if x.rank == 0:
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(args.top)
            text = re.sub(r"^.*?(?=\s+ncalls)", "", s.getvalue(), count=1, flags=re.S)
            print(f"### {call}, {args.bytes} B, {x.size} ranks, {args.n} calls{text}")
    mpidist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--callgrind", action="store_true", help="instruction counts under valgrind")
    mode.add_argument("--cprofile", action="store_true", help="cProfile the mpidist calls")
    mode.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--calls", default=DEFAULT_CALLS)
    p.add_argument("--impls", default="mpidist,mpi4py,c", help="also: mpidist_torch (slow to start)")
    p.add_argument("--bytes", type=int, default=8, help="message size (default 8)")
    p.add_argument("-n", type=int, default=None, help="operations per region (callgrind 200, cProfile 20000)")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--timeout", type=float, default=900, help="seconds for the valgrind run")
    p.add_argument("--marklib", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.calls = [c for c in args.calls.split(",") if c]
    args.impls = [i for i in args.impls.split(",") if i]
    args.n = args.n or (20000 if args.cprofile else 200)
    if args.inner:
        inner(args)
    elif args.callgrind:
        outer(args)
    else:
        profile(args)


if __name__ == "__main__":
    main()

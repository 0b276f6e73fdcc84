"""mpidist vs raw mpi4py vs C MPI vs torch.distributed/gloo: latency per call and message size.

Run under an MPI launcher; every implementation runs in this one job, interleaved::

    mpiexec -n 2 python benchmarks/run.py            # 8 B ... 64 MiB, every call
    mpiexec -n 4 python benchmarks/run.py --quick    # 8 B, 64 KiB, 1 MiB; fewer rounds
    mpiexec -n 2 python benchmarks/run.py --calls all_reduce,broadcast --max-size 1M

Implementations: ``mpidist`` (numpy arrays), ``mpi4py`` (the same MPI call through mpi4py
on the same communicator and buffers), ``c`` (the same call from C, built at run time
with ``mpicc``; skipped with the reason when there is none), ``gloo`` (torch.distributed,
when torch is installed) and, on request, ``mpidist_torch`` (mpidist on torch tensors).
Rank 0 prints a table of median latencies with paired ratios and the issue's goals, and
writes ``benchmarks/results/<name>.json`` and ``<name>.png``.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from suite.sizes import parse_size  # noqa: E402  (also run.parse_size, for network.py and the tests)

DEFAULT_SIZES = "8,64,512,4K,64K,1M,16M,64M"
QUICK_SIZES = "8,64K,1M"
LEVELS = {0: "single", 1: "funneled", 2: "serialized", 3: "multiple"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from suite.cases import CALLS, IMPLS

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SIZES}, 3 rounds, short samples")
    p.add_argument("--sizes", help=f"comma-separated message sizes (default {DEFAULT_SIZES})")
    p.add_argument("--min-size", type=parse_size, default=0, help="drop sizes below this")
    p.add_argument("--max-size", type=parse_size, default=None, help="drop sizes above this (e.g. 16M)")
    p.add_argument("--calls", default=",".join(CALLS), help="comma-separated calls (default: all)")
    p.add_argument("--impls", default="mpidist,mpi4py,c,gloo",
                   help=f"comma-separated, from {','.join(IMPLS)} (default: mpidist,mpi4py,c,gloo)")
    p.add_argument("--rounds", type=int, default=None, help="samples per implementation (default 7, quick 3)")
    p.add_argument("--target", type=float, default=None,
                   help="seconds per sample (default 0.01, quick 0.004)")
    p.add_argument("--max-rank-bytes", type=parse_size, default=parse_size("600M"),
                   help="skip a size whose buffers would exceed this per rank (default 600M)")
    p.add_argument("--thread-level", choices=list(LEVELS.values()),
                   help="MPI thread level (sets MPIDIST_THREAD_LEVEL; default: mpidist's)")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--name", help="file stem for the JSON/PNG; {n} and {level} are filled in "
                   "(default bench_n{n}_{level})")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--no-goals", action="store_true", help="leave the goal check out of the output")
    a = p.parse_args(argv)
    a.calls = [c for c in a.calls.split(",") if c]
    a.impls = [i for i in a.impls.split(",") if i]
    for name, valid in (("call", CALLS), ("impl", IMPLS)):
        bad = [x for x in getattr(a, name + "s") if x not in valid]
        if bad:
            p.error(f"unknown {name}(s) {bad}; choose from {', '.join(valid)}")
    sizes = [parse_size(s) for s in (a.sizes or (QUICK_SIZES if a.quick else DEFAULT_SIZES)).split(",")]
    a.sizes = [s for s in sizes if s >= a.min_size and (a.max_size is None or s <= a.max_size)]
    if any(s % 4 for s in a.sizes):
        p.error("sizes must be multiples of 4 bytes (float32 elements)")
    a.rounds = a.rounds or (3 if a.quick else 7)
    a.target = a.target or (0.004 if a.quick else 0.01)
    return a


def start_gloo(ctl, rank: int, size: int):
    """torch.distributed on gloo over TCP on this host; the port is agreed through MPI."""
    try:
        import torch
        import torch.distributed as td
    except ImportError as exc:
        return None, None, f"torch not importable ({exc})"
    if not td.is_available() or not td.is_gloo_available():
        return None, None, "torch.distributed has no gloo"
    torch.set_num_threads(1)  # the ranks already share the cores
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = None
    if rank == 0:
        with socket.socket() as s:
            s.bind((addr, 0))
            port = s.getsockname()[1]
    port = ctl.bcast(port, 0)
    try:
        td.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank,
                              world_size=size, timeout=timedelta(seconds=120))
    except Exception as exc:  # noqa: BLE001 - any failure means: no gloo column
        return None, None, f"gloo init failed: {exc}"
    return torch, td, ""


def bench_one(call: str, nbytes: int, impls: list[str], x, args, skipped: list[dict]) -> dict:
    """Check then time every implementation of ``call`` at ``nbytes``; samples per impl."""
    from mpi4py import MPI
    from suite import cases, timing

    b = cases.alloc(call, nbytes, x.rank, x.size)
    loops = {}
    for impl in impls:
        reason = cases.supports(impl, call, x)
        if not reason:
            loop, ok = _prepare(impl, call, x, b)
            if not x.ctl.allreduce(ok, op=MPI.LAND):
                reason = "wrong result in the pre-timing check"
            else:
                loops[impl] = loop
        if reason and x.rank == 0:
            skipped.append({"call": call, "bytes": nbytes, "impl": impl, "reason": reason})
    if b.s is not None:
        b.s[...] = 0  # time reductions on zeros: sums stay finite and never denormal
    if b.r is not None:
        b.r[...] = 0
    per_op = 2.0 if call in cases.PINGPONG else 1.0
    return timing.interleave(x.ctl, loops, args.rounds, args.target, per_op=per_op) if loops else {}


def _prepare(impl: str, call: str, x, b):
    """The loop for ``impl`` and whether one operation produced the right result."""
    from suite import cases, timing

    cases.fill(call, b, x.rank, x.size)
    if impl == "c":
        loop = cases.c_body(call, x, b)
        loop(1)
        return loop, cases.check(call, b, x.rank, x.size, None)
    if impl == "mpidist":
        fn_args = cases.mpidist_body(call, x, b)
    elif impl == "mpidist_torch":
        fn_args = cases.mpidist_body(call, x, b, x.torch.from_numpy)
    elif impl == "gloo":
        fn_args = cases.gloo_body(call, x, b)
    else:
        fn_args = cases.mpi4py_body(call, x, b)
    fn, fargs = fn_args
    result = fn(*fargs)
    out = cases.returned(call, fn_args, result, b)
    return timing.python_loop(fn, fargs), cases.check(call, b, x.rank, x.size, out)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.thread_level:
        os.environ["MPIDIST_THREAD_LEVEL"] = args.thread_level
    import mpidist  # before mpi4py.MPI loads: mpidist applies MPIDIST_THREAD_LEVEL

    mpidist.init_process_group("mpi")
    from mpi4py import MPI
    from mpi4py.util import pkl5
    from suite import cases, cfloor, report, timing

    ctl = MPI.COMM_WORLD.Dup()  # timing traffic stays off the communicator under test
    rank, size = ctl.Get_rank(), ctl.Get_size()
    pg = mpidist.group.WORLD
    x = cases.Ctx(rank, size, mpidist, pg.comm, pkl5.Intracomm(pg.comm), ctl=ctl)
    notes = {}
    if "gloo" in args.impls or "mpidist_torch" in args.impls:
        torch, td, why = start_gloo(ctl, rank, size) if "gloo" in args.impls else (None, None, "")
        if torch is None and "mpidist_torch" in args.impls:
            try:
                import torch
            except ImportError:
                torch = None
        x.torch, x.tdist = torch, td
        if why:
            notes["gloo"] = why
    if "c" in args.impls:
        x.clib, why = cfloor.load(ctl)
        if why:
            notes["c"] = why
    level = LEVELS.get(MPI.Query_thread(), str(MPI.Query_thread()))
    if args.thread_level and level != args.thread_level:
        notes["thread_level"] = f"asked for {args.thread_level}, MPI provides {level}"
    name = (args.name or "bench_n{n}_{level}").format(n=size, level=level)
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"# mpidist benchmarks: {size} ranks, thread level {level}, {len(args.calls)} calls, "
        f"sizes {[report.human_size(s) for s in args.sizes]}, {args.rounds} rounds x ~{args.target}s")
    for impl, why in notes.items():
        say(f"# note ({impl}): {why}")
    results, ratios, skipped = [], [], []
    t_start = time.monotonic()
    for call in args.calls:
        sizes = [0] if call == "barrier" else args.sizes
        for nbytes in sizes:
            if cases.footprint(call, nbytes, size) > args.max_rank_bytes:
                if rank == 0:
                    skipped.append({"call": call, "bytes": nbytes, "impl": "*",
                                    "reason": "buffers exceed --max-rank-bytes"})
                continue
            got = bench_one(call, nbytes, args.impls, x, args, skipped)
            row = {"call": call, "bytes": nbytes}
            for impl, g in got.items():
                results.append({"call": call, "bytes": nbytes, "impl": impl, "iters": g["iters"],
                                **timing.summary(g["samples"]), "samples": g["samples"]})
            for key, a, b in report.RATIOS:
                if a in got and b in got:
                    row[key] = timing.paired_ratio(got[a]["samples"], got[b]["samples"])
            ratios.append(row)
            if rank == 0:
                times = "  ".join(f"{i}={report.human_time(timing.summary(g['samples'])['median'])}"
                                  for i, g in got.items())
                print(f"  {call:<24}{report.human_size(nbytes):>9}  {times}", flush=True)
    if rank == 0:
        impls = [i for i in args.impls if any(r["impl"] == i for r in results)]
        print()
        print(report.table(results, ratios, impls))
        gs = report.goals(ratios)
        if not args.no_goals:
            print("\ngoals (issue 8; ratios are paired medians from this run):")
            print(report.goal_text(gs))
        meta = {"world_size": size, "thread_level": level, "mpi": MPI.Get_library_version().split("\n")[0],
                "mpi4py": __import__("mpi4py").__version__, "numpy": __import__("numpy").__version__,
                "torch": getattr(x.torch, "__version__", None), "host": platform.node(),
                "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "argv": sys.argv[1:], "rounds": args.rounds, "target_s": args.target,
                "elapsed_s": round(time.monotonic() - t_start, 1), "notes": notes}
        path = args.out / f"{name}.json"
        report.write_json(path, {"meta": meta, "results": results, "ratios": ratios,
                                 "skipped": skipped, "goals": gs})
        print(f"\nwrote {path}")
        if not args.no_plot:
            png = report.plot(args.out / f"{name}.png", results, ratios, impls,
                              f"mpidist benchmarks, {size} ranks, MPI_THREAD_{level.upper()}")
            print(f"wrote {png}" if png else "no plot: matplotlib is not installed")
        if skipped:
            print(f"skipped: {len(skipped)} (call, size, impl) entries, reasons in the JSON")
    if x.tdist is not None:
        x.tdist.destroy_process_group()
    ctl.Free()
    mpidist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

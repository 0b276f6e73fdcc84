"""MPI_THREAD_SINGLE vs MPI_THREAD_MULTIPLE, at several world sizes, small and large messages.

The thread level is fixed when MPI starts, so each level needs its own job; the jobs
alternate (single, multiple, single, multiple, …) and the medians of their medians are
compared. Run it without a launcher; it starts ``mpiexec`` itself, each job under a timeout::

    python benchmarks/thread_levels.py                           # 2 and 4 ranks, 2 repeats
    python benchmarks/thread_levels.py --ranks 2 --repeats 3 --sizes 8,1M

Writes ``benchmarks/results/thread_levels.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from suite.report import human_size, human_time  # noqa: E402


def mpiexec() -> str:
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else (shutil.which("mpiexec") or "mpiexec")


def one_job(n: int, level: str, args: argparse.Namespace, tag: str) -> dict | None:
    name = f"tl_n{n}_{level}_{tag}"
    cmd = [mpiexec(), "-n", str(n), sys.executable, str(HERE / "run.py"), "--thread-level", level,
           "--calls", args.calls, "--impls", args.impls, "--sizes", args.sizes, "--rounds",
           str(args.rounds), "--target", str(args.target), "--name", name, "--out", str(args.tmp),
           "--no-plot", "--no-goals"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        print(f"  {n} ranks {level}: timed out after {args.timeout} s", flush=True)
        return None
    if proc.returncode:
        print(f"  {n} ranks {level}: failed ({proc.returncode}): {proc.stderr[-500:]}", flush=True)
        return None
    print(f"  {n} ranks {level} run {tag}: done", flush=True)
    return json.loads((args.tmp / f"{name}.json").read_text())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--calls", default="all_reduce,broadcast")
    p.add_argument("--impls", default="mpidist,mpi4py,c")
    p.add_argument("--sizes", default="8,64K,1M,16M")
    p.add_argument("--repeats", type=int, default=2, help="jobs per (ranks, level), alternating")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--target", type=float, default=0.005)
    p.add_argument("--timeout", type=float, default=600, help="seconds per job")
    p.add_argument("--out", type=Path, default=HERE / "results")
    args = p.parse_args()
    args.tmp = args.out
    args.tmp.mkdir(parents=True, exist_ok=True)
    levels = ("single", "multiple")
    medians: dict[tuple, list[float]] = {}
    for n in [int(r) for r in args.ranks.split(",")]:
        for rep in range(args.repeats):
            for level in levels if rep % 2 == 0 else levels[::-1]:
                data = one_job(n, level, args, str(rep))
                for r in (data or {}).get("results", []):
                    medians.setdefault((n, r["call"], r["bytes"], r["impl"], level), []).append(r["median"])
    rows = []
    for (n, call, nbytes, impl, level), vals in sorted(medians.items()):
        if level != "single":
            continue
        multi = medians.get((n, call, nbytes, impl, "multiple"))
        single = statistics.median(vals)
        mult = statistics.median(multi) if multi else None
        rows.append({"ranks": n, "call": call, "bytes": nbytes, "impl": impl, "single": single,
                     "multiple": mult, "single/multiple": single / mult if mult else None})
    print(f"\n{'ranks':>5} {'call':<12}{'size':>9} {'impl':<9}{'SINGLE':>12}{'MULTIPLE':>12}{'S/M':>8}")
    for r in rows:
        ratio = f"{r['single/multiple']:.2f}" if r["single/multiple"] else "-"
        print(f"{r['ranks']:>5} {r['call']:<12}{human_size(r['bytes']):>9} {r['impl']:<9}"
              f"{human_time(r['single']):>12}{human_time(r['multiple']):>12}{ratio:>8}")
    path = args.out / "thread_levels.json"
    path.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

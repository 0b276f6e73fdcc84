"""Benchmark of mpidist.groupby against pandas and DuckDB on the same generated data.

    python benchmarks/groupby.py                      # 10 M rows, 10 k and 1 M keys, 1/2/4 ranks
    python benchmarks/groupby.py --rows 1000000 --check

The driver generates the table (int64 key uniform over ``--keys`` distinct values, float64
value), times pandas ``groupby().agg()`` and DuckDB ``GROUP BY`` in this process, then
starts ``mpiexec -n N python benchmarks/groupby.py --worker ...`` for each rank count.
Each rank generates its own contiguous slice of the very same rows (data are made in
fixed-size chunks seeded by chunk number, so the table does not depend on N) and times
``aggregate`` per merge mode: barrier, aggregate, barrier; the slowest rank's time, best
of ``--repeat``. Throughput is rows per second; the ratio column is throughput over
pandas'. ``--check`` compares the group count and column sums of ``merge="root"`` with pandas.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

CHUNK = 1 << 20
HERE = Path(__file__).resolve()


def generate(lo: int, hi: int, keys: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``lo..hi-1`` of the table for ``keys`` distinct keys (the same for any split)."""
    ks, vs = [], []
    for c in range(lo // CHUNK, (hi - 1) // CHUNK + 1 if hi > lo else lo // CHUNK):
        rng = np.random.default_rng([keys, c])
        k = rng.integers(0, keys, CHUNK)
        v = rng.normal(100.0, 20.0, CHUNK)
        a, b = max(lo, c * CHUNK) - c * CHUNK, min(hi, (c + 1) * CHUNK) - c * CHUNK
        ks.append(k[a:b])
        vs.append(v[a:b])
    if not ks:
        return np.empty(0, np.int64), np.empty(0)
    return np.concatenate(ks), np.concatenate(vs)


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def worker(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    import mpidist as dist
    import mpidist.groupby as gb

    dist.init_process_group("mpi")
    rank, size = dist.get_rank(), dist.get_world_size()
    comm = MPI.COMM_WORLD
    lo, hi = args.rows * rank // size, args.rows * (rank + 1) // size
    k, v = generate(lo, hi, args.keys)
    aggs = args.aggs.split(",")
    out = {"ranks": size, "times": {}, "check": None}
    for mode in args.modes.split(","):
        times = []
        for _ in range(args.repeat):
            comm.Barrier()
            t0 = time.perf_counter()
            res = gb.aggregate(k, v, aggs, merge=mode)
            comm.Barrier()
            times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        out["times"][mode] = min(times)
        if mode == "root" and res is not None and args.check:
            out["check"] = {"groups": len(res), **{a: float(np.nansum(res[("value", a)])) for a in aggs}}
        del res
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


def run_ranks(n: int, args: argparse.Namespace, keys: int) -> dict:
    mpiexec = Path(sys.executable).parent / "mpiexec"
    cmd = [str(mpiexec if mpiexec.exists() else "mpiexec"), "-n", str(n), sys.executable, str(HERE),
           "--worker", "--rows", str(args.rows), "--keys", str(keys), "--modes", args.modes,
           "--aggs", args.aggs, "--repeat", str(args.repeat)] + (["--check"] if args.check else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"mpiexec -n {n} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def driver(args: argparse.Namespace) -> int:
    import pandas as pd

    try:
        import duckdb
    except ImportError:
        duckdb = None
    aggs = args.aggs.split(",")
    sql_aggs = {"sum": "sum(v)", "mean": "avg(v)", "max": "max(v)", "min": "min(v)", "count": "count(v)",
                "var": "var_samp(v)", "std": "stddev_samp(v)", "first": "first(v)", "last": "last(v)"}
    failed = False
    print(f"rows={args.rows:,} aggs={aggs} repeat={args.repeat} (best of); cpus={os.cpu_count()}")
    for keys in (int(x) for x in args.keys.split(",")):
        k, v = generate(0, args.rows, keys)
        df = pd.DataFrame({"k": k, "v": v})
        base = best(lambda df=df: df.groupby("k").agg({"v": aggs}), args.repeat)
        rows = [("pandas groupby (1 process)", base)]
        if duckdb is not None:
            query = f"SELECT k, {', '.join(sql_aggs[a] for a in aggs)} FROM df GROUP BY k"
            for threads in sorted({1, os.cpu_count() or 1}):
                con = duckdb.connect()
                con.execute(f"SET threads TO {threads}")
                con.register("df", df)
                rows.append((f"duckdb ({threads} thread{'s' * (threads > 1)})",
                             best(lambda con=con, q=query: con.execute(q).fetchnumpy(), args.repeat)))
                con.close()
        want = df.groupby("k")["v"].agg(aggs) if args.check else None
        for n in (int(x) for x in args.ranks.split(",")):
            res = run_ranks(n, args, keys)
            for mode, t in res["times"].items():
                rows.append((f"mpidist {n} rank{'s' * (n > 1)} merge={mode}", t))
            if want is not None and res["check"] is not None:
                got = res["check"]
                ok = got["groups"] == len(want) and all(
                    np.isclose(got[a], float(np.nansum(want[a].to_numpy())), rtol=1e-9) for a in aggs)
                print(f"  check {n} ranks, {keys} keys: {'ok' if ok else f'MISMATCH {got}'}")
                failed |= not ok
        print(f"\n{keys:,} distinct keys")
        print(f"  {'engine':<36} {'seconds':>9} {'Mrows/s':>9} {'ratio vs pandas':>16}")
        for name, t in rows:
            print(f"  {name:<36} {t:9.3f} {args.rows / t / 1e6:9.1f} {base / t:16.2f}")
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--keys", default="10000,1000000", help="distinct key counts, comma-separated")
    ap.add_argument("--ranks", default="1,2,4", help="rank counts, comma-separated")
    ap.add_argument("--modes", default="root,shuffle,gather,none")
    ap.add_argument("--aggs", default="sum,mean,max")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per mpiexec run")
    ap.add_argument("--check", action="store_true", help="compare merge='root' with pandas")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        args.keys = int(args.keys)
        worker(args)
        return 0
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())

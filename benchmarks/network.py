"""Across nodes: every call on a simulated two-node cluster with shaped links, against the wire's bound.

Starts a cluster of network namespaces (``tests/cluster/harness.py``: needs root, ``ip`` and
``tc``), limits each node's link to each ``--rates`` (``tc tbf``, both directions) and runs,
with one rank per node, in one job per rate:

* ``benchmarks/run.py`` -- every array and object call, float32, mpidist vs raw mpi4py vs
  torch gloo, interleaved;
* this file's ``--lowprec-job`` -- all_reduce in float32, float16 and bfloat16 of the same
  number of elements (``--sizes`` are the float32 bytes), mpidist vs gloo (raw mpi4py has no
  16-bit reduction), and each 16-bit time over float32's;
* with ``--ddp``: ``benchmarks/torch_backend.py --two-node`` -- DDP steps of a 10 M-parameter
  MLP, mpidist vs gloo, float32 gradients and ``fp16_compress_hook``.

Each time is also given as a fraction of the line-rate bound of its call (the bytes the
busiest link must carry, over the rate; see :func:`bound_bytes`): 1.0 is the wire's speed.
Writes ``<out>/network.json``, ``network.txt`` and ``network.png`` (like ``run.py``).
The namespaces are removed at the end, also on error or Ctrl-C::

    python benchmarks/network.py --quick            # 1 and 10 Gbit, 4 sizes, 2 rounds
    python benchmarks/network.py --rates 1gbit --sizes 1M,16M --calls all_reduce --ddp
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))
from suite.sizes import parse_sizes  # noqa: E402

QUICK_SIZES = "8,64K,1M,16M"
DEFAULT_SIZES = "8,4K,64K,1M,4M,16M"
LOWPREC_DTYPES = ("float32", "float16", "bfloat16")


def rate_bytes(rate: str) -> float:
    """``tc`` rate text (``1gbit``, ``100mbit``) -> bytes per second (SI, as tc counts)."""
    low = rate.lower().strip()
    for unit, mult in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if low.endswith(unit):
            return float(low[: -len(unit)]) * mult / 8
    raise ValueError(f"not a tc rate: {rate!r}")


def bound_bytes(call: str, nbytes: int, size: int) -> float:
    """Bytes the busiest link carries at least, one rank per node, ``nbytes`` per rank's block.

    all_reduce: a reduce-scatter plus an all-gather, ``2 (p-1)/p`` blocks; broadcast, reduce
    and a ping-pong's one-way message: one block; gather, scatter, all_gather, reduce_scatter,
    all_to_all and the object calls that gather or scatter: ``p-1`` blocks through one link.
    """
    call = call.split("[")[0]
    p = size
    if call in ("barrier",):
        return 0.0
    if call == "all_reduce":
        return 2 * (p - 1) / p * nbytes
    if call in ("broadcast", "reduce", "send_recv", "broadcast_object_list", "send_recv_object"):
        return float(nbytes)
    return float((p - 1) * nbytes)


# ------------------------------------------------------------------ in the job: 16-bit all_reduce

def lowprec_job(args: argparse.Namespace) -> int:
    """all_reduce float32/float16/bfloat16: mpidist vs gloo, interleaved; JSON on rank 0."""
    import numpy as np

    import mpidist
    from mpidist.calls import lowprec_math

    mpidist.init_process_group("mpi")
    from mpi4py import MPI
    from run import start_gloo
    from suite.timing import interleave, python_loop, summary

    ctl = MPI.COMM_WORLD.Dup()
    rank, size = ctl.Get_rank(), ctl.Get_size()
    torch, td, why = start_gloo(ctl, rank, size)
    bf16 = lowprec_math.bf16_dtype()
    results = []
    for nbytes in parse_sizes(args.sizes):
        loops = {}
        n = max(nbytes // 4, 1)  # the same elements in every dtype: a 16-bit message is half the bytes
        for dtype in LOWPREC_DTYPES:
            if dtype == "bfloat16":
                arr = np.zeros(n, np.uint16).view(bf16) if bf16 else None
            else:
                arr = np.zeros(n, dtype)
            if arr is not None:
                loops[f"mpidist:{dtype}"] = python_loop(mpidist.all_reduce, (arr,))
            if td is not None:
                t = torch.zeros(n, dtype=getattr(torch, dtype))
                loops[f"gloo:{dtype}"] = python_loop(td.all_reduce, (t,))
        got = interleave(ctl, loops, args.rounds, args.target)
        for key, g in got.items():
            impl, dtype = key.split(":")
            results.append({"call": f"all_reduce[{dtype}]", "bytes": n * (4 if dtype == "float32" else 2),
                            "elements": n, "impl": impl,
                            "iters": g["iters"], **summary(g["samples"]), "samples": g["samples"]})
        if rank == 0:
            print("  " + "  ".join(f"{k}={summary(g['samples'])['median'] * 1e3:.3f}ms"
                                   for k, g in got.items()), flush=True)
    if rank == 0:
        Path(args.json).write_text(json.dumps({"results": results, "gloo": why or "ok"}, indent=1))
    if td is not None:
        td.destroy_process_group()
    ctl.Free()
    mpidist.destroy_process_group()
    return 0


# ------------------------------------------------------------------ on the head: the cluster

def run_job(cluster, argv: list[str], env: dict, timeout: float, log) -> bool:
    t0 = time.monotonic()
    try:
        proc = cluster.run_mpi([1, 1], argv, timeout=timeout, env=env, cwd=ROOT)
    except Exception as exc:  # noqa: BLE001 - a timed-out job is reported, the others still run
        log(f"  job {argv[0]} failed: {exc}")
        return False
    log(f"  {argv[0]}: exit {proc.returncode} after {time.monotonic() - t0:.0f} s")
    if proc.returncode != 0:
        log(proc.stdout[-2000:] + proc.stderr[-3000:])
    return proc.returncode == 0


def combine(rate: str, size: int, f32: dict | None, low: dict | None, ddp: dict | None) -> dict:
    """One rate's results with each median's fraction of the line-rate bound."""
    per_s = rate_bytes(rate)
    rows = []
    for part in (f32, low):
        for r in (part or {}).get("results", []):
            b = bound_bytes(r["call"], r["bytes"], size) / per_s
            rows.append({**{k: v for k, v in r.items() if k != "samples"}, "rate": rate,
                         "bound_s": b, "of_bound": (b / r["median"]) if b and r["median"] else None})
    return {"rate": rate, "results": rows, "ddp": ddp}


def table(block: dict) -> str:
    """Rows (call, size) x implementations: median time and fraction of the bound; gloo/mpidist."""
    from suite.report import human_size, human_time

    rows = block["results"]
    impls = [i for i in ("mpidist", "mpi4py", "gloo") if any(r["impl"] == i for r in rows)]
    head = f"{'call':<28}{'size':>7}{'bound':>10}" + "".join(f"{i:>19}" for i in impls) + f"{'gloo/md':>9}"
    lines = [f"links at {block['rate']} (time, fraction of the line-rate bound)", head]
    keys = list(dict.fromkeys((r["call"], r["bytes"]) for r in rows))
    for call, nbytes in keys:
        cell = {r["impl"]: r for r in rows if r["call"] == call and r["bytes"] == nbytes}
        b = next(iter(cell.values()))["bound_s"]
        line = f"{call:<28}{human_size(nbytes):>7}{human_time(b) if b else '-':>10}"
        for i in impls:
            r = cell.get(i)
            frac = f" ({r['of_bound']:.2f})" if r and r["of_bound"] else "       "
            line += f"{(human_time(r['median']) + frac) if r else '-':>19}"
        if "gloo" in cell and "mpidist" in cell:
            line += f"{cell['gloo']['median'] / cell['mpidist']['median']:>9.2f}"
        lines.append(line)
    same = [r for r in rows if "elements" in r]
    if same:
        lines.append("")
        lines.append("16-bit all_reduce time / float32's, the same elements (the wire allows 0.5)")
        t32 = {(r["impl"], r["elements"]): r["median"] for r in same if r["call"] == "all_reduce[float32]"}
        for r in same:
            base = t32.get((r["impl"], r["elements"]))
            if r["call"] != "all_reduce[float32]" and base:
                lines.append(f"  {r['impl']:<8}{r['call']:<22}{human_size(4 * r['elements']):>9} f32: "
                             f"{r['median'] / base:5.2f}")
    d = block.get("ddp")
    if d:
        lines.append("")
        lines.append(f"DDP step, {d['params']} parameters, 2 nodes (ms; bound = max(compute, bytes / rate))")
        for k, v in d["steps"].items():
            lines.append(f"  {k:<28}{v:9.1f} ms   {v / d['bound_ms'][k.split(':')[-1]]:5.2f}x bound")
        lines.append(f"  compute {d['compute_ms']:.1f} ms, bounds: "
                     + ", ".join(f"{k} {v:.1f} ms" for k, v in d["bound_ms"].items()))
    return "\n".join(lines)


def ddp_bounds(d: dict, rate: str) -> dict:
    """Add the DDP step bound: max(compute, gradient bytes / rate) for float32 and float16 grads."""
    per_s = rate_bytes(rate)
    comm = {"fp32": d["params"] * 4 / per_s * 1e3, "fp16": d["params"] * 2 / per_s * 1e3}
    d["bound_ms"] = {k: max(d["compute_ms"], v) for k, v in comm.items()}
    return d


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SIZES}, 2 rounds")
    ap.add_argument("--rates", default="1gbit,10gbit", help="link rates (tc units), comma separated")
    ap.add_argument("--sizes", help=f"message bytes (default {DEFAULT_SIZES})")
    ap.add_argument("--calls", help="calls for run.py (default: all)")
    ap.add_argument("--rounds", type=int, help="samples per implementation (default 3, quick 2)")
    ap.add_argument("--target", type=float, default=0.05, help="seconds per sample")
    ap.add_argument("--ddp", action="store_true", help="also the two-node DDP step benchmark")
    ap.add_argument("--ddp-reps", type=int, default=3, help="DDP steps per trial (2 trials)")
    ap.add_argument("--no-calls", action="store_true", help="skip run.py (only 16-bit / DDP)")
    ap.add_argument("--job-timeout", type=float, default=900)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--lowprec-job", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.sizes = args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES)
    args.rounds = args.rounds or (2 if args.quick else 3)
    if args.lowprec_job:
        return lowprec_job(args)

    from cluster import harness

    reason = harness.unavailable_reason()
    if reason:
        print(f"network benchmark skipped: no simulated cluster here ({reason})")
        return 0
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    report_lines: list[str] = []

    def log(text: str) -> None:
        print(text, flush=True)

    blocks = []
    with harness.Cluster(2) as c:
        env = {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
               "MASTER_ADDR": c.nodes[0].address, "GLOO_SOCKET_IFNAME": "eth0",
               "MPIDIST_ABORT_ON_ERROR": "1", "PYTHONUNBUFFERED": "1"}
        log(c.describe())
        for rate in args.rates.split(","):
            for node in c.nodes:
                c.shape(node.name, rate=rate)
            tag = rate.replace(".", "_")
            log(f"# links shaped to {rate}")
            f32 = low = ddp = None
            if not args.no_calls:
                cmd = ["benchmarks/run.py", "--impls", "mpidist,mpi4py,gloo", "--sizes", args.sizes,
                       "--rounds", str(args.rounds), "--target", str(args.target), "--no-plot",
                       "--no-goals", "--out", str(out), "--name", f"network_{tag}_calls"]
                if args.calls:
                    cmd += ["--calls", args.calls]
                if run_job(c, cmd, env, args.job_timeout, log):
                    f32 = json.loads((out / f"network_{tag}_calls.json").read_text())
            path = out / f"network_{tag}_lowprec.json"
            cmd = ["benchmarks/network.py", "--lowprec-job", "--sizes", args.sizes, "--rounds",
                   str(args.rounds), "--target", str(args.target), "--json", str(path)]
            if run_job(c, cmd, env, args.job_timeout, log):
                low = json.loads(path.read_text())
            if args.ddp:
                path = out / f"network_{tag}_ddp.json"
                cmd = ["benchmarks/torch_backend.py", "--two-node", "--ddp-reps", str(args.ddp_reps),
                       "--trials", "2", "--json", str(path)]
                if run_job(c, cmd, env, args.job_timeout, log):
                    ddp = ddp_bounds(json.loads(path.read_text()), rate)
            block = combine(rate, 2, f32, low, ddp)
            blocks.append(block)
            text = table(block)
            report_lines.append(text)
            log(text)
            for node in c.nodes:
                c.unshape(node.name)
    (out / "network.txt").write_text("\n\n".join(report_lines) + "\n")
    (out / "network.json").write_text(json.dumps({"argv": sys.argv[1:], "blocks": blocks,
                                                  "date": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=1))
    png = plot(out / "network.png", blocks)
    log(f"wrote {out / 'network.json'}, {out / 'network.txt'}" + (f", {png}" if png else ""))
    return 0


def plot(path: Path, blocks: list[dict]) -> Path | None:
    """Fraction of the line-rate bound vs size, one panel per (rate, call), one line per impl."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    panels = [(b["rate"], call) for b in blocks
              for call in dict.fromkeys(r["call"] for r in b["results"]) if call != "barrier"]
    if not panels:
        return None
    cols = 4
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, (rate, call) in zip(axes.flat, panels):
        rs = next(b for b in blocks if b["rate"] == rate)["results"]
        for k, impl in enumerate(("mpidist", "mpi4py", "gloo")):
            pts = sorted((r["bytes"], r["of_bound"]) for r in rs
                         if r["call"] == call and r["impl"] == impl and r["of_bound"])
            if pts:
                ax.semilogx(*zip(*pts), marker="o", ms=3, label=impl, color=f"C{k}")
        ax.set_title(f"{call} @ {rate}", fontsize=8)
        ax.set_ylim(0, 1.1)
        ax.set_xlabel("bytes per rank", fontsize=7)
        ax.set_ylabel("fraction of line rate", fontsize=7)
        ax.tick_params(labelsize=6)
        ax.grid(True, alpha=0.3)
    for extra in list(axes.flat)[len(panels):]:
        extra.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle("mpidist across two simulated nodes: fraction of the line-rate bound", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())

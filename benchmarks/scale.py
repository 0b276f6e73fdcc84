"""How mpidist's costs grow with the number of ranks, each against raw mpi4py in the same job.

One job per rank count, on one node or across the simulated cluster (network namespaces,
``tests/cluster/harness.py``: root, ``ip``; one rank per node, removed at the end)::

    python benchmarks/scale.py                         # 2, 4, 8, 16, 32 ranks on one node
    python benchmarks/scale.py --ranks 2,4,8 --rounds 11
    python benchmarks/scale.py --nodes 2,4,8           # 2, 4, 8 nodes of one rank each

Per job: ``init_process_group`` (against ``MPI_Comm_dup`` + the host-name ``allgather`` it
stands for), ``new_group`` of every rank (``MPI_Comm_create_group``), ``new_subgroups`` of two
(``MPI_Comm_split``), 8 B and 1 MiB ``all_reduce`` (``MPI_Allreduce``), ``all_gather_object``
(mpi4py's ``allgather``), a timeout's give-up (the last rank stays away from a call on a group
with a short timeout: the time until the others raise, the report's length and the notices each
rank sends: forced direct, forced through neighbours, and which of the two
``notices.DIRECT_UP_TO`` ships at that size) and the resident memory before and after
``import mpidist``. Writes
``results/scale.{txt,json,png}`` (``scale_nodes.*`` across nodes) and states each cost's
growth: the slope of log(time) against log(ranks), ~0 flat, 1 linear (on a machine with fewer
cores than ranks every time grows with the ranks; compare the ratio to raw). mpidist's and
mpi4py's forms of each call are timed in interleaved rounds (``suite.timing.interleave``: the
slowest rank's time per call, the median).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))

from suite.timing import interleave, python_loop  # noqa: E402

HERE = Path(__file__).resolve().parent
COSTS = ["init", "new_group", "new_subgroups", "all_reduce 8 B", "all_reduce 1 MiB", "all_gather_object"]


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(rounds: int, target: float, timeout_s: float) -> None:

    import numpy as np
    from mpi4py import MPI

    before = rss_mib()
    world = MPI.COMM_WORLD
    import mpidist as dist
    from mpidist.core import notices

    def timed(md: Callable[[], object], raw: Callable[[], object], n: int = 5) -> list[float]:
        """Seconds per call of mpidist's and raw mpi4py's form, interleaved: medians of ``n`` rounds."""
        out = interleave(world, {"md": python_loop(md, ()), "raw": python_loop(raw, ())}, n, target)
        return [float(np.median(out[k]["samples"])) for k in ("md", "raw")]

    res: dict[str, list[float]] = {}
    world.Barrier()
    t0 = time.perf_counter()
    dist.init_process_group()
    t_init = world.allreduce(time.perf_counter() - t0, op=MPI.MAX)

    def raw_init() -> None:
        c = world.Dup()
        c.allgather(MPI.Get_processor_name())
        c.Free()
    res["init"] = [t_init, timed(raw_init, raw_init, 3)[1]]
    res["new_group"] = timed(lambda: dist.destroy_process_group(dist.new_group()),
                             lambda: world.Create_group(world.Get_group()).Free(), 3)
    def subgroups() -> None:
        for sub in dist.new_subgroups(2)[1]:
            dist.destroy_process_group(sub)
    res["new_subgroups"] = timed(subgroups, lambda: world.Split(world.rank // 2).Free(), 3)
    comm = dist.group.WORLD.comm.Dup()
    for label, nbytes in (("all_reduce 8 B", 8), ("all_reduce 1 MiB", 1 << 20)):
        x, y = np.ones(nbytes // 8), np.empty(nbytes // 8)
        res[label] = timed(lambda x=x: dist.all_reduce(x), lambda x=x, y=y: comm.Allreduce(x, y), rounds)
    obj = {"rank": world.rank, "name": "x" * 32}
    res["all_gather_object"] = timed(lambda: dist.all_gather_object([None] * world.size, obj),
                                     lambda: comm.allgather(obj), rounds)
    direct_up_to, gave = notices.DIRECT_UP_TO, {}
    for how, up_to in (("direct", world.size), ("neighbours", 0)):
        notices.DIRECT_UP_TO = up_to  # the notices forced one way, then the other
        gave[how] = give_up(dist, world, timeout_s)
    notices.DIRECT_UP_TO = direct_up_to
    after = world.allreduce(rss_mib(), op=MPI.MAX)
    before = world.allreduce(before, op=MPI.MAX)
    if world.rank == 0:
        shipped = gave["direct" if world.size <= direct_up_to else "neighbours"]
        print(json.dumps({"ranks": world.size, "costs": res, **shipped, "timeout_s": timeout_s,
                          "notices_sent_direct": gave["direct"]["notices_sent_per_rank"],
                          "notices_sent_neighbours": gave["neighbours"]["notices_sent_per_rank"],
                          "give_up_s_neighbours": gave["neighbours"]["give_up_s"],
                          "report_chars_neighbours": gave["neighbours"]["report_chars"], "gave": gave,
                          "rss_mib": [after, before], "load": os.getloadavg()[0]}))
    comm.Free()
    dist.destroy_process_group()


def give_up(dist, world, timeout_s: float) -> dict:
    """The last rank stays away from an all_reduce on a group with a short timeout: the time
    until the others raise (slowest), the longest report, the notices sent (most by one rank,
    and the mean over the ranks that gave up)."""
    from datetime import timedelta

    import numpy as np
    from mpi4py import MPI

    from mpidist.core import notices

    g = dist.new_group(timeout=timedelta(seconds=timeout_s))
    report, took, sent = "", 0.0, 0
    if world.rank != world.size - 1:
        t0 = time.perf_counter()
        try:
            dist.all_reduce(np.ones(1), group=g)
        except dist.GroupTimeoutError as exc:
            report = str(exc)
        took = time.perf_counter() - t0
        sent = notices.LAST_GIVE_UP["messages"]
    world.Barrier()
    reports = world.gather(report)
    return {"give_up_s": world.allreduce(took, op=MPI.MAX),
            "report_chars": world.allreduce(len(report), op=MPI.MAX),
            "longest_report": max(reports or [""], key=len),
            "notices_sent_per_rank": world.allreduce(sent, op=MPI.MAX),
            "notices_sent_mean": world.allreduce(sent, op=MPI.SUM) / max(world.size - 1, 1)}


def slope(ns: list[int], ts: list[float]) -> float:
    """Least-squares slope of log(t) against log(n)."""
    xs, ys = [math.log(n) for n in ns], [math.log(max(t, 1e-9)) for t in ts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def _label(r: dict) -> str:
    return f"{r['nodes']} nodes" if r.get("nodes") else f"{r['ranks']} ranks"


def table(rows: list[dict]) -> str:
    ns = [r["ranks"] for r in rows]
    lines = ["cost (us, slowest rank's median)  " + "  ".join(f"{_label(r):>16}" for r in rows)
             + "  growth (slope; ratio's slope)"]
    for c in COSTS:
        md = [r["costs"][c][0] * 1e6 for r in rows]
        raw = [r["costs"][c][1] * 1e6 for r in rows]
        cells = "  ".join(f"{m:>8.0f}/{m / w:>5.2f}x" for m, w in zip(md, raw))
        ratios = [m / w for m, w in zip(md, raw)]
        grow = f"{slope(ns, md):.2f}; {slope(ns, ratios):.2f}" if len(ns) > 1 else "-"
        lines.append(f"{c:<33}  {cells}  {grow}")
    for key, fmt in (("give_up_s", "{:.2f} s"), ("report_chars", "{}"), ("notices_sent_per_rank", "{}"),
                     ("notices_sent_mean", "{:.1f}"), ("notices_sent_direct", "{}"),
                     ("notices_sent_neighbours", "{}"), ("give_up_s_neighbours", "{:.2f} s"),
                     ("report_chars_neighbours", "{}")):
        lines.append(f"{key:<33}  " + "  ".join(f"{fmt.format(r[key]):>16}" for r in rows))
    lines.append(f"{'RSS MiB (after / before import)':<33}  "
                 + "  ".join(f"{r['rss_mib'][0]:>8.0f}/{r['rss_mib'][1]:<7.0f}" for r in rows))
    lines.append("cells: mpidist / its ratio to raw mpi4py in the same job")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [r["ranks"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for c in COSTS:
        a.plot(ns, [r["costs"][c][0] * 1e6 for r in rows], marker="o", label=c)
        b.plot(ns, [r["costs"][c][0] / r["costs"][c][1] for r in rows], marker="o", label=c)
    b.plot(ns, [r["report_chars"] / rows[0]["report_chars"] for r in rows], "k--",
           label="report length (x first)")
    for ax, title in ((a, "mpidist, us"), (b, "mpidist / raw mpi4py")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("nodes (one rank each)" if rows[0].get("nodes") else "ranks (one node)")
        ax.set_title(title)
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def jobs(a: argparse.Namespace, worker_args: list[str]) -> Iterator[tuple[int, int, Callable]]:
    """(ranks, nodes or 0, run) of each job: ``run()`` is its ``CompletedProcess``."""
    env = {**os.environ, "MPIDIST_ABORT_ON_ERROR": "0"}
    if not a.nodes:
        mpiexec = str(Path(sys.executable).parent / "mpiexec")
        for n in map(int, a.ranks.split(",")):
            cmd = [mpiexec, "-n", str(n), sys.executable, __file__, *worker_args]
            yield n, 0, lambda cmd=cmd: subprocess.run(cmd, capture_output=True, text=True,
                                                       timeout=a.job_timeout, env=env)
        return
    sys.path.insert(0, str(HERE.parent / "tests"))
    from cluster import harness

    reason = harness.unavailable_reason()
    if reason:
        sys.exit(f"no simulated cluster here: {reason}")
    counts = [int(k) for k in a.nodes.split(",")]
    with harness.Cluster(max(counts)) as cluster:  # the first k nodes serve each job
        for k in counts:
            yield k, k, lambda k=k: cluster.run_mpi([1] * k, [__file__, *worker_args], timeout=a.job_timeout,
                                                    env={"MPIDIST_ABORT_ON_ERROR": "0"}, cwd=HERE.parent)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="2,4,8,16,32")
    ap.add_argument("--nodes", help="node counts of the simulated cluster, one rank each (not --ranks)")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds per call (the median)")
    ap.add_argument("--target", type=float, default=0.005, help="seconds per sample")
    ap.add_argument("--timeout-s", type=float, default=2.0, help="the give-up group's timeout")
    ap.add_argument("--job-timeout", type=float, default=600)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a.rounds, a.target, a.timeout_s)
    worker_args = ["--worker", "--rounds", str(a.rounds), "--target", str(a.target),
                   "--timeout-s", str(a.timeout_s)]
    rows = []
    for n, nodes, run in jobs(a, worker_args):
        proc = run()
        line = [s for s in proc.stdout.splitlines() if s.startswith("{")]
        where = f"{nodes} nodes" if nodes else f"{n} ranks"
        if proc.returncode or not line:
            sys.exit(f"{where} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        rows.append({**json.loads(line[-1]), "nodes": nodes})
        print(f"{where} done", flush=True)
    text = table(rows)
    print(text)
    name = "scale_nodes" if a.nodes else "scale"
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{name}.txt").write_text(text + "\n")
    (a.out / f"{name}.json").write_text(json.dumps(rows, indent=1))
    if not a.no_plot:
        plot(rows, a.out / f"{name}.png")


if __name__ == "__main__":
    main()

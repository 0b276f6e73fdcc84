"""pytest fixtures for the cluster tests: a 3-node cluster per test module, or a skip with the reason.

``MPIDIST_CLUSTER=0`` skips the cluster tests; ``MPIDIST_REQUIRE_CLUSTER=1`` (set by
``run_suite.py --cluster install|require`` where namespaces work) turns a skip into a failure.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import shm

from . import harness

ROOT = Path(__file__).resolve().parents[2]
#: A job that runs past this many seconds is killed (with every process on the nodes).
JOB_TIMEOUT = float(os.environ.get("MPIDIST_CLUSTER_JOB_TIMEOUT", "120"))


def skip_or_fail(reason: str) -> None:
    if os.environ.get("MPIDIST_REQUIRE_CLUSTER") == "1":
        pytest.fail(f"the cluster tests must run here but cannot: {reason}")
    pytest.skip(f"no simulated cluster: {reason}")


def start(nodes: int, **kw) -> harness.Cluster:
    if os.environ.get("MPIDIST_CLUSTER") == "0":
        pytest.skip("cluster tests switched off (MPIDIST_CLUSTER=0)")
    reason = harness.unavailable_reason()
    if reason:
        skip_or_fail(reason)
    try:
        return harness.Cluster(nodes, **kw).start()
    except harness.ClusterUnavailableError as exc:
        skip_or_fail(str(exc))
        raise


def job_env(**extra: str) -> dict[str, str]:
    """The jobs import this checkout's mpidist, and end the job when a rank fails."""
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    env.update(extra)
    return env


def run(cluster: harness.Cluster, layout: list[int], args: list[str], timeout: float = JOB_TIMEOUT,
        **env: str):
    """``mpiexec`` across ``cluster`` with ``layout`` ranks per node; the CompletedProcess."""
    proc = cluster.run_mpi(layout, args, timeout=timeout, env=job_env(**env), cwd=ROOT)
    sys.stdout.write(proc.stdout[-4000:])
    sys.stderr.write(proc.stderr[-4000:])
    return proc


def cluster_of(nodes: int, **kw):
    """Generator body for a fixture: ``yield from cluster_of(3)`` gives a started 3-node cluster.

    The segments that the ranks its tests kill leave in ``/dev/shm`` go with it (:mod:`shm`).
    """
    with shm.swept():
        c = start(nodes, **kw)
        try:
            yield c
        finally:
            c.stop()

"""Slurm across nodes: ``sbatch -N 2`` + ``mpiexec``, ``srun -N 2 --mpi=pmi2``, the main job on 2 nodes.

Serial tests on a simulated cluster (tests/cluster/) with one slurmd per node
(tests/cluster/slurm.py). They skip where namespaces or Slurm are not to be had
(``MPIDIST_REQUIRE_SLURM=1`` with namespaces working turns the Slurm skip into a failure).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from cluster import slurm as cslurm
from cluster.fixtures import ROOT, cluster_of, job_env

EPOCHS = 1
MIN_ACCURACY = 0.8
TIMEOUT = 240


@pytest.fixture(scope="module")
def slurm():
    if os.environ.get("MPIDIST_SLURM") == "0":
        pytest.skip("Slurm tests switched off (MPIDIST_SLURM=0)")
    for cluster in cluster_of(2):
        reason = cslurm.single.unavailable_reason()
        s = None
        if reason is None:
            try:
                s = cslurm.ClusterSlurm(cluster).start()
            except cslurm.single.SlurmUnavailableError as exc:
                reason = str(exc)
        if reason:
            if os.environ.get("MPIDIST_REQUIRE_SLURM") == "1":
                pytest.fail(f"Slurm is installed but the cluster Slurm is unusable: {reason}")
            pytest.skip(f"no Slurm on the simulated cluster: {reason}")
        try:
            yield s
        finally:
            s.stop()


def env_for(slurm) -> dict[str, str]:
    env = slurm.env()
    env.update(job_env())
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # the job's python and mpiexec
    env.pop("MPIDIST_ABORT_ON_ERROR", None)
    return env


def submit(slurm, script, *args, options=()):
    state, code, out = slurm.sbatch_job(script, *args, options=options, env=env_for(slurm), cwd=ROOT,
                                        timeout=TIMEOUT)
    assert (state, code) == ("COMPLETED", "0:0"), out
    return out


LAYOUT_CHECK = "tests/cluster/job_checks.py 2,1 node0,node1 layout"


def test_sbatch_2_nodes_with_mpiexec(slurm):
    wrap = f"mpiexec -n 3 python {LAYOUT_CHECK}; mpiexec -n 3 python -m mpidist info"
    out = submit(slurm, None, options=("-N", "2", "-n", "3", "--wrap", wrap))
    assert "LAYOUT OK MPICH/Hydra: 3 ranks as [2, 1]" in out, out
    assert re.search(r"^host node0:\s+2 rank\(s\): 0-1$", out, re.MULTILINE), out
    assert re.search(r"^host node1:\s+1 rank\(s\): 2$", out, re.MULTILINE), out


def test_srun_2_nodes_mpi_pmi2(slurm):
    wrap = f"srun --mpi=pmi2 python {LAYOUT_CHECK}"
    out = submit(slurm, None, options=("-N", "2", "-n", "3", "--wrap", wrap))
    assert "LAYOUT OK Slurm srun (PMI2): 3 ranks as [2, 1]" in out, out


def final(out: str) -> tuple[str, str]:
    m = re.search(r"^final: world_size=4 test_accuracy=([0-9.]+) params_sha256=(\w+)", out, re.MULTILINE)
    assert m, out
    return m.group(1), m.group(2)


def test_train_on_two_nodes_as_on_one(slurm):
    """examples/train.py as a 2-node batch job learns exactly as well as on one node."""
    script = ROOT / "examples" / "slurm" / "train.sbatch"
    args = ("--epochs", str(EPOCHS), "--no-progress")
    two = submit(slurm, script, *args, options=("-N", "2", "--ntasks=4", "--ntasks-per-node=2"))
    assert "4 tasks on node[0-1]" in two, two
    assert "4 ranks on 2 nodes" in two, two
    one = submit(slurm, script, *args, options=("-N", "1", "--ntasks=4", "-w", "node0"))
    assert "4 ranks on 1 node" in one, one
    (acc2, sha2), (acc1, sha1) = final(two), final(one)
    assert float(acc2) >= MIN_ACCURACY
    assert acc2 == acc1, (two, one)
    print(f"\ntrain.py {EPOCHS} epochs, 4 ranks: 2 nodes accuracy {acc2} (params {sha2[:12]}), "
          f"1 node {acc1} (params {sha1[:12]})")

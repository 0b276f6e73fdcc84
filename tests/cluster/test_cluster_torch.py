"""The torch backend across nodes: store with no MASTER_ADDR, DDP and FSDP2, a node-shaped DeviceMesh.

Serial tests on a simulated cluster (tests/cluster/) whose nodes do not resolve each
other's names: the store rank 0 starts must be advertised by address. Training runs twice on the same
per-rank data, once across nodes and once on one node; at two ranks the parameters must
be bitwise equal (a sum of two numbers has one rounding, whatever the path). The 4-rank
run (2 nodes x 2, with the mesh check) is in the full set (``make test-cluster``).
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from cluster.fixtures import cluster_of, run

FULL = os.environ.get("MPIDIST_CLUSTER_FULL") == "1"
TIMEOUT = 240  # torch's import is slow when the machine is busy


@pytest.fixture(scope="module")
def cluster2():
    # checked here, not at import: the MPI runs of the suite collect this file too
    pytest.importorskip("torch", reason="torch is not installed (pip install 'mpidist[torch]')")
    # nodes that cannot resolve each other's names (no DNS; own name at 127.0.1.1): the store
    # address rank 0 advertises must work anyway
    yield from cluster_of(2, resolve="self")


def trained(proc) -> dict[str, tuple[str, np.ndarray]]:
    assert proc.returncode == 0, f"job failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    out = {}
    for name, digest, sums in re.findall(r"^(DDP|FSDP2) (\w+) (.*)$", proc.stdout, re.MULTILINE):
        out[name] = (digest, np.array([float(x) for x in sums.split()]))
    assert set(out) == {"DDP", "FSDP2"}, proc.stdout
    return out


def test_ddp_fsdp2_across_nodes_equal_one_node(cluster2):
    """Two ranks on two nodes train exactly as two ranks on one node (store from MPI, no MASTER_ADDR)."""
    across = trained(run(cluster2, [1, 1], ["tests/cluster/job_torch.py", "1,1"], timeout=TIMEOUT))
    one = trained(run(cluster2, [2], ["tests/cluster/job_torch.py", "2"], timeout=TIMEOUT))
    assert across["DDP"][0] == one["DDP"][0], (across, one)
    assert across["FSDP2"][0] == one["FSDP2"][0], (across, one)


@pytest.mark.skipif(not FULL, reason="4-rank torch runs are in the full cluster set (make test-cluster)")
def test_device_mesh_rows_are_nodes_and_training_at_4(cluster2):
    """init_device_mesh('cpu', (2, 2)): dim 1 is a node's ranks; 2x2 DDP/FSDP2 match 4 ranks on one node."""
    across = trained(run(cluster2, [2, 2], ["tests/cluster/job_torch.py", "2,2"], timeout=TIMEOUT))
    one = trained(run(cluster2, [4], ["tests/cluster/job_torch.py", "4"], timeout=TIMEOUT))
    for name in ("DDP", "FSDP2"):
        # four summands: MPI may add them in another order across nodes, so the last bits may differ
        np.testing.assert_allclose(across[name][1], one[name][1], rtol=1e-6, atol=1e-6)

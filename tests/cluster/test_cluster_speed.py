"""Across nodes: 16-bit all_reduce word for word, the torch backend's overlap choice, fp16-compressed DDP.

Serial tests on a simulated two-node cluster (tests/cluster/). The job (tests/cluster/job_speed.py)
checks every 16-bit result against numpy (float32 in rank order, rounded once) on every rank, so
the word exchange is proven across a real TCP link; the torch group must see two nodes and pick
the across-nodes limit; DDP with ``fp16_compress_hook`` must give gloo's parameters bit for bit at
two ranks (a sum of two float16 values has one rounding either way).
"""

from __future__ import annotations

import re

import pytest

from cluster.fixtures import cluster_of, run

pytest.importorskip("torch", reason="torch is not installed (pip install 'mpidist[torch]')")
TIMEOUT = 240


@pytest.fixture(scope="module")
def cluster2():
    yield from cluster_of(2)


def fields(stdout: str, key: str, n: int) -> list[list[str]]:
    """The ``n`` words after each ``key`` (the ranks' lines may run together in mpiexec's output)."""
    words = r"\s+([0-9a-z]+?)" * (n - 1) + r"\s+([0-9a-z]+?)(?=\s|[A-Z]|$)"
    return [list(m) if n > 1 else [m] for m in re.findall(key + words, stdout)]


@pytest.mark.parametrize("layout", [[1, 1], [2, 1]], ids=["1+1", "2+1"])
def test_lowprec_and_ddp16_across_nodes(cluster2, layout):
    from mpidist.torch import overlap

    proc = run(cluster2, layout, ["tests/cluster/job_speed.py"], timeout=TIMEOUT)
    assert proc.returncode == 0, f"job failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    ranks = sum(layout)
    assert fields(proc.stdout, "NODES", 1) == [["2"]] * ranks
    assert fields(proc.stdout, "LOWPREC", 2) == [["ok", "12"]] * ranks
    assert fields(proc.stdout, "LIMIT", 1) == [[str(overlap.ACROSS_NODES)]] * ranks
    ddp = fields(proc.stdout, "DDP16", 2)
    assert len(ddp) == ranks and len({tuple(d) for d in ddp}) == 1  # the same on every rank
    if ranks == 2:
        assert ddp[0][0] == ddp[0][1], "fp16-compressed DDP across nodes differs from gloo's"

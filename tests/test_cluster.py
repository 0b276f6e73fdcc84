"""Jobs across the nodes of a simulated cluster (tests/cluster/): layout, info, every call.

Serial tests: each starts its own ``mpiexec`` across network-namespace nodes (see
``tests/cluster/harness.py``) under a timeout. Layouts include uneven ones (2 + 1,
1 + 2 + 1) at 2 and 3 nodes. They skip with the reason where namespaces cannot be made
(not root, no ``ip netns``).
"""

from __future__ import annotations

import json

import pytest
from cluster.fixtures import cluster_of, run

LAYOUTS = [[2, 1], [1, 2, 1]]


@pytest.fixture(scope="module")
def cluster3():
    yield from cluster_of(3)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: "+".join(map(str, lay)))
def test_every_call_across_nodes(cluster3, layout):
    """init_distributed_mode's layout, every collective/p2p/object call, subgroups, groupby, DETAIL."""
    hosts = ",".join(cluster3.names[:len(layout)])
    proc = run(cluster3, layout, ["tests/cluster/job_checks.py", ",".join(map(str, layout)), hosts])
    assert proc.returncode == 0, f"checks failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    assert "CHECKS: " in proc.stdout and " 0 failed" in proc.stdout, proc.stdout[-3000:]
    assert "FAIL" not in proc.stdout


def test_checks_catch_a_wrong_layout(cluster3):
    """The checks script is not vacuous: told the wrong layout, it reports the layout check failing."""
    proc = run(cluster3, [2, 1], ["tests/cluster/job_checks.py", "1,2", "node0,node1"])
    assert proc.returncode != 0
    assert "FAIL layout" in proc.stdout


def test_info_lists_every_host(cluster3):
    layout = [2, 1, 2]
    proc = run(cluster3, layout, ["-m", "mpidist", "info", "--json"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = json.loads(proc.stdout)
    assert facts["world_size"] == 5 and facts["num_nodes"] == 3
    assert facts["hosts"] == {"node0": [0, 1], "node1": [2], "node2": [3, 4]}
    assert not facts["problems"], facts["problems"]
    text = run(cluster3, layout, ["-m", "mpidist", "info"]).stdout
    assert "5 on 3 node(s)" in text
    for line in ("host node0:", "2 rank(s): 0-1", "host node1:", "1 rank(s): 2", "host node2:",
                 "2 rank(s): 3-4"):
        assert line in text, text

"""Jobs across the nodes of a simulated cluster (tests/cluster/): layout, info, every call.

Serial tests: each starts its own ``mpiexec`` across network-namespace nodes (see
``tests/cluster/harness.py``) under a timeout. Layouts include uneven ones (2 + 1,
1 + 2 + 1) at 2 and 3 nodes, and 2 + 2 for the even-node paths. They skip with the reason
where namespaces cannot be made (not root, no ``ip netns``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from cluster import harness
from cluster.fixtures import ROOT, cluster_of, run, start

LAYOUTS = [[2, 1], [1, 2, 1], [2, 2]]


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
    assert facts["network_env"] == {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}
    text = run(cluster3, layout, ["-m", "mpidist", "info"]).stdout
    assert "5 on 3 node(s)" in text
    assert "MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp" in text
    for line in ("host node0:", "2 rank(s): 0-1", "host node1:", "1 rank(s): 2", "host node2:",
                 "2 rank(s): 3-4"):
        assert line in text, text


def test_leftovers_of_a_killed_run_are_removed():
    """A process killed with its cluster up leaves namespaces, links and state; cleanup removes them."""
    start(1).stop()  # skips (or fails, where required) with the reason when namespaces cannot be made
    code = ("import sys, time; sys.path.insert(0, 'tests'); from cluster.harness import Cluster; "
            "c = Cluster(2).start(); print(c.id, flush=True); time.sleep(120)")
    owner = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        cid = int(owner.stdout.readline())
    finally:
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
    state = harness.STATE_ROOT / f"mpidist-cluster-{cid}"
    assert state.exists() and f"mdc{cid}-node1" in harness._netns_names()
    removed = harness.cleanup_stale()
    assert any(f"cluster {cid} " in r for r in removed), removed
    assert not state.exists()
    assert not [n for n in harness._netns_names() + harness._link_names() if n.startswith(f"mdc{cid}")]

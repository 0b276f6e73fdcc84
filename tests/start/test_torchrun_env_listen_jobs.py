"""What ``python -m mpidist.run`` listens on, seen from a real job: the script's store on loopback
only on one node, on one address of rank 0's node across nodes, and nothing on every interface.

Serial tests; each starts its own ``mpiexec`` through ``launcher`` (or across the simulated nodes
of ``tests/cluster``), under a timeout. Connections go only to this machine's own addresses.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from launcher import run_mpi
from listening import PRELUDE

pytest.importorskip("torch", reason="torch is not installed (pip install 'mpidist[torch]')")

#: A torchrun-style script: env:// rendezvous from the variables mpidist.run set.
SCRIPT = """
import json, os, socket, sys

import torch
import torch.distributed as tdist


torch.set_num_threads(1)
tdist.init_process_group("gloo")
rank = tdist.get_rank()
t = torch.ones(1)
tdist.all_reduce(t)
result = {"sum": t.item(), "listening": listening(os.getppid()), "host": socket.gethostname(),
          "env": {k: os.environ[k] for k in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")}}
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
tdist.barrier()
tdist.destroy_process_group()
"""

#: No torchrun variables: mpidist.run computes them from MPI.
NO_TORCH_VARS = {"MASTER_ADDR": "", "MASTER_PORT": "", "RANK": "", "WORLD_SIZE": "",
                 "TORCHELASTIC_USE_AGENT_STORE": ""}


def _results(folder: Path, n: int) -> list[dict]:
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(n)]


def _check(results: list[dict], store_address: str) -> None:
    first = results[0]
    port = int(first["env"]["MASTER_PORT"])
    for r, got in enumerate(results):
        assert got["sum"] == len(results), got
        assert got["env"] == first["env"], (r, got["env"], first["env"])
        assert got["env"]["TORCHELASTIC_USE_AGENT_STORE"] == "True", got["env"]
        # no process of the job listens on every interface (IPv4 0.0.0.0 or IPv6 [::])
        wide = [(a, p) for a, p in got["listening"] if a in ("0.0.0.0", "ipv6:" + "0" * 32)]
        assert not wide, (r, got["listening"])
    # the store: rank 0 alone serves it, on the one address, and no second server was started
    assert [a for a, p in first["listening"] if p == port] == [store_address], first["listening"]
    assert all(p != port for got in results[1:] for _, p in got["listening"]), results


def test_on_one_node_the_store_listens_on_loopback_only(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(PRELUDE + textwrap.dedent(SCRIPT))
    proc = run_mpi(2, ["-m", "mpidist.run", str(script), str(tmp_path)], timeout=240, env=NO_TORCH_VARS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = _results(tmp_path, 2)
    assert results[0]["env"]["MASTER_ADDR"] == "127.0.0.1", results[0]["env"]
    _check(results, "127.0.0.1")


@pytest.mark.parametrize("layout", [[1, 1], [1, 2]], ids=["1+1", "1+2"])
def test_across_nodes_the_store_listens_on_the_address_the_nodes_share(tmp_path, cluster2, layout):
    from cluster.fixtures import run

    script = tmp_path / "job.py"
    script.write_text(PRELUDE + textwrap.dedent(SCRIPT))
    # gloo itself would look for the other node by its name; MPI carries the data here
    args = ["-m", "mpidist.run", "--backend-for-cpu", "mpidist", str(script), str(tmp_path)]
    proc = run(cluster2, layout, args, timeout=240, **NO_TORCH_VARS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = _results(tmp_path, sum(layout))
    assert results[0]["env"]["MASTER_ADDR"] == cluster2.node(0).address, results[0]["env"]
    _check(results, cluster2.node(0).address)

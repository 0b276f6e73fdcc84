"""What the torch backend's store listens on, seen from a real job: loopback only on one node,
one address of rank 0's node across nodes, never every interface.

Serial tests; each starts its own ``mpiexec`` through ``launcher`` (or across the simulated
nodes of ``tests/cluster``), under a timeout. Connections go only to this machine's own
addresses.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from launcher import run_mpi
from listening import PRELUDE

pytest.importorskip("torch", reason="torch is not installed (pip install 'mpidist[torch]')")

JOB = """
import json, os, socket, sys

import torch
import torch.distributed as tdist

import mpidist.torch  # noqa: F401  (the backend and its rendezvous)
from mpidist.torch import netaddr


torch.set_num_threads(1)
tdist.init_process_group("mpidist")
rank, world = tdist.get_rank(), tdist.get_world_size()
store = tdist.distributed_c10d._get_default_store()
while hasattr(store, "underlying_store"):  # PrefixStore around the TCPStore
    store = store.underlying_store
store.set(f"host/{rank}", socket.gethostname())
result = {"hosts": [store.get(f"host/{r}").decode() for r in range(world)], "port": store.port}
if rank == 0:
    result["listening"] = [a for a, port in listening() if port == store.port]
    # every address of this host but the one the store is bound to must refuse
    others = ({"127.0.0.1"} | {str(iface.ip) for _, iface in netaddr.interfaces()}) - set(result["listening"])
    refused = {}
    for address in sorted(others):
        with socket.socket() as s:
            s.settimeout(5)
            refused[address] = s.connect_ex((address, store.port)) != 0
    result["refused"] = refused
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
tdist.barrier()
tdist.destroy_process_group()
"""

#: No MASTER_ADDR/MASTER_PORT (and no RANK/WORLD_SIZE): the rendezvous comes from MPI.
NO_TORCH_VARS = {"MASTER_ADDR": "", "MASTER_PORT": "", "RANK": "", "WORLD_SIZE": ""}


def _results(folder: Path, n: int) -> list[dict]:
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(n)]


def test_on_one_node_the_store_listens_on_loopback_only(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(PRELUDE + textwrap.dedent(JOB))
    proc = run_mpi(2, [str(script), str(tmp_path)], timeout=240, env=NO_TORCH_VARS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, second = _results(tmp_path, 2)
    assert first["hosts"] == second["hosts"] and first["port"] == second["port"]
    assert first["listening"] == ["127.0.0.1"], first  # not 0.0.0.0, and nothing on IPv6
    # the machine's own other addresses (where it has any) do not answer on the store's port
    assert all(first["refused"].values()), first["refused"]


@pytest.mark.parametrize("layout", [[1, 1], [1, 2]], ids=["1+1", "1+2"])
def test_across_nodes_the_store_listens_on_the_address_the_nodes_share(tmp_path, cluster2, layout):
    from cluster.fixtures import run

    script = tmp_path / "job.py"
    script.write_text(PRELUDE + textwrap.dedent(JOB))
    proc = run(cluster2, layout, [str(script), str(tmp_path)], timeout=240, **NO_TORCH_VARS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = _results(tmp_path, sum(layout))
    first = results[0]
    hosts = [n.name for n, k in zip(cluster2.nodes, layout) for _ in range(k)]
    assert all(r["hosts"] == hosts and r["port"] == first["port"] for r in results), results
    assert first["listening"] == [cluster2.node(0).address], first
    assert first["refused"].get("127.0.0.1") is True, first["refused"]
    assert all(first["refused"].values()), first["refused"]

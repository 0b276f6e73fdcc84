"""The torch backend across nodes, run by tests/cluster/test_cluster_torch.py (and on one node for reference).

    mpiexec ... python tests/cluster/job_torch.py 2,2

argv: the ranks per node, in node order (block placement, as hydra's ``-hosts a:2,b:2``).
No ``MASTER_ADDR``/``MASTER_PORT``: the rendezvous comes from MPI. The job checks the store
across nodes, a 2-D ``init_device_mesh`` whose rows are nodes (when the nodes hold equal
numbers of ranks), then trains a small model a few steps with DDP and with FSDP2 on
per-rank data that depends only on the rank, and prints on rank 0::

    DDP <sha256 of the final parameters> <sum of each parameter>...
    FSDP2 <sha256 of the final full parameters> <sum of each parameter>...

so a run on one node and a run across nodes can be compared. Any failed check raises, and
the uncaught exception ends the job with a non-zero status.
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

import mpidist.torch  # noqa: F401  (registers the "mpidist" backend)

STEPS = 3


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 64)
        self.b = torch.nn.Linear(64, 4)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def batches(rank: int):
    gen = torch.Generator().manual_seed(1000 + rank)
    for _ in range(STEPS):
        yield torch.randn(8, 16, generator=gen), torch.randint(0, 4, (8,), generator=gen)


def digest(tensors) -> str:
    """sha256 of the parameters' bytes, then each parameter's sum (to compare within a tolerance)."""
    h = hashlib.sha256()
    sums = []
    for t in tensors:
        a = t.detach().contiguous().numpy()
        h.update(a.tobytes())
        sums.append(repr(float(a.astype(np.float64).sum())))
    return f"{h.hexdigest()[:32]} {' '.join(sums)}"


def train_ddp(rank: int) -> str:
    torch.manual_seed(7)
    model = torch.nn.parallel.DistributedDataParallel(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches(rank):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return digest(model.module.parameters())


def train_fsdp2(rank: int) -> str:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(7)
    model = Net()
    fully_shard(model.a)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches(rank):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return digest(p.full_tensor() for p in model.parameters())


def check_store(rank: int, world: int) -> None:
    from torch.distributed.distributed_c10d import _get_default_store

    store = _get_default_store()
    store.set(f"host/{rank}", socket.gethostname())
    got = [store.get(f"host/{r}").decode() for r in range(world)]
    want = MPI.COMM_WORLD.allgather(socket.gethostname())
    assert got == want, f"store across nodes: {got} != {want}"


def check_mesh(layout: list[int], rank: int) -> None:
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    import mpidist

    grid = np.arange(sum(layout)).reshape(len(layout), layout[0])
    row, col = np.argwhere(grid == rank)[0]
    mesh = init_device_mesh("cpu", (len(layout), layout[0]), mesh_dim_names=("inter", "intra"))
    # dimension 1 runs within a node (a row: this node's ranks), dimension 0 across nodes
    intra = dist.get_process_group_ranks(mesh.get_group("intra"))
    inter = dist.get_process_group_ranks(mesh.get_group("inter"))
    node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    node_members = node.allgather(rank)
    node.Free()
    assert intra == grid[row].tolist() == node_members, f"mesh row {intra} != node ranks {node_members}"
    assert inter == grid[:, col].tolist(), f"mesh column {inter} != {grid[:, col].tolist()}"
    t = torch.full((2,), float(rank))
    dist.all_reduce(t, group=mesh.get_group("intra"))
    assert t.tolist() == [float(sum(node_members))] * 2, t
    # a mesh from mpidist's topology is right wherever the launcher placed the ranks
    if not mpidist.is_initialized():
        mpidist.init_process_group("mpi")
    rows = mpidist.node_mesh()
    assert rows == grid.tolist(), rows
    mesh2 = DeviceMesh("cpu", torch.tensor(rows), mesh_dim_names=("node", "local"))
    assert dist.get_process_group_ranks(mesh2.get_group("local")) == node_members


def main() -> int:
    assert "MASTER_ADDR" not in os.environ and "MASTER_PORT" not in os.environ
    layout = [int(x) for x in sys.argv[1].split(",")]
    dist.init_process_group("mpidist")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == sum(layout)
    check_store(rank, world)
    if len(layout) > 1 and len(set(layout)) == 1:
        check_mesh(layout, rank)
    ddp = train_ddp(rank)
    fsdp = train_fsdp2(rank)
    if rank == 0:
        print(f"DDP {ddp}\nFSDP2 {fsdp}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The torch backend's blocking-or-overlap choice, and DDP's fp16 compression hook on mpidist.

The choice (``mpidist.torch.overlap``) comes from the nodes a group spans; here every rank is on
one node, so the one-node limit applies unless ``MPIDIST_TORCH_SYNC_BYTES`` says otherwise
(the two-node choice is exercised by benchmarks/network.py on the namespace cluster). The
fp16 hook runs with both choices forced, against gloo with the same hook.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'mpidist[torch]')")
tdist = pytest.importorskip("torch.distributed", reason="torch.distributed is not available")
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402

from mpidist.core import topology  # noqa: E402
from mpidist.torch import backend, overlap  # noqa: E402

nn = torch.nn
DDP = torch.nn.parallel.DistributedDataParallel
_gloo: dict = {}


def test_choice_from_nodes_and_env(monkeypatch):
    assert overlap.choose(1) == overlap.ONE_NODE
    assert overlap.choose(1, shared_cores=True) == overlap.ACROSS_NODES  # waits must not spin
    assert overlap.choose(2) == overlap.choose(5) == overlap.ACROSS_NODES
    assert overlap.ACROSS_NODES < overlap.ONE_NODE
    monkeypatch.delenv("MPIDIST_TORCH_SYNC_BYTES", raising=False)
    assert overlap.from_env() is None
    monkeypatch.setenv("MPIDIST_TORCH_SYNC_BYTES", "0")
    assert overlap.from_env() == 0
    monkeypatch.setenv("MPIDIST_TORCH_SYNC_BYTES", "12345")
    assert overlap.from_env() == 12345


@pytest.mark.mpi
def test_one_node_group_blocks_up_to_the_one_node_limit(tw):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD.Dup()
    try:
        assert topology.node_count(comm) == 1  # every test rank shares this machine
        # the node's ranks (each MPI_COMM_TYPE_SHARED peer) with torch's threads spread over each
        # one's real CPU mask (the launcher may have pinned them): does a core carry more than one?
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        masks = local.allgather(os.sched_getaffinity(0))
        local.Free()
        n = comm.allreduce(torch.get_num_threads(), op=MPI.MAX)  # the most any rank runs
        shared = max(sum(n / len(m) for m in masks if c in m) for c in set().union(*masks)) > 1 + 1e-9
        assert overlap.shared_cores(n) == shared
        assert overlap.sync_bytes(comm, None) == (overlap.ACROSS_NODES if shared else overlap.ONE_NODE)
        assert overlap.sync_bytes(comm, 0) == 0
    finally:
        comm.Free()


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 64)
        self.b = nn.Linear(64, 8)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def _train(group, rank, hook: bool, steps: int = 4):
    torch.manual_seed(99)
    model = DDP(Net(), process_group=group, bucket_cap_mb=0.002)  # several buckets
    if hook:
        model.register_comm_hook(group, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(10 + rank)
    for _ in range(steps):
        opt.zero_grad()
        x, y = torch.randn(12, 16, generator=gen), torch.randn(12, 8, generator=gen)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.module.parameters()]


@pytest.mark.mpi
@pytest.mark.parametrize("limit", [0, None], ids=["overlapped", "auto"])
def test_fp16_compress_hook_matches_gloo(tw, limit, monkeypatch):
    monkeypatch.setattr(backend, "SYNC_BYTES", limit)
    rank, size = tw.get_rank(), tw.get_world_size()
    mine = tw.new_group(list(range(size)))  # the limit is read when a group is made, not later
    from mpi4py import MPI

    most = mine.mpi_group.comm.allreduce(torch.get_num_threads(), op=MPI.MAX)
    assert mine._sync_limit == (overlap.choose(1, overlap.shared_cores(most)) if limit is None else limit)
    if "g" not in _gloo:
        _gloo["g"] = tw.new_group(backend="gloo")
    ours = _train(mine, rank, hook=True)
    theirs = _train(_gloo["g"], rank, hook=True)
    plain = _train(mine, rank, hook=False)
    for a, b, c in zip(ours, theirs, plain):
        if size <= 2:  # a sum of two float16 values: one rounding either way
            assert torch.equal(a, b), "fp16-compressed DDP differs from gloo's"
        else:
            torch.testing.assert_close(a, b, rtol=2e-3, atol=2e-4)
        torch.testing.assert_close(a, c, rtol=5e-2, atol=5e-3)  # compression only rounds
    flat = torch.cat([p.flatten() for p in ours]).numpy()
    everyone = [None] * size
    tw.all_gather_object(everyone, flat)
    for other in everyone:
        np.testing.assert_array_equal(other, flat)

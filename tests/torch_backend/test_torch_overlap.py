"""The torch backend's blocking-or-overlap choice, and DDP's fp16 compression hook on mpidist.

The choice (``mpidist.torch.overlap``) comes from the nodes a group spans; here every rank is on
one node, so the one-node limit applies unless ``MPIDIST_TORCH_SYNC_BYTES`` says otherwise
(the two-node choice is exercised by benchmarks/network.py on the namespace cluster). The
fp16 hook runs with both choices forced, against gloo with the same hook.
"""

from __future__ import annotations

import time

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
        assert overlap.sync_bytes(comm, None) == overlap.ONE_NODE
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
    assert mine._sync_limit == (overlap.ONE_NODE if limit is None else limit)
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


@pytest.mark.mpi(min_size=2)
def test_overlapped_work_wakes_on_the_bell(tw, monkeypatch):
    """Overlapped work on a one-node group counts this rank in the node's bell until it
    completes, and the progress thread sleeps on the bell: the last rank's arrival, 1 s late,
    wakes it at once, though its pauses are set to 0.3 s, doubling (without the bell it would
    sleep on to 2.1 s, the end of its third pause). The sum is checked against numpy."""
    from mpidist.checks import signature
    from mpidist.core import bell
    from mpidist.torch import progress

    if not bell.on():
        pytest.skip(f"no bell on this node: {bell.why_not or 'MPIDIST_BELL=0'}")
    monkeypatch.setattr(backend, "SYNC_BYTES", 0)  # every asynchronous call overlaps
    monkeypatch.setattr(progress, "MAX_PAUSE", 5.0)
    monkeypatch.setattr(progress, "FIRST_PAUSE", 0.3)
    rank, size = tw.get_rank(), tw.get_world_size()
    g = tw.new_group(list(range(size)))
    me = 1 << rank  # every rank of the test runs on this node: its local rank is its rank
    for _ in range(signature.FIRST):  # past the calls the default check blocks on (every one of
        tw.all_reduce(torch.ones(1), group=g)  # the first 8; the 9th to the 39th are not checked)
    t = torch.full((5,), float(rank + 1))
    tw.barrier()
    late = rank == size - 1
    if late:
        time.sleep(1.0)
    arrived = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the node
    work = tw.all_reduce(t, group=g, async_op=True)
    counted = bell.all_in(me) if not late else True
    work.get_future().wait()  # completed by the progress thread alone
    done = time.monotonic()
    left = not bell.all_in(me)
    times = [None] * size
    tw.all_gather_object(times, (arrived, done, counted, left))
    bad = [f"rank {r}: not counted in while pending" for r, (_, _, c, _) in enumerate(times) if not c]
    bad += [f"rank {r}: still counted in after completion" for r, (*_, x) in enumerate(times) if not x]
    last = times[-1][0]
    bad += [f"rank {r}: done {d - last:.3f} s after the last arrival" for r, (_, d, _, _) in enumerate(times)
            if d - last > 0.15]
    assert not bad, bad
    np.testing.assert_allclose(t.numpy(), np.full(5, size * (size + 1) / 2))
    tw.destroy_process_group(g)

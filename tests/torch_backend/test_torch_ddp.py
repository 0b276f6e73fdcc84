"""DistributedDataParallel on the ``mpidist`` backend against torch's own gloo, same seeds.

MPI tests train a small model for a few steps twice, once with DDP over the mpidist
default group and once over a gloo group of the same ranks, and compare parameters
(bitwise at 2 ranks, where a sum of two numbers has one rounding; allclose at 3-4).
The jobs of the torch backend's own (plain ``init_process_group("mpidist")``, a rank that
disagrees with MPI, an uncaught exception that must abort the job) are in
``test_torch_ddp_jobs.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'mpidist[torch]')")
tdist = pytest.importorskip("torch.distributed", reason="torch.distributed is not available")
nn = torch.nn
DDP = torch.nn.parallel.DistributedDataParallel

_gloo = {}


@pytest.fixture
def gloo_group(tw):
    """A gloo group over every rank (created once; every rank calls new_group)."""
    if "g" not in _gloo:
        _gloo["g"] = tw.new_group(backend="gloo")
    return _gloo["g"]


class Net(nn.Module):
    def __init__(self, unused: bool = False) -> None:
        super().__init__()
        self.a = nn.Linear(8, 32)
        self.b = nn.Linear(32, 4)
        self.spare = nn.Linear(32, 4) if unused else None

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def _train(group, rank, steps=4, no_sync=False, **ddp_kw):
    torch.manual_seed(1234)
    model = DDP(Net(unused=ddp_kw.get("find_unused_parameters", False)), process_group=group, **ddp_kw)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        opt.zero_grad()
        if no_sync:
            with model.no_sync():
                x, y = torch.randn(6, 8, generator=gen), torch.randn(6, 4, generator=gen)
                nn.functional.mse_loss(model(x), y).backward()
        x, y = torch.randn(6, 8, generator=gen), torch.randn(6, 4, generator=gen)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.module.parameters()]


OPTIONS = {
    "default": {},
    "no_sync": {"no_sync": True},
    "gradient_as_bucket_view": {"gradient_as_bucket_view": True},
    "find_unused_parameters": {"find_unused_parameters": True},
    "small_buckets": {"bucket_cap_mb": 0.0005},
}


@pytest.mark.mpi
@pytest.mark.parametrize("name", list(OPTIONS))
def test_ddp_matches_gloo(tw, gloo_group, name):
    rank, size = tw.get_rank(), tw.get_world_size()
    ours = _train(None, rank, **OPTIONS[name])
    theirs = _train(gloo_group, rank, **OPTIONS[name])
    for a, b in zip(ours, theirs):
        if size <= 2:
            assert torch.equal(a, b), f"{name}: parameters differ from gloo's"
        else:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # every rank holds the same parameters
    flat = torch.cat([p.flatten() for p in ours]).numpy()
    everyone = [None] * size
    tw.all_gather_object(everyone, flat)
    for other in everyone:
        np.testing.assert_array_equal(other, flat)
    # and training changed them (the test can fail)
    torch.manual_seed(1234)
    start = torch.cat([p.detach().flatten() for p in Net().parameters()]).numpy()
    assert not np.array_equal(start, flat)


@pytest.mark.mpi(min_size=2)
def test_ddp_averages_gradients(tw):
    """One step by hand: DDP's gradient equals the mean of every rank's local gradient."""
    rank, size = tw.get_rank(), tw.get_world_size()
    torch.manual_seed(7)
    local = Net()
    model = DDP(Net(), process_group=None)
    model.module.load_state_dict(local.state_dict())
    grads = []
    for r in range(size):
        gen = torch.Generator().manual_seed(r)
        x, y = torch.randn(5, 8, generator=gen), torch.randn(5, 4, generator=gen)
        local.zero_grad()
        nn.functional.mse_loss(local(x), y).backward()
        grads.append([p.grad.clone() for p in local.parameters()])
        if r == rank:
            mine = (x, y)
    nn.functional.mse_loss(model(mine[0]), mine[1]).backward()
    for i, p in enumerate(model.module.parameters()):
        want = sum(g[i] for g in grads) / size
        torch.testing.assert_close(p.grad, want, rtol=1e-5, atol=1e-7)

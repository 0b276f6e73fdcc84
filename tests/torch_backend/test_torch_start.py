"""``init_distributed_mode`` in a torch program starts torch.distributed too; without torch, as before.

The MPI tests run under ``mpiexec -n N pytest --only-mpi``; the serial one starts its own job.
"""

from __future__ import annotations

import argparse

import numpy as np
import pytest
from helpers import gathered, still_works
from launcher import run_mpi

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'mpidist[torch]')")
import torch.distributed as tdist  # noqa: E402


def _expected_backend(dist, info) -> str:
    """nccl when every rank has a CUDA device of its own, else mpidist (computed here, apart)."""
    own = info.device.startswith("cuda") and tdist.is_nccl_available() \
        and info.local_world_size <= torch.cuda.device_count()
    return "nccl" if all(gathered(dist, own)) else "mpidist"


@pytest.mark.mpi
def test_opting_out_leaves_torch_distributed_alone(dist):
    before = tdist.is_initialized()
    ns = argparse.Namespace()
    dist.init_distributed_mode(ns, quiet_non_master=False, torch_distributed=False)
    assert ns.dist_backend == "mpi" and tdist.is_initialized() == before


@pytest.mark.mpi
def test_init_distributed_mode_starts_torch_distributed(dist, rank, size):
    ns = argparse.Namespace()
    info = dist.init_distributed_mode(ns, quiet_non_master=False)
    want = _expected_backend(dist, info)
    assert tdist.is_initialized()
    assert ns.dist_backend == want == str(tdist.get_backend())
    assert (tdist.get_rank(), tdist.get_world_size()) == (rank, size) == (ns.rank, ns.world_size)
    mine = np.random.default_rng(rank).uniform(size=5)
    t = torch.tensor(mine, device=info.device)
    tdist.all_reduce(t)  # torch's group
    np.testing.assert_allclose(t.cpu().numpy(), np.sum(gathered(dist, mine), axis=0))
    still_works(dist, size)  # and mpidist's world alongside


@pytest.mark.mpi
def test_a_second_call_reuses_torch_distributed(dist, rank, size):
    first, second = argparse.Namespace(), argparse.Namespace()
    dist.init_distributed_mode(first, quiet_non_master=False)
    group = tdist.group.WORLD
    dist.init_distributed_mode(second, quiet_non_master=False)
    assert second.dist_backend == first.dist_backend and tdist.group.WORLD is group
    assert gathered(dist, second.dist_backend) == [first.dist_backend] * size


NO_TORCH = """
import argparse, sys, mpidist
ns = argparse.Namespace()
info = mpidist.init_distributed_mode(ns, quiet_non_master=False)
print("RESULT", info.rank, ns.dist_backend, "torch" in sys.modules, flush=True)
"""


def test_without_torch_it_behaves_as_before():
    r = run_mpi(2, ["-c", NO_TORCH], timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(r.stdout.split("\n")[:-1]) == ["RESULT 0 mpi False", "RESULT 1 mpi False"], r.stdout

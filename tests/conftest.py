"""Shared fixtures. MPI tests (``@pytest.mark.mpi``) run under ``mpiexec -n N pytest --only-mpi``;
the other tests run once, serially, and start their own ``mpiexec`` jobs through ``launcher``.
"""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def dist():
    """mpidist with the default group initialised (and left initialised for the next test)."""
    import mpidist

    if not mpidist.is_initialized():
        mpidist.init_process_group("mpi", abort_on_error=False)
    yield mpidist
    # a test that fails between two collectives can leave a peer waiting; that ends in
    # the runner's timeout, never a silent pass.


@pytest.fixture
def rank(dist) -> int:
    return dist.get_rank()


@pytest.fixture
def size(dist) -> int:
    return dist.get_world_size()


def gathered(dist, value):
    """Every rank's ``value`` (any picklable object), in rank order, on every rank."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def still_works(dist, size: int) -> None:
    """After an error, the runtime must still work: one all_reduce across the world."""
    t = np.ones(1)
    dist.all_reduce(t)
    assert t[0] == size


def rank_data(rank: int, shape, dtype, seed: int = 0) -> np.ndarray:
    """Deterministic per-rank input: any rank can rebuild any other rank's array."""
    rng = np.random.default_rng(seed * 1000 + rank)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.kind in "iu":
        return rng.integers(1, 7, size=shape).astype(dtype)
    if dtype.kind == "c":
        return (rng.uniform(0.5, 2, size=shape) + 1j * rng.uniform(0.5, 2, size=shape)).astype(dtype)
    return rng.uniform(0.5, 2, size=shape).astype(dtype)


@pytest.fixture
def tw():
    """torch.distributed with its default group on the mpidist backend (initialised once per process)."""
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'mpidist[torch]')")
    import torch.distributed as tdist

    import mpidist.torch  # noqa: F401  (registers the backend)

    if not tdist.is_initialized():
        torch.set_num_threads(1)
        tdist.init_process_group("mpidist")
    return tdist

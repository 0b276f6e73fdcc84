"""Shared fixtures only; the helper functions tests import live in ``helpers.py``.

MPI tests (``@pytest.mark.mpi``) run under ``mpiexec -n N pytest --only-mpi``; the other tests
run once, serially, and those that start their own ``mpiexec`` jobs through ``launcher`` live in
files of their own.
"""

from __future__ import annotations

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


@pytest.fixture(scope="session")
def torchrun_results():
    """The examples under torchrun with torch's own gloo: the reference of test_run_module.py and
    test_slurm_run.py, run once per session (a fixture imported into two test modules would run
    once in each: about 25 s more)."""
    from test_run_module import DETR_STYLE, TORCHRUN_STYLE, torchrun

    return {"torchrun_style": torchrun(TORCHRUN_STYLE, "--epochs", "2"),
            "detr_style": torchrun(DETR_STYLE, "--epochs", "2")}

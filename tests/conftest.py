"""Shared fixtures only; the helper functions tests import live in ``helpers.py``.

MPI tests (``@pytest.mark.mpi``) run under ``mpiexec -n N pytest --only-mpi``; the other tests
run once, serially, and those that start their own ``mpiexec`` jobs through ``launcher`` live in
files of their own.
"""

from __future__ import annotations

import os
import sys

import pytest


def pytest_unconfigure(config):
    """pytest's own process, where it initialised MPI without ``mpiexec`` (a singleton), removes
    its shared-memory segment: Open MPI 5.0.11 leaves it even when it finalizes (``shm.py``)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and "PMIX_RANK" not in os.environ and "PMI_RANK" not in os.environ:
        import shm

        shm.unlink_own()


def pytest_runtest_logreport(report):
    """Under ``mpiexec``, a failing test is named at once, in the form of pytest's summary line.

    pytest prints failures at the end of the session, and a rank that fails between two
    collectives can leave its peers waiting until the runner's timeout kills the job before any
    rank gets there (``run_suite.py`` then repeats these lines and where each rank hung).
    """
    rank = os.environ.get("PMI_RANK") or os.environ.get("PMIX_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK")
    if rank is None or not report.failed:
        return
    crash = getattr(report.longrepr, "reprcrash", None)
    why = crash.message.splitlines()[0] if crash is not None and crash.message else report.when
    sys.stderr.write(f"\nFAILED {report.nodeid} on rank {rank} ({report.when}) - {why}\n")
    sys.stderr.flush()


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

    if tdist.is_initialized() and _torch_world_freed(tdist):
        # a test of mpidist's own destroy_process_group() freed every group, the torch
        # backend's too (start/test_world.py runs before torch_backend/): start torch again
        tdist.destroy_process_group()
    if not tdist.is_initialized():
        torch.set_num_threads(1)
        tdist.init_process_group("mpidist")
    return tdist


def _torch_world_freed(tdist) -> bool:
    group = getattr(tdist.group.WORLD, "mpi_group", None)  # the backend is torch's group itself
    return group is not None and group.comm is None


@pytest.fixture(scope="session")
def torchrun_results():
    """The examples under torchrun with torch's own gloo: the reference of test_run_module.py and
    test_slurm_run.py, run once per session (a fixture imported into two test modules would run
    once in each: about 25 s more)."""
    from torch_scripts import DETR_STYLE, TORCHRUN_STYLE, torchrun

    return {"torchrun_style": torchrun(TORCHRUN_STYLE, "--epochs", "2"),
            "detr_style": torchrun(DETR_STYLE, "--epochs", "2")}


@pytest.fixture(scope="module")
def dump_script(tmp_path_factory):
    """A script that writes its rank's environment, argv and ``__name__`` to ``$DUMP_DIR`` as JSON."""
    from torch_scripts import DUMP

    path = tmp_path_factory.mktemp("run") / "dump_env.py"
    path.write_text(DUMP)
    return path


@pytest.fixture(scope="session")
def lightning_gloo(tmp_path_factory):
    """examples/lightning_ddp.py as Lightning runs it without mpidist (its own MPIEnvironment, torch's
    gloo) at 2 ranks: the reference of integrations/test_libraries_jobs.py and
    slurm/test_slurm_libraries.py."""
    from libraries import LIGHTNING, OFFLINE, need, records
    from torch_scripts import mpi

    need("lightning")
    where = tmp_path_factory.mktemp("lightning-gloo")
    r = mpi(2, [LIGHTNING, "--backend", "gloo", "--environment", "lightning", "--record", str(where)],
            env=OFFLINE, timeout=300)
    assert r.returncode == 0, r.stderr[-5000:]
    return records(where, 2)


@pytest.fixture(scope="module")
def cluster2():
    """Two namespace nodes that cannot resolve each other's names: a service must be found by
    address (tests/cluster/fixtures.py)."""
    from cluster.fixtures import cluster_of

    yield from cluster_of(2, resolve="self")

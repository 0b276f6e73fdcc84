"""init_distributed_mode, launcher detection, rank-0 printing.

The singleton trap (plain ``python`` processes) is in ``test_launcher_jobs.py``.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import socket
import sys

import pytest
from helpers import gathered
from launcher import LAUNCHER_VARS

from mpidist.start import launcher, printing
from mpidist.training import distributed_mode


@pytest.mark.mpi
def test_init_distributed_mode_layout_matches_hosts(dist, rank, size):
    ns = argparse.Namespace()
    info = dist.init_distributed_mode(ns, quiet_non_master=False)
    hosts = gathered(dist, socket.gethostname())
    mine = [r for r, h in enumerate(hosts) if h == hosts[rank]]
    firsts = sorted({h: hosts.index(h) for h in hosts}.values())
    assert (info.rank, info.world_size) == (rank, size)
    assert (info.local_rank, info.local_world_size) == (mine.index(rank), len(mine))
    assert (info.node_rank, info.num_nodes) == (firsts.index(hosts.index(hosts[rank])), len(firsts))
    assert (ns.rank, ns.world_size, ns.distributed) == (rank, size, size > 1)
    # a torch program (torch imported) gets torch.distributed too: tests/torch_backend/test_torch_start.py
    assert ns.dist_backend == "mpi" or "torch" in sys.modules and ns.dist_backend in ("mpidist", "nccl")
    assert info.device == "cpu" and ns.gpu is None or info.device == f"cuda:{ns.gpu}"
    if "MPI_LOCALRANKID" in os.environ:  # hydra's own claim agrees with MPI's
        assert info.launcher in (launcher.HYDRA, launcher.INTEL_MPI)
        assert int(os.environ["MPI_LOCALRANKID"]) == info.local_rank
    assert len(set(gathered(dist, info.launcher))) == 1


@pytest.mark.mpi
def test_init_distributed_mode_quiets_other_ranks(dist, rank, capsys):
    try:
        dist.init_distributed_mode()
        print("plain")
        print("forced", force=True)
    finally:
        printing.restore()
    out = capsys.readouterr().out
    assert out.count("forced") == 1
    assert out.count("plain") == (1 if rank == 0 else 0)


@pytest.mark.parametrize("env, want", [
    ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}, launcher.OPEN_MPI),
    ({"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0"}, launcher.HYDRA),
    ({"SLURM_STEP_ID": "0", "PMI_FD": "5", "PMI_RANK": "1", "SLURM_LOCALID": "1"}, launcher.SLURM),
    ({"SLURM_STEP_ID": "0", "PMI_RANK": "0", "MPI_LOCALRANKID": "0"}, launcher.HYDRA),  # sbatch + mpiexec
    ({"LOCAL_RANK": "0", "WORLD_SIZE": "2", "RANK": "0"}, launcher.TORCHRUN),
    ({"TORCHELASTIC_RUN_ID": "x"}, launcher.TORCHRUN),
    ({}, launcher.SINGLETON),
])
def test_detect_launcher(monkeypatch, env, want):
    for k in list(os.environ):
        if k.startswith(LAUNCHER_VARS):
            monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert launcher.detect_launcher(size=1) == want


def test_crosscheck_names_a_disagreeing_variable(monkeypatch):
    monkeypatch.setenv("MPI_LOCALRANKID", "3")
    note = launcher.crosscheck(launcher.HYDRA, 1)
    assert note is not None and "$MPI_LOCALRANKID=3" in note and "local rank 1" in note
    assert launcher.crosscheck(launcher.HYDRA, 3) is None
    assert launcher.crosscheck(launcher.SINGLETON, 1) is None


def test_select_device_is_cpu_without_a_gpu():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        assert distributed_mode.select_device(5, set_device=False) == f"cuda:{5 % torch.cuda.device_count()}"
    else:
        assert distributed_mode.select_device(5) == "cpu"


def test_bad_backend_is_refused():
    import mpidist

    with pytest.raises(ValueError, match="init_distributed_mode: rank 0: backend 'nccl'"):
        mpidist.init_distributed_mode(backend="nccl")


def test_print_quieting_and_restore(capsys):
    try:
        printing.setup_for_distributed(False)
        print("hidden")
        print("shown", force=True)
        printing.setup_for_distributed(True)
        print("master")
    finally:
        printing.restore()
    print("after")
    assert capsys.readouterr().out.split() == ["shown", "master", "after"]


def test_logging_prefix_and_restore():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logging.getLogger("mpidist-test-prefix")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        printing.prefix_logging(3)
        log.info("hello %s", "world")
        printing.restore()
        log.info("plain")
    finally:
        printing.restore()
        log.removeHandler(handler)
    assert stream.getvalue().splitlines() == ["INFO [rank 3] hello world", "INFO plain"]

"""init_distributed_mode, launcher detection, the singleton trap, rank-0 printing."""

from __future__ import annotations

import argparse
import io
import logging
import os
import socket
import subprocess
import sys

import pytest
from conftest import gathered
from launcher import ROOT

from mpidist import launch, printing

# Variables a launcher sets; a plain `python` must start without them.
_LAUNCHER_VARS = ("PMI_", "PMIX_", "HYDI_", "HYDRA_", "MPI_LOCAL", "OMPI_", "PRTE_", "SLURM_",
                  "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID")


def _plain_python(code: str, extra: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_VARS)}
    env.update(extra)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=str(ROOT))


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
    # a torch program (torch imported) gets torch.distributed too: tests/test_torch_start.py
    assert ns.dist_backend == "mpi" or "torch" in sys.modules and ns.dist_backend in ("mpidist", "nccl")
    assert info.device == "cpu" and ns.gpu is None or info.device == f"cuda:{ns.gpu}"
    if "MPI_LOCALRANKID" in os.environ:  # hydra's own claim agrees with MPI's
        assert info.launcher in (launch.HYDRA, launch.INTEL_MPI)
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


@pytest.mark.parametrize("var", ["SLURM_STEP_NUM_TASKS", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"])
@pytest.mark.parametrize("how", ["import mpidist; mpidist.init_process_group('mpi')",
                                 "import mpidist; mpidist.init_distributed_mode()"])
def test_singleton_trap(var, how):
    r = _plain_python(how, {var: "4"})
    assert r.returncode != 0
    assert "RuntimeError" in r.stderr and "singleton trap" in r.stderr, r.stderr
    assert f"${var}=4" in r.stderr
    assert "mpiexec -n N" in r.stderr
    if var.startswith("SLURM"):
        assert "srun --mpi=pmi2" in r.stderr


def test_singleton_trap_not_raised_for_one_process():
    r = _plain_python("import mpidist; i = mpidist.init_distributed_mode(); print(i.world_size, i.launcher)",
                      {"WORLD_SIZE": "1", "SLURM_STEP_NUM_TASKS": "1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", launch.SINGLETON]


def test_a_plain_python_is_a_singleton():
    r = _plain_python("import mpidist; print(mpidist.init_distributed_mode())", {})
    assert r.returncode == 0, r.stderr
    assert "launcher='singleton'" in r.stdout and "local_world_size=1" in r.stdout


@pytest.mark.parametrize("env, want", [
    ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}, launch.OPEN_MPI),
    ({"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0"}, launch.HYDRA),
    ({"SLURM_STEP_ID": "0", "PMI_FD": "5", "PMI_RANK": "1", "SLURM_LOCALID": "1"}, launch.SLURM),
    ({"SLURM_STEP_ID": "0", "PMI_RANK": "0", "MPI_LOCALRANKID": "0"}, launch.HYDRA),  # sbatch + mpiexec
    ({"LOCAL_RANK": "0", "WORLD_SIZE": "2", "RANK": "0"}, launch.TORCHRUN),
    ({"TORCHELASTIC_RUN_ID": "x"}, launch.TORCHRUN),
    ({}, launch.SINGLETON),
])
def test_detect_launcher(monkeypatch, env, want):
    for k in list(os.environ):
        if k.startswith(_LAUNCHER_VARS):
            monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert launch.detect_launcher(size=1) == want


def test_crosscheck_names_a_disagreeing_variable(monkeypatch):
    monkeypatch.setenv("MPI_LOCALRANKID", "3")
    note = launch.crosscheck(launch.HYDRA, 1)
    assert note is not None and "$MPI_LOCALRANKID=3" in note and "local rank 1" in note
    assert launch.crosscheck(launch.HYDRA, 3) is None
    assert launch.crosscheck(launch.SINGLETON, 1) is None


def test_select_device_is_cpu_without_a_gpu():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        assert launch.select_device(5, set_device=False) == f"cuda:{5 % torch.cuda.device_count()}"
    else:
        assert launch.select_device(5) == "cpu"


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

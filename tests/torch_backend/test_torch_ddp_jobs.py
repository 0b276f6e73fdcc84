"""The torch backend in jobs of its own: plain ``init_process_group("mpidist")`` under mpiexec,
a rank that disagrees with MPI, and an uncaught exception that must abort the job.

Serial tests; each starts its own ``mpiexec`` through ``launcher``, under a timeout.
"""

from __future__ import annotations

import textwrap

import pytest
from launcher import run_mpi

pytest.importorskip("torch", reason="torch is not installed (pip install 'mpidist[torch]')")
pytest.importorskip("torch.distributed", reason="torch.distributed is not available")

SCRIPT_PLAIN = """
import torch, torch.distributed as dist
import mpidist.torch
dist.init_process_group("mpidist", rank=int(__import__("os").environ.get("PMI_RANK", -1)))
t = torch.full((2,), float(dist.get_rank() + 1))
dist.all_reduce(t)
print("OK", dist.get_rank(), dist.get_world_size(), int(t[0].item()), dist.get_backend())
dist.destroy_process_group()
"""

SCRIPT_MISMATCH = """
import torch.distributed as dist
import mpidist.torch
try:
    dist.init_process_group("mpidist", world_size=5, rank=0, init_method="env://")
except ValueError as exc:
    print("ERR", exc)
"""

SCRIPT_ABORT = """
import torch, torch.distributed as dist
import mpidist.torch
dist.init_process_group("mpidist")
if dist.get_rank() == 1:
    raise KeyError("boom on purpose")
dist.all_reduce(torch.ones(1))  # rank 0 would wait for ever without the abort
print("UNREACHABLE")
"""


def test_plain_init_under_mpiexec():
    proc = run_mpi(3, ["-c", textwrap.dedent(SCRIPT_PLAIN)], timeout=180,
                   env={"MASTER_ADDR": "", "MASTER_PORT": "", "RANK": "", "WORLD_SIZE": ""})
    assert proc.returncode == 0, proc.stderr
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("OK"))
    assert lines == [f"OK {r} 3 6 mpidist" for r in range(3)]


def test_rank_that_disagrees_with_mpi_is_refused():
    proc = run_mpi(2, ["-c", textwrap.dedent(SCRIPT_MISMATCH)], timeout=180)
    errs = [line for line in proc.stdout.splitlines() if line.startswith("ERR")]
    assert len(errs) == 2, proc.stdout + proc.stderr
    assert all("world_size=5" in e and "world_size=2" in e for e in errs)


def test_uncaught_exception_aborts_the_job():
    proc = run_mpi(2, ["-c", textwrap.dedent(SCRIPT_ABORT)], timeout=180,
                   env={"MPIDIST_ABORT_ON_ERROR": "1"})
    assert proc.returncode != 0
    assert "UNREACHABLE" not in proc.stdout
    assert "[rank 1]" in proc.stderr and "boom on purpose" in proc.stderr, proc.stderr

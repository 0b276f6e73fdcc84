"""``mpidist.torch.use_for_cpu()`` and the rendezvous checks, in jobs of their own (no library needed).

Serial tests; each starts a 2- or 3-rank ``mpiexec`` under a timeout.
"""

from __future__ import annotations

import textwrap

import pytest
from torch_scripts import mpi

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'mpidist[torch]')")

USE_FOR_CPU = """
import os, torch, torch.distributed as dist
import mpidist.torch
mpidist.torch.use_for_cpu()
dist.init_process_group("gloo")
t = torch.full((2,), float(dist.get_rank() + 1))
dist.all_reduce(t)
print("OK", dist.get_rank(), dist.get_world_size(), int(t[0]), dist.get_backend(), os.environ["LOCAL_RANK"],
      os.environ["MASTER_ADDR"], flush=True)
dist.destroy_process_group()
"""

# what Lightning's SLURMEnvironment does under sbatch + mpiexec: every rank is "rank 0 of 1",
# with MASTER_ADDR/MASTER_PORT set, so torch's own handler would race every rank for one port
SLURM_TRAP = """
import os, torch.distributed as dist
import mpidist.torch
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29511", SLURM_PROCID="0", SLURM_NTASKS="1")
try:
    dist.init_process_group("gloo", rank=0, world_size=1)
except ValueError as exc:
    print("ERR", exc, flush=True)
else:
    print("TRAINED ALONE", flush=True)
"""

TOO_LATE = """
import torch.distributed as dist
import mpidist.torch
dist.init_process_group("mpidist")
try:
    mpidist.torch.use_for_cpu()
except RuntimeError as exc:
    print("ERR", exc, flush=True)
"""


@pytest.mark.parametrize("n", [2, 3])
def test_use_for_cpu_under_plain_mpiexec(n):
    """No launcher variables: rank, size, local rank and the store come from MPI; gloo runs on mpidist."""
    r = mpi(n, ["-c", textwrap.dedent(USE_FOR_CPU)], timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    total = n * (n + 1) // 2
    got = sorted(line for line in r.stdout.splitlines() if line.startswith("OK"))
    assert got == [f"OK {k} {n} {total} mpidist {k} 127.0.0.1" for k in range(n)]
    line = '"gloo" requested: running on mpidist over MPI (MPICH '
    said = [x for x in r.stderr.splitlines() if x.startswith(line)]
    assert len(said) == 1 and said[0].endswith(f", {n} ranks on 1 node)"), r.stderr


def test_slurm_variables_that_contradict_mpi_stop_every_rank():
    r = mpi(2, ["-c", textwrap.dedent(SLURM_TRAP)], timeout=120)
    errs = [line for line in r.stdout.splitlines() if line.startswith("ERR")]
    assert "TRAINED ALONE" not in r.stdout and "EADDRINUSE" not in r.stderr
    assert len(errs) == 2, r.stdout + r.stderr[-3000:]
    assert all("world_size=1 disagrees with MPI, which gives this process world_size=2" in e for e in errs)
    assert all("srun --mpi=pmi2" in e and "use_for_cpu()" in e for e in errs), errs


def test_use_for_cpu_after_init_is_refused():
    r = mpi(2, ["-c", textwrap.dedent(TOO_LATE)], timeout=120)
    errs = [line for line in r.stdout.splitlines() if line.startswith("ERR")]
    assert len(errs) == 2 and all("before anything starts it" in e for e in errs), r.stdout + r.stderr


# what a script sees after either route: the variables the routes set, and the backend an
# init_process_group() that names none gets
ROUTE_SCRIPT = """
import os, sys, torch, torch.distributed as dist
{prelude}
dist.init_process_group()
t = torch.ones(1)
dist.all_reduce(t)
keys = ("ACCELERATE_USE_CPU", "TORCHELASTIC_USE_AGENT_STORE", "RANK", "WORLD_SIZE", "LOCAL_RANK",
        "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR")
print("ROUTE", dist.get_backend(), int(t[0]), torch.accelerator.is_available(),
      [(k, os.environ.get(k)) for k in keys], flush=True)
dist.destroy_process_group()
"""


def test_run_and_use_for_cpu_set_the_same(tmp_path):
    """``mpidist.run --backend-for-cpu mpidist`` and ``use_for_cpu()`` are one implementation: an
    unnamed backend runs on mpidist on a host without an accelerator (also on a CUDA build of
    torch there), and both leave the script the same variables, ACCELERATE_USE_CPU among them."""
    script = tmp_path / "route.py"
    script.write_text(textwrap.dedent(ROUTE_SCRIPT.format(prelude="")))
    inline = textwrap.dedent(ROUTE_SCRIPT.format(prelude="import mpidist.torch; mpidist.torch.use_for_cpu()"))
    runs = {"run": mpi(2, ["-m", "mpidist.run", "--backend-for-cpu", "mpidist", str(script)], timeout=180),
            "use_for_cpu": mpi(2, ["-c", inline], timeout=180)}
    seen = {}
    for route, r in runs.items():
        assert r.returncode == 0, f"{route}: {r.stderr[-3000:]}"
        seen[route] = sorted(line for line in r.stdout.splitlines() if line.startswith("ROUTE"))
        assert len(seen[route]) == 2, r.stdout
        said = [x for x in r.stderr.splitlines() if x.startswith("no backend requested on a host without")]
        if not torch.accelerator.is_available():
            assert len(said) == 1, r.stderr[-3000:]
            assert all(line.startswith("ROUTE mpidist 2 False") for line in seen[route])
            assert all("('ACCELERATE_USE_CPU', 'true')" in line for line in seen[route])
    assert seen["run"] == seen["use_for_cpu"]

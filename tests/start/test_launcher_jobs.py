"""The singleton trap: a plain ``python`` started with a launcher's variables refuses to run alone.

Serial tests; each starts its own plain ``python`` (no launcher variables but the ones under test).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from launcher import LAUNCHER_VARS, ROOT

from mpidist.start import launcher


def _plain_python(code: str, extra: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_VARS)}
    env.update(extra)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=str(ROOT))


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
    assert r.stdout.split() == ["1", launcher.SINGLETON]


def test_a_plain_python_is_a_singleton():
    r = _plain_python("import mpidist; print(mpidist.init_distributed_mode())", {})
    assert r.returncode == 0, r.stderr
    assert "launcher='singleton'" in r.stdout and "local_world_size=1" in r.stdout

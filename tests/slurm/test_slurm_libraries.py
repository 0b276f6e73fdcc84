"""The Lightning and HF recipes under Slurm: ``sbatch`` + ``mpiexec``, ``srun --mpi=pmi2``, and the trap.

A non-MPI test on the private single-node Slurm (``slurm/conftest.py``; skipped with the
reason where Slurm cannot be had). One job of 2 tasks runs: examples/slurm/lightning.sbatch
(mpiexec in the allocation, ``MpidistEnvironment``), the same script under ``srun
--mpi=pmi2``, the HF Trainer with ``use_for_cpu()`` under ``srun --mpi=pmi2``, and Lightning
left to choose its own environment under mpiexec, where it picks ``SLURMEnvironment``
(every rank "rank 0 of 1"): that one must stop on every rank with the message that names
the fix. Each training is held to ``tests/libraries.py``'s checks against gloo's run.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from libraries import ANNOUNCED, HF_TRAINER, LIGHTNING, OFFLINE, SAMPLES, check_run, need, records

from slurm.jobs import JOB_TIMEOUT, job_env

TASKS = 2
TRAP = "these are SLURM_PROCID=0 and SLURM_NTASKS=1"


def test_library_recipes_under_slurm(slurm, lightning_gloo, tmp_path):
    need("transformers")
    for d in ("sbatch", "srun", "hf", "trap"):
        (tmp_path / d).mkdir()
    steps = [f"bash examples/slurm/lightning.sbatch --record {tmp_path}/sbatch",
             f"srun --mpi=pmi2 python {LIGHTNING} --record {tmp_path}/srun",
             f"srun --mpi=pmi2 python {HF_TRAINER} --record {tmp_path}/hf",
             # no `set -e` for this one: it must fail, and say why on every rank
             f"(mpiexec -n {TASKS} python {LIGHTNING} --environment lightning --record {tmp_path}/trap"
             " && echo TRAP-TRAINED || echo TRAP-STOPPED)"]
    wrap = " && ".join(steps)
    env = job_env(Path(sys.executable).parent, OFFLINE)
    job = slurm.sbatch(None, env=env, cwd=Path(LIGHTNING).parent.parent, options=(
        f"--ntasks={TASKS}", f"--output={tmp_path}/job.out", "--wrap", wrap))
    state, code = slurm.wait(job, timeout=max(JOB_TIMEOUT, 1500))  # four trainings of 2 ranks
    output = (tmp_path / "job.out").read_text(errors="replace")
    assert (state, code) == ("COMPLETED", "0:0"), f"{shlex.quote(wrap)}\n{output[-6000:]}"

    for how in ("sbatch", "srun"):
        got = records(tmp_path / how, TASKS)
        assert {g["environment"] for g in got} == {"MpidistEnvironment"}, how
        check_run(got, SAMPLES[LIGHTNING], "mpidist", lightning_gloo)
    hf = records(tmp_path / "hf", TASKS)
    check_run(hf, SAMPLES[HF_TRAINER], "mpidist")
    assert output.count(ANNOUNCED) == 1, output[-3000:]

    assert "TRAP-STOPPED" in output and "TRAP-TRAINED" not in output, output[-6000:]
    assert not list((tmp_path / "trap").iterdir()), "the trapped job trained"
    assert output.count(TRAP) == TASKS, output[-6000:]  # every rank says why
    assert "EADDRINUSE" not in output and "address already in use" not in output.lower()

"""torch scripts under Slurm through ``python -m mpidist.run`` and ``init_distributed_mode``.

Non-MPI tests on the private single-node Slurm of ``tests/slurm/harness.py`` (the
``slurm`` fixture of ``slurm/conftest.py``; skipped with the reason where Slurm cannot be
had). One job per way of starting the ranks (``srun --mpi=pmi2``; ``sbatch`` with
``mpiexec`` inside), each running: the environment dump without and with mpidist.run
(compared key by key with what torchrun gives the same layout) and the DETR-style script's
own ``--dist-init mpidist``; under srun also the torchrun-style and DETR-style scripts
through mpidist.run (all compared with torchrun's results).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
from torch_scripts import (
    DETR_STYLE,
    FINAL,
    TORCHRUN_STYLE,
    assert_like_torchrun,
    dumps,
    same_training,
    torchrun_dumps,
)

from slurm.jobs import JOB_TIMEOUT, NTASKS, job_env

EPOCHS = "2"  # as torchrun_results
#: Five job steps of four torch ranks each: more than test_slurm's one training.
TIMEOUT = max(JOB_TIMEOUT, 900)


def _finals(output: str) -> list[dict[str, str]]:
    return [dict(item.split("=", 1) for item in line.split()) for line in FINAL.findall(output)]


@pytest.mark.parametrize("launch", ["srun --mpi=pmi2", f"mpiexec -n {NTASKS}"])
def test_torch_scripts_under_slurm(slurm, dump_script, torchrun_results, tmp_path, launch):
    steps = [f"DUMP_TAG=bare {launch} python {dump_script}",
             f"DUMP_TAG=ours {launch} python -m mpidist.run {dump_script}",
             f"{launch} python -m mpidist.run {TORCHRUN_STYLE} --epochs {EPOCHS}",
             f"{launch} python -m mpidist.run {DETR_STYLE} --epochs {EPOCHS}",
             f"{launch} python {DETR_STYLE} --dist-init mpidist --epochs {EPOCHS}"]
    srun = launch.startswith("srun")
    if not srun:
        # what differs under hydra's proxy step is the environment the ranks see (the dumps) and
        # the scripts' own detection of it (the last step); `mpidist.run`'s trainings are the
        # same code under either launcher, and the srun case runs them
        del steps[2:4]
    wrap = " && ".join(steps)
    env = job_env(Path(sys.executable).parent, {"DUMP_DIR": str(tmp_path)})
    job = slurm.sbatch(None, env=env, cwd=tmp_path, options=(
        f"--ntasks={NTASKS}", f"--output={tmp_path}/job.out", "--wrap", f"set -e; {wrap}"))
    state, code = slurm.wait(job, timeout=TIMEOUT)
    output = (tmp_path / "job.out").read_text(errors="replace")
    assert (state, code) == ("COMPLETED", "0:0"), f"{shlex.quote(wrap)}\n{output}"

    theirs, started_with = torchrun_dumps(dump_script, tmp_path, NTASKS)
    bare, ours = dumps(tmp_path, "bare"), dumps(tmp_path, "ours")
    assert_like_torchrun(theirs, started_with, bare, ours)
    if not srun:  # hydra's proxy step: Slurm's own rank variable is no guide
        assert {d["env"].get("SLURM_PROCID") for d in bare.values()} != {str(r) for r in range(NTASKS)}

    finals = _finals(output)
    assert len(finals) == (3 if srun else 1), output
    if srun:
        same_training(finals[0], torchrun_results["torchrun_style"], bitwise=True)
        same_training(finals[1], torchrun_results["detr_style"], bitwise=True)
    same_training(finals[-1], torchrun_results["detr_style"], bitwise=False)

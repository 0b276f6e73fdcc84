"""torch scripts under Slurm through ``python -m mpidist.run`` and ``init_distributed_mode``.

Non-MPI tests on the private single-node Slurm of ``tests/slurm/harness.py`` (the
``slurm`` fixture of ``test_slurm.py``; skipped with the reason where Slurm cannot be
had). One job per way of starting the ranks (``srun --mpi=pmi2``; ``sbatch`` with
``mpiexec`` inside), each running: the environment dump without and with mpidist.run
(compared key by key with what torchrun gives the same layout), the torchrun-style
script and the DETR-style script through both routes (compared with torchrun's results).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
from test_run_module import (  # noqa: F401  (fixtures)
    DETR_STYLE,
    FINAL,
    TORCHRUN_STYLE,
    assert_like_torchrun,
    dump_script,
    dumps,
    same_training,
    torchrun_dumps,
)
from test_slurm import JOB_TIMEOUT, NTASKS, job_env, slurm  # noqa: F401  (slurm: the fixture)

EPOCHS = "2"  # as torchrun_results
#: Five job steps of four torch ranks each: more than test_slurm's one training.
TIMEOUT = max(JOB_TIMEOUT, 900)


def _finals(output: str) -> list[dict[str, str]]:
    return [dict(item.split("=", 1) for item in line.split()) for line in FINAL.findall(output)]


@pytest.mark.parametrize("launch", ["srun --mpi=pmi2", f"mpiexec -n {NTASKS}"])
def test_torch_scripts_under_slurm(slurm, dump_script, torchrun_results, tmp_path, launch):  # noqa: F811
    steps = [f"DUMP_TAG=bare {launch} python {dump_script}",
             f"DUMP_TAG=ours {launch} python -m mpidist.run {dump_script}",
             f"{launch} python -m mpidist.run {TORCHRUN_STYLE} --epochs {EPOCHS}",
             f"{launch} python -m mpidist.run {DETR_STYLE} --epochs {EPOCHS}",
             f"{launch} python {DETR_STYLE} --dist-init mpidist --epochs {EPOCHS}"]
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
    if launch.startswith("mpiexec"):  # hydra's proxy step: Slurm's own rank variable is no guide
        assert {d["env"].get("SLURM_PROCID") for d in bare.values()} != {str(r) for r in range(NTASKS)}

    torchrun_style, detr_run, detr_init = _finals(output)
    same_training(torchrun_style, torchrun_results["torchrun_style"], bitwise=True)
    same_training(detr_run, torchrun_results["detr_style"], bitwise=True)
    same_training(detr_init, torchrun_results["detr_style"], bitwise=False)

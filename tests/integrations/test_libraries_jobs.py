"""Lightning, the HF Trainer and accelerate on mpidist, each against its run on torch's gloo.

Serial tests: each starts its own 2-rank ``mpiexec`` jobs of an example (``--record``:
every rank's shard and parameters; see ``tests/libraries.py``). They skip with the reason
where a library is missing, and fail instead under ``MPIDIST_REQUIRE_LIBRARIES=1`` (``make
test`` installed them). The Slurm launches are in ``slurm/test_slurm_libraries.py``.
"""

from __future__ import annotations

import pytest
from libraries import ACCELERATE, ANNOUNCED, HF_TRAINER, LIGHTNING, OFFLINE, SAMPLES, check_run, need, records
from torch_scripts import mpi

N = 2
TIMEOUT = 300


def _run(tmp_path, name: str, args: list[str], ok: bool = True):
    where = tmp_path / name
    where.mkdir()
    r = mpi(N, [*args, "--record", str(where)], env=OFFLINE, timeout=TIMEOUT)
    if ok:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
        return r, records(where, N)
    return r, None


def test_lightning_on_mpidist_equals_gloo(tmp_path, lightning_gloo):
    r, got = _run(tmp_path, "mpidist", [LIGHTNING])
    assert {g["environment"] for g in got} == {"MpidistEnvironment"}
    assert "distributed_backend=mpidist" in r.stdout + r.stderr
    check_run(got, SAMPLES[LIGHTNING], "mpidist", lightning_gloo)
    assert {g["environment"] for g in lightning_gloo} == {"MPIEnvironment"}  # Lightning's own: the reference


def test_lightning_under_mpidist_run_with_backend_for_cpu(tmp_path, lightning_gloo):
    """Lightning's default gloo left in the script: TorchElasticEnvironment sees mpidist.run's variables."""
    r, got = _run(tmp_path, "run", ["-m", "mpidist.run", "--backend-for-cpu", "mpidist", LIGHTNING,
                                    "--backend", "gloo", "--environment", "lightning"])
    assert {g["environment"] for g in got} == {"TorchElasticEnvironment"}
    assert r.stderr.count(ANNOUNCED) == 1, r.stderr[-3000:]  # rank 0 only
    check_run(got, SAMPLES[LIGHTNING], "mpidist", lightning_gloo)


def test_lightning_devices_that_do_not_match_mpi_stop_every_rank(tmp_path):
    need("lightning")
    r, _ = _run(tmp_path, "bad", [LIGHTNING, "--devices", "1"], ok=False)
    assert r.returncode != 0
    message = ("Trainer(devices=1, num_nodes=1) asks for 1 rank(s) on each of 1 node(s), "
               "but MPI started 2 rank(s)")
    assert r.stderr.count(message) == N, r.stderr[-5000:]  # every rank says why, none hangs
    assert r.stderr.count("set devices=2, num_nodes=1") == N


@pytest.mark.parametrize("example", [HF_TRAINER, ACCELERATE], ids=["hf_trainer", "accelerate"])
def test_hf_use_for_cpu_equals_gloo(tmp_path, example):
    need("transformers" if example == HF_TRAINER else "accelerate")
    # the reference: torch's gloo, the script started through mpidist.run (torchrun's variables)
    _, ref = _run(tmp_path, "gloo", ["-m", "mpidist.run", example, "--no-use-for-cpu"])
    r, got = _run(tmp_path, "mpidist", [example])  # plain mpiexec, use_for_cpu() in the script
    lines = [line for line in r.stderr.splitlines() if line.startswith(ANNOUNCED)]
    assert lines == [f'{ANNOUNCED}MPICH {lines[0].split("MPICH ")[1].split(",")[0]}, 2 ranks on 1 node)'], \
        r.stderr[-3000:]
    check_run(ref, SAMPLES[example], "gloo")
    check_run(got, SAMPLES[example], "mpidist", ref)


UNSET_CPU = """
import mpidist.torch
mpidist.torch.use_for_cpu()
import transformers
args = transformers.TrainingArguments(output_dir="/tmp", report_to=[])  # no use_cpu=True
print("ARGS", args.process_index, args.world_size, args.parallel_mode, flush=True)
"""


def test_trainer_without_use_cpu_still_distributes():
    """On a CPU-only host accelerate would look for a GPU and train one copy per rank."""
    need("transformers")
    r = mpi(N, ["-c", UNSET_CPU], env=OFFLINE, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr[-3000:]
    got = sorted(line for line in r.stdout.splitlines() if line.startswith("ARGS"))
    assert got == [f"ARGS {k} {N} ParallelMode.DISTRIBUTED" for k in range(N)], r.stdout

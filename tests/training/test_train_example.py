"""examples/train.py under mpiexec: converges, identical parameters, 1-rank accuracy at N ranks."""

from __future__ import annotations

import math
import re

import pytest
from launcher import ROOT, run_mpi
from mpi4py import MPI

TRAIN = str(ROOT / "examples" / "train.py")
FINAL = re.compile(r"final: world_size=(\d+) test_accuracy=([\d.]+) params_sha256=([0-9a-f]{64})")
SUMMARY = re.compile(r"^summary: (\d+) ranks? on (\d+) nodes?, (.+); (\d+) steps in ([\d.]+) s, "
                     r"([\d.]+) steps/s\n"
                     r"summary: test accuracy ([\d.]+); parameters identical on all (\d+) ranks? "
                     r"\(sha256 ([0-9a-f]{12})\)$", re.MULTILINE)

pytest.importorskip("sklearn")
pytest.importorskip("tqdm")


def _train(n, *flags, timeout=300):
    r = run_mpi(n, [TRAIN, "--epochs", "3", *flags], timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    found = FINAL.findall(r.stdout)
    assert len(found) == 1, r.stdout  # rank 0 alone prints
    size, acc, _ = found[0]
    assert int(size) == n
    return float(acc), r


@pytest.fixture(scope="module")
def one_rank():
    return _train(1, "--no-progress")[0]


@pytest.mark.parametrize("n", [3, 8])
def test_n_ranks_match_one_rank(one_rank, n):
    acc, r = _train(n, "--no-progress")
    assert one_rank > 0.85  # 3 epochs of SGD on the digits
    assert abs(acc - one_rank) <= 0.02  # the same global batches: equal up to rounding
    assert len(re.findall(r"epoch 3/3: train loss", r.stdout)) == 1


def _steps_per_epoch(ranks, batch_size):
    per_rank = math.ceil(int(0.8 * 1797) / ranks)  # the sampler pads the 80% split evenly
    return math.ceil(per_rank / (batch_size // ranks))


def test_progress_bar_on_rank_zero_only():
    _, r = _train(2, "--batch-size", "32", "--lr", "0.2", "--seed", "4", "--progress")
    assert r.stdout.count("100%|") >= 1
    bars = re.findall(r"(\d+)/(\d+) \[", r.stdout)
    assert bars and {total for _, total in bars} == {str(3 * _steps_per_epoch(2, 32))}
    # bar and epoch lines share rank 0's stdout: each epoch line starts where the bar was cleared
    epochs = [line for line in r.stdout.split("\n") if "epoch " in line]
    assert len(epochs) == 3 and all(line.split("\r")[-1].startswith("epoch ") for line in epochs), epochs
    assert "%|" not in r.stderr


def test_no_bar_when_the_output_is_not_a_terminal():
    """mpiexec writes into a pipe here, as into a Slurm log: plain lines, no bar frames."""
    _, r = _train(2)
    assert "%|" not in r.stdout + r.stderr and "\r" not in r.stdout
    assert len(re.findall(r"^epoch \d/3: train loss", r.stdout, re.MULTILINE)) == 3


@pytest.mark.parametrize("n", [1, 3])
def test_summary_agrees_with_the_run(n):
    _, r = _train(n, "--no-progress")
    found = SUMMARY.findall(r.stdout)
    assert len(found) == 1, r.stdout
    ranks, nodes, launcher, steps, seconds, rate, acc, equal_on, sha = found[0]
    size, final_acc, final_sha = FINAL.findall(r.stdout)[0]
    assert int(ranks) == int(equal_on) == int(size) == n
    assert int(nodes) == 1  # every rank on this machine
    if MPI.get_vendor()[0] == "MPICH":
        assert launcher == "MPICH/Hydra"
    assert int(steps) == 3 * _steps_per_epoch(n, 64)
    # both printed to 0.1: the rate lies between those of the shortest and longest time that rounds so
    fastest = int(steps) / max(float(seconds) - 0.05, 1e-9)
    assert int(steps) / (float(seconds) + 0.05) - 0.05 <= float(rate) <= fastest + 0.05
    assert acc == final_acc and final_sha.startswith(sha)
    assert r.stdout.rstrip("\n").splitlines()[-3].startswith("summary: ")  # the summary closes the run


def test_bad_batch_size_is_refused():
    r = run_mpi(3, [TRAIN, "--batch-size", "2"], timeout=120)
    assert r.returncode != 0
    assert "--batch-size 2 must be at least the number of ranks (3)" in r.stderr

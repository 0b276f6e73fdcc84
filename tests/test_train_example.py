"""examples/train.py under mpiexec: converges, identical parameters, 1-rank accuracy at N ranks."""

from __future__ import annotations

import math
import re

import pytest
from launcher import ROOT, run_mpi

TRAIN = str(ROOT / "examples" / "train.py")
FINAL = re.compile(r"final: world_size=(\d+) test_accuracy=([\d.]+) params_sha256=([0-9a-f]{64})")

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


def test_progress_bar_on_rank_zero_only():
    _, r = _train(2, "--batch-size", "32", "--lr", "0.2", "--seed", "4")
    assert r.stderr.count("100%|") >= 1
    steps = math.ceil(math.ceil(int(0.8 * 1797) / 2) / 16)  # 80% of the digits, 2 ranks, 16 per rank
    bars = re.findall(r"(\d+)/(\d+) \[", r.stderr)
    assert bars and {total for _, total in bars} == {str(3 * steps)}


def test_bad_batch_size_is_refused():
    r = run_mpi(3, [TRAIN, "--batch-size", "2"], timeout=120)
    assert r.returncode != 0
    assert "--batch-size 2 must be at least the number of ranks (3)" in r.stderr

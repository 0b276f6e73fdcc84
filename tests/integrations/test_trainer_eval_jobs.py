"""The HF Trainer's distributed ``evaluate()`` and ``predict()`` on mpidist, over lengths ranks do not divide.

Serial tests; each starts one ``mpiexec`` job of ``job_trainer_eval.py`` (``use_for_cpu()``, plain
``mpiexec``) under a timeout, at 2 and at 3 ranks, over data sets of 7, 10 and 11 rows and eval
batch sizes of 1, 2 and 4 per rank. accelerate pads the last round of batches with rows from the
start of the data and ``gather_for_metrics`` drops them again; what every rank gets back is held
to numpy in this process:

- ``predict()``: exactly one row of logits per row of the data, in the data's order, equal to
  ``x @ W.T + b``; the labels likewise; without labels, the same logits;
- ``compute_metrics`` over the gathered predictions (count, accuracy, cross-entropy): equal to
  one process's values;
- ``eval_loss``: the Trainer averages each batch's mean loss, repeated once per row of the batch
  size, over the gathered rows. With one row per batch that is the data set's mean loss; with
  more, the last (padded) round weighs its batches' means, as under torchrun on gloo, and the
  test computes that from the same numpy losses.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from libraries import ANNOUNCED, OFFLINE, need
from torch_scripts import mpi

HERE = Path(__file__).resolve().parent
JOB = str(HERE / "job_trainer_eval.py")
LENGTHS = (7, 10, 11)
BATCH_SIZES = (1, 2, 4)
TIMEOUT = 300

pytest.importorskip("torch", reason="torch is not installed (pip install 'mpidist[torch]')")


def _reference(length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(logits, labels, per-row cross-entropy) of one process, in float64, from the job's seeds."""
    rng = np.random.default_rng(1)  # job_trainer_eval.weights()
    w, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    rng = np.random.default_rng(1000 + length)  # job_trainer_eval.data(length)
    x, y = rng.standard_normal((length, 4)).astype(np.float32), rng.integers(0, 3, length)
    logits = x.astype(np.float64) @ w.T.astype(np.float64) + b
    shifted = logits - logits.max(1, keepdims=True)
    nll = np.log(np.exp(shifted).sum(1)) - shifted[np.arange(length), y]
    return logits, y, nll


def _trainer_eval_loss(nll: np.ndarray, ranks: int, batch: int) -> float:
    """The Trainer's ``eval_loss`` at ``ranks`` ranks, ``batch`` rows per rank and step.

    Rank r's batch at step s holds rows ``[(s*ranks + r)*batch, ... + batch)`` of the data
    followed by rows from its start (accelerate's ``even_batches``); each batch's mean loss is
    repeated ``batch`` times, gathered in (step, rank) order and cut to the data set's length.
    """
    length = len(nll)
    steps = math.ceil(length / (ranks * batch))
    rows = np.arange(steps * ranks * batch) % length
    means = nll[rows].reshape(steps * ranks, batch).mean(1)
    return float(np.repeat(means, batch)[:length].mean())


def _check(res: dict, length: int, ranks: int, batch: int, where: str) -> None:
    """One rank's ``evaluate()``/``predict()`` results for one data set and batch size, against numpy."""
    logits, labels, nll = _reference(length)
    pred = np.asarray(res["predict"]["predictions"])
    assert pred.shape == (length, 3), where
    np.testing.assert_allclose(pred, logits, rtol=1e-5, atol=1e-6, err_msg=where)
    assert res["predict"]["label_ids"] == labels.tolist(), where
    unlabelled = res["unlabelled"]
    np.testing.assert_array_equal(np.asarray(unlabelled["predictions"]), pred, err_msg=where)
    assert unlabelled["label_ids"] is None and "test_loss" not in unlabelled["metrics"], where
    accuracy = float((logits.argmax(1) == labels).mean())
    for prefix, metrics in (("eval", res["evaluate"]), ("test", res["predict"]["metrics"])):
        assert metrics[f"{prefix}_count"] == length, where
        assert metrics[f"{prefix}_accuracy"] == pytest.approx(accuracy, abs=1e-12), where
        assert metrics[f"{prefix}_xent"] == pytest.approx(nll.mean(), rel=1e-5), where
        loss = _trainer_eval_loss(nll, ranks, batch)
        assert metrics[f"{prefix}_loss"] == pytest.approx(loss, rel=1e-5), where
    if batch == 1:  # one row per batch: the data set's own mean loss
        assert res["evaluate"]["eval_loss"] == pytest.approx(nll.mean(), rel=1e-5), where


@pytest.mark.parametrize("n", [3])  # 7, 10 and 11 samples: none divides by 3
def test_evaluate_and_predict_over_lengths_the_ranks_do_not_divide(tmp_path, n):
    need("transformers")
    r = mpi(n, [JOB, str(tmp_path)], env=OFFLINE, timeout=TIMEOUT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    assert sum(line.startswith(ANNOUNCED) for line in r.stderr.splitlines()) == 1, r.stderr[-3000:]
    got = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in range(n)]
    assert [g["rank"] for g in got] == list(range(n))
    assert {(g["world_size"], g["parallel_mode"], g["backend"]) for g in got} == \
        {(n, "ParallelMode.DISTRIBUTED", "mpidist")}
    for length in LENGTHS:
        for bs in BATCH_SIZES:
            key = f"{length}/{bs}"
            for g in got:
                _check(g["results"][key], length, n, bs, f"{n} ranks, {key}, rank {g['rank']}")
            # every rank got the same gathered predictions, to the bit
            assert len({json.dumps(g["results"][key]["predict"]["predictions"]) for g in got}) == 1, key

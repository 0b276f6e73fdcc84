"""The training-library recipes (examples/lightning_ddp.py, hf_trainer.py, accelerate_loop.py) for the tests.

Each example, given ``--record DIR``, writes per rank the sample indices it trained on and
its final parameters; :func:`records` reads them back and :func:`check_run` holds them to
what data-parallel training must give: every rank trained, the shards are disjoint and
cover the data set, every rank ends with the same parameters, and those equal the
reference run's (torch's gloo on the same data). Shared by
``integrations/test_libraries_jobs.py`` and ``slurm/test_slurm_libraries.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from launcher import ROOT

EXAMPLES = ROOT / "examples"
LIGHTNING = str(EXAMPLES / "lightning_ddp.py")
HF_TRAINER = str(EXAMPLES / "hf_trainer.py")
ACCELERATE = str(EXAMPLES / "accelerate_loop.py")
#: samples in each example's training set (its default --samples)
SAMPLES = {LIGHTNING: 1024, HF_TRAINER: 512, ACCELERATE: 1024}
#: what the rank-0 line says when a "gloo" group runs on mpidist (mpidist/torch/start.py)
ANNOUNCED = '"gloo" requested: running on mpidist over MPI ('
#: no download at run time: the models are built from configs, the data made here
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}


def need(module: str) -> None:
    """Skip with the reason when ``module`` is missing; fail instead where ``make test`` installed it."""
    try:
        __import__(module)
    except ImportError as exc:
        if os.environ.get("MPIDIST_REQUIRE_LIBRARIES") == "1":
            pytest.fail(f"{module} should be installed (make venv-libraries): {exc}")
        pytest.skip(f"{module} is not installed (pip install 'mpidist[libraries]'): {exc}")


def records(where: Path, n: int) -> list[dict]:
    """Each rank's record, in rank order; every rank must have written one."""
    found = sorted(where.glob("rank*.json"))
    assert [p.name for p in found] == sorted(f"rank{r}.json" for r in range(n)), found
    out = [json.loads((where / f"rank{r}.json").read_text()) for r in range(n)]
    assert [r["rank"] for r in out] == list(range(n)) and {r["world_size"] for r in out} == {n}
    return out


def check_run(got: list[dict], samples: int, backend: str, reference: list[dict] | None = None) -> None:
    """Disjoint shards that cover the data, the same parameters on every rank and as ``reference``."""
    shards = [set(r["seen"]) for r in got]
    assert all(len(s) == len(r["seen"]) for s, r in zip(shards, got)), "a rank saw a sample twice in an epoch"
    assert all(shards), "a rank trained on nothing"
    for i in range(len(shards)):
        for j in range(i + 1, len(shards)):
            assert not shards[i] & shards[j], f"ranks {i} and {j} share samples"
    assert set().union(*shards) == set(range(samples)), "the shards do not cover the data set"
    assert {r["backend"] for r in got} == {backend}
    first = np.asarray(got[0]["params"])
    assert np.isfinite(first).all() and first.size > 0
    for r in got[1:]:
        assert r["params_sha256"] == got[0]["params_sha256"], f"rank {r['rank']} ended with other parameters"
    if reference is not None:
        # the same data and order; mpidist sums in MPI's order, gloo in its own: equal to rounding
        assert [set(r["seen"]) for r in reference] == shards, "the reference run sharded the data otherwise"
        np.testing.assert_allclose(first, np.asarray(reference[0]["params"]), rtol=1e-5, atol=1e-6)

"""Checks shared by the test files: per-rank inputs, cross-rank results, and "the runtime still works".

A plain module, not ``conftest``: ``tests/`` is on ``sys.path`` under plain ``pytest``, under
``mpiexec ... pytest`` and in ``run_suite.py``'s Open MPI runs alike (pytest's default ``prepend``
import mode puts the directory of each rootless test file there), so ``from helpers import ...`` works
wherever the tests run. ``conftest.py`` keeps only fixtures.
"""

from __future__ import annotations

import numpy as np


def gathered(dist, value):
    """Every rank's ``value`` (any picklable object), in rank order, on every rank."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def assert_all_ranks_ok(dist, bad: list[str]) -> None:
    """Fail on every rank if any rank saw a mismatch (keeps the ranks in step)."""
    everyone = gathered(dist, bad)
    assert not any(everyone), {r: b for r, b in enumerate(everyone) if b}


def raised_everywhere(dist, fn, kind=ValueError) -> str:
    """Run ``fn``, which must raise ``kind`` on every rank with the same text; return that text.

    ``dist`` is mpidist or torch.distributed (anything with ``all_gather_object``).
    """
    try:
        fn()
        text = None
    except kind as exc:
        text = str(exc)
    texts = gathered(dist, text)
    assert None not in texts, texts
    assert len(set(texts)) == 1, texts
    return texts[0]


def still_works(dist, size: int) -> None:
    """After an error, the runtime must still work: one all_reduce across the world."""
    t = np.ones(1)
    dist.all_reduce(t)
    assert t[0] == size


def rank_data(rank: int, shape, dtype, seed: int = 0) -> np.ndarray:
    """Deterministic per-rank input: any rank can rebuild any other rank's array."""
    rng = np.random.default_rng(seed * 1000 + rank)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.kind in "iu":
        return rng.integers(1, 7, size=shape).astype(dtype)
    if dtype.kind == "c":
        return (rng.uniform(0.5, 2, size=shape) + 1j * rng.uniform(0.5, 2, size=shape)).astype(dtype)
    return rng.uniform(0.5, 2, size=shape).astype(dtype)

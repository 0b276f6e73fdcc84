"""The private single-node Slurm (``tests/slurm/harness.py``) as the ``slurm`` fixture.

It skips with the reason where Slurm cannot be had, and fails instead under
``MPIDIST_REQUIRE_SLURM=1`` (``make test`` installed Slurm, so it must work).
"""

from __future__ import annotations

import os
import shutil

import pytest

from slurm import harness


@pytest.fixture(scope="module")
def slurm():
    if os.environ.get("MPIDIST_SLURM") == "0":
        pytest.skip("Slurm tests switched off (MPIDIST_SLURM=0)")
    reason = harness.unavailable_reason()
    given = os.environ.get("MPIDIST_SLURM_DIR")
    cluster = None
    if reason is None:
        cluster = harness.LocalSlurm(given or None)
        try:
            cluster.start()
        except harness.SlurmUnavailableError as exc:
            reason = str(exc)
    if reason:
        if os.environ.get("MPIDIST_REQUIRE_SLURM") == "1":
            pytest.fail(f"Slurm is installed but the local cluster is unusable: {reason}")
        pytest.skip(f"no local Slurm: {reason}")
    yield cluster
    cluster.stop()
    if not given:
        shutil.rmtree(cluster.state, ignore_errors=True)

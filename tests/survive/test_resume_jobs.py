"""Without ULFM: a killed job rerun from its checkpoint ends as a job never killed.

``examples/resume.py`` (DDP on mpidist, ``torch.distributed.checkpoint``) under the suite's
MPI: one run straight through; one whose rank 1 exits at step 9 (the job ends), rerun with the
same command. Both must end with bit-identical parameters.
"""

from __future__ import annotations

import re

import pytest
from launcher import ROOT, run_mpi

pytest.importorskip("torch", reason="the checkpoint recipe needs torch")
pytest.importorskip("sklearn", reason="the example trains on scikit-learn's digits")

RESUME = str(ROOT / "examples" / "resume.py")


def _checksums(r) -> set[str]:
    found = set(re.findall(r"parameter checksum (\S+)", r.stdout))
    assert found, r.stdout + r.stderr
    return found


def test_killed_and_rerun_ends_like_never_killed(tmp_path):
    args = ["--steps", "12", "--every", "4"]
    straight = run_mpi(2, [RESUME, "--dir", str(tmp_path / "a"), *args], timeout=300)
    assert straight.returncode == 0, straight.stdout + straight.stderr
    killed = run_mpi(2, [RESUME, "--dir", str(tmp_path / "b"), *args, "--kill", "1:9"], timeout=300)
    assert killed.returncode != 0 and "parameter checksum" not in killed.stdout
    rerun = run_mpi(2, [RESUME, "--dir", str(tmp_path / "b"), *args], timeout=300)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "resuming at step 8" in rerun.stdout
    want = _checksums(straight)
    assert len(want) == 1 and _checksums(rerun) == want

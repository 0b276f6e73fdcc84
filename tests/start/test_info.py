"""``python -m mpidist info``: printed once, by rank 0, with facts checked against their sources."""

from __future__ import annotations

import json

import mpi4py
import pytest
from launcher import run_mpi, run_python
from mpi4py import MPI


@pytest.mark.parametrize("n", [1, 3])
def test_info_json_under_mpiexec(n):
    r = run_mpi(n, ["-m", "mpidist", "info", "--json"], timeout=120)
    assert r.returncode == 0, r.stderr
    facts = json.loads(r.stdout)  # one JSON document: only rank 0 printed
    assert facts["world_size"] == n
    assert sorted(r for ranks in facts["hosts"].values() for r in ranks) == list(range(n))
    assert facts["hosts"] == {MPI.Get_processor_name(): list(range(n))}  # one machine
    assert facts["mpi4py"] == mpi4py.__version__
    vendor, version = MPI.get_vendor()
    assert facts["mpi_vendor"] == f"{vendor} {'.'.join(map(str, version))}"
    assert facts["mpi_standard"] == "{}.{}".format(*MPI.Get_version())
    assert facts["mpi_library_version"] == MPI.Get_library_version().strip()
    assert facts["thread_level"] in ("single", "funneled", "serialized", "multiple")
    assert facts["cuda_aware"] in ("yes", "no", "unknown")
    if vendor == "MPICH":
        assert facts["launcher"] == "MPICH/Hydra"
    assert facts["problems"] == []


def test_library_path_matches_mpi4py():
    want = run_python(["-m", "mpi4py", "--mpi-library"], timeout=60)
    r = run_python(["-m", "mpidist", "info", "--json"], timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["mpi_library_path"] == want.stdout.strip()


def test_info_text_is_printed_once():
    r = run_mpi(3, ["-m", "mpidist", "info"], timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("mpi4py:") == 1
    assert "world size:        3 on 1 node(s)" in r.stdout
    assert f"host {MPI.Get_processor_name()}:" in r.stdout and "3 rank(s): 0-2" in r.stdout
    assert f"thread level:      {'multiple'}" in r.stdout


def test_info_reports_the_singleton_trap():
    r = run_python(["-m", "mpidist", "info"], timeout=60, env={"SLURM_STEP_NUM_TASKS": "4"})
    assert r.returncode == 0, r.stderr
    assert "PROBLEM:" in r.stdout and "singleton trap" in r.stdout


def test_usage_and_unknown_command():
    r = run_python(["-m", "mpidist"], timeout=60)
    assert r.returncode == 2 and "usage: python -m mpidist info" in r.stdout
    r = run_python(["-m", "mpidist", "frobnicate"], timeout=60)
    assert r.returncode == 2 and "unknown command 'frobnicate'" in r.stderr


def _said(key: str, variable: str, setting: str) -> str:
    """What ``python -m mpidist info --json`` reports as ``key`` with ``variable=setting``."""
    r = run_python(["-m", "mpidist", "info", "--json"], timeout=60, env={variable: setting})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)[key]


@pytest.mark.parametrize("variable, setting, want", [
    ("MPIDIST_MALLOC", "0", "off (MPIDIST_MALLOC=0)"),
    ("MPIDIST_MALLOC", "1", "to be set at init_process_group"),
    ("MALLOC_TRIM_THRESHOLD_", "1048576", "left as the user chose (MALLOC_TRIM_THRESHOLD_)"),
])
def test_info_says_what_happens_to_the_heap(variable, setting, want):
    said = _said("heap", variable, setting)
    assert said.startswith(want), said
    r = run_python(["-m", "mpidist", "info"], timeout=60, env={variable: setting})
    assert f"{'C heap limits:':<18} {said}" in r.stdout, r.stdout

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
    if vendor in ("MPICH", "Intel MPI"):
        assert facts["launcher"] == {"MPICH": "MPICH/Hydra", "Intel MPI": "Intel MPI"}[vendor]
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


def test_info_names_the_loaded_library_and_hints_that_fit_it():
    """Every line that names an MPI or a way out names the loaded one (Intel MPI is not "MPICH"),
    and hints are what a user types (pip extras, the library's own variables), never this
    project's Makefile variables."""
    from mpidist.start import info

    r = run_mpi(2, ["-m", "mpidist", "info", "--json"], timeout=120)
    assert r.returncode == 0, r.stderr
    facts = json.loads(r.stdout)
    vendor = MPI.get_vendor()[0]
    assert facts["mpi_vendor"].startswith(vendor)
    assert facts["survive_failure"].startswith("yes") or vendor in facts["survive_failure"]
    assert facts["network_vars"] == list(info.NETWORK_VARS_OF.get(vendor, info.NETWORK_VARS))
    if vendor == "Intel MPI":
        assert "I_MPI_FABRICS" in facts["network_vars"]
        assert "MPIR_CVAR_CH4_NETMOD" not in facts["network_vars"]
    text = run_mpi(2, ["-m", "mpidist", "info"], timeout=120).stdout
    assert "MPI=openmpi" not in text and "make " not in text, text


INTEL_YIELD = "(Intel MPI's own blocking waits yield the core with I_MPI_THREAD_YIELD=3)"
OPENMPI_YIELD = "(Open MPI's own blocking waits yield the core with OMPI_MCA_mpi_yield_when_idle=1)"


@pytest.mark.parametrize("masks, vendor, want", [
    ([{0}, {1}, {0}], "Intel MPI",
     f"3 rank(s) on 2 core(s) of rank 0's node; load of the busiest core: 2 rank(s): ranks share cores "
     f"{INTEL_YIELD}"),
    ([{0, 1}, {0, 1}, {0, 1}], "Open MPI", f"busiest core: 1.5 rank(s): ranks share cores {OPENMPI_YIELD}"),
    ([{0, 1}, {0, 1}, {0, 1}], "MPICH", "busiest core: 1.5 rank(s): ranks share cores"),
    ([{0}, {1}], "Intel MPI", "2 rank(s) on 2 core(s) of rank 0's node; load of the busiest core: 1 rank(s)"),
])
def test_info_says_how_the_ranks_sit_on_the_cores(masks, vendor, want, monkeypatch):
    from mpidist.start import info

    for setting in info.YIELD_SETTINGS.values():
        monkeypatch.delenv(setting.split("=")[0], raising=False)
    said = info._cores([frozenset(m) for m in masks], vendor)
    assert said.endswith(want), said
    monkeypatch.setenv("I_MPI_THREAD_YIELD", "2")  # the user's own choice: named, not advised
    if vendor == "Intel MPI" and "share" in want:
        assert info._cores([frozenset(m) for m in masks], vendor).endswith(
            "ranks share cores (I_MPI_THREAD_YIELD=2 is set)")


def test_info_cores_line_comes_from_the_ranks_real_masks():
    r = run_mpi(3, ["-m", "mpidist", "info", "--json"], timeout=120)
    assert r.returncode == 0, r.stderr
    masks = json.loads(run_mpi(3, ["-c", (
        "import json, os; from mpi4py import MPI\n"
        "m = MPI.COMM_WORLD.gather(sorted(os.sched_getaffinity(0)), root=0)\n"
        "MPI.COMM_WORLD.Get_rank() == 0 and print(json.dumps(m))")], timeout=120).stdout)
    load = max(sum(1 / len(m) for m in masks if c in m) for c in {c for m in masks for c in m})
    assert f"load of the busiest core: {load:g} rank(s)" in json.loads(r.stdout)["cores"]


def test_gpu_line_without_a_gpu_names_no_staging_pool(monkeypatch):
    from mpidist import gpu

    why = "no GPU here (libcudart installed, but no /dev/nvidia*)"
    monkeypatch.setattr(gpu, "absent", lambda: why)
    line = gpu.describe()
    assert line.endswith(f"{why}: every buffer is host memory"), line
    assert "pinned" not in line
    monkeypatch.setattr(gpu, "absent", lambda: None)
    assert "staged through a reused pinned host pool" in gpu.describe()


def test_gpu_libraries_are_found_without_importing_them():
    code = ("import json, sys; from mpidist import gpu; "
            "print(json.dumps([gpu.device_libraries(), 'torch' in sys.modules, 'cupy' in sys.modules]))")
    r = run_python(["-c", code], timeout=60)
    assert r.returncode == 0, r.stderr
    found, torch_imported, cupy_imported = json.loads(r.stdout)
    assert not torch_imported and not cupy_imported
    torch = pytest.importorskip("torch", reason="torch is not installed")
    assert ("torch (CUDA)" in found) == (torch.version.cuda is not None)
    assert ("torch (ROCm)" in found) == (getattr(torch.version, "hip", None) is not None)

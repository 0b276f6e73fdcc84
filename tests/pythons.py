"""The demo and the core subset under every Python the package claims (the end of ``make test``).

For each version (``run_suite.py --pythons "3.9 3.10 3.11 3.12 3.13"``), as a user would:
``make venv-demo PYTHON=python3.X`` (only the demo's extras, in ``.venv-python3.X``), a check
that torch is not in that virtualenv, then the user's own command ``make demo PYTHON=python3.X``.
On the oldest and the newest version the virtualenv also gets the test extras
(``make venv-core``) and the core subset (run_suite's ``OPENMPI_SUBSET`` files) runs there,
serially and under ``mpiexec``. A version this machine lacks (not on PATH, not under pyenv)
is skipped with the reason. The Makefile alone decides which interpreter ``PYTHON=python3.X``
means (``make python-path``), so this module and a user's ``make demo`` agree.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Seconds for one ``make venv-*`` (downloads on a cold pip cache included).
INSTALL_TIMEOUT = 900
#: torch must not be importable from a demo virtualenv (the demo never waits for torch).
NO_TORCH = "import importlib.util as u, sys; sys.exit('torch is installed' if u.find_spec('torch') else 0)"


#: A nested ``make`` as a user types it: without the outer make's variables (``make test VENV=...``).
MAKE = ["env", "-u", "MAKEFLAGS", "-u", "MFLAGS", "-u", "MAKELEVEL", "make", "--no-print-directory"]


def _make(target: str, version: str) -> list[str]:
    return [*MAKE, target, f"PYTHON=python{version}"]


def venv(version: str) -> str:
    """The virtualenv the Makefile gives ``PYTHON=python<version>``."""
    return f".venv-python{version}"


def interpreter(version: str) -> tuple[str | None, str]:
    """(path, "") of the interpreter ``make`` takes for ``python<version>``, or (None, why not)."""
    r = subprocess.run([*_make("python-path", version), "-s"], cwd=ROOT, text=True, capture_output=True)
    if r.returncode == 0 and r.stdout.strip():
        return r.stdout.strip(), ""
    return None, (r.stderr.strip().splitlines() or [f"make python-path failed ({r.returncode})"])[0]


def runs(versions: list[str], files: list[str], sizes: list[int], opts: list[str], timeout: int,
         no_abort: dict[str, str]) -> tuple[list[tuple], list[str], set[str]]:
    """The runs for ``versions``: (runs as run_suite's tuples, skip reasons, labels counted as one test).

    ``files`` is the core subset, run on the first and last version at the world ``sizes``.
    """
    out: list[tuple] = []
    skipped: list[str] = []
    checks: set[str] = set()
    core = {versions[0], versions[-1]} if versions else set()
    for v in versions:
        exe, why = interpreter(v)
        if exe is None:
            skipped.append(f"python{v}: {why}")
            continue
        label = f"python{v}"
        py = str(ROOT / venv(v) / "bin" / "python")
        out.append((f"{label} venv-demo", _make("venv-demo", v), 1, {}, INSTALL_TIMEOUT))
        out.append((f"{label} has no torch", [py, "-c", NO_TORCH], 1, {}, 60))
        out.append((f"{label} demo", _make("demo", v), 1, {}, timeout))
        checks.update({f"{label} has no torch", f"{label} demo"})
        if v not in core or not files:
            continue
        out.append((f"{label} venv-core", _make("venv-core", v), 1, {}, INSTALL_TIMEOUT))
        out.append((f"{label} serial", [py, "-m", "pytest", *opts, *files], 1, {}, timeout))
        mpiexec = str(ROOT / venv(v) / "bin" / "mpiexec")
        out += [(f"{label} mpiexec -n {n}", [mpiexec, "-n", str(n), py, "-m", "pytest", "--only-mpi", *opts,
                                             *files], n, no_abort, timeout) for n in sizes]
    return out, skipped, checks

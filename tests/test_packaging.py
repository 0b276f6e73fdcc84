"""Packaging as a user meets it: ``python -m build``'s sdist and wheel, installed into a clean virtualenv.

Serial (about a minute): the tracked files are copied to a temporary directory and built there
(sdist, then the wheel from the sdist, so the sdist provably builds the C kernel). The wheel is
installed with the ``mpich`` extra into a new virtualenv and a 2-rank job checks a float32 and a
float16 ``all_reduce`` against numpy, from outside the repository (the installed package, not
the sources). The sdist is then installed with no C compiler (``CC=false``): mpidist installs
without the kernel, and the float16 reduction still comes out right, in numpy
(and the float32 one through mpi4py). The metadata states
every Python the Makefile tries, ranges (no pins), the license file, ``Typing :: Typed``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("build", reason="python -m build is not installed (pip install 'mpidist[test]')")

SMOKE = r"""
import sys, numpy as np, mpidist as dist
from mpidist.calls import lowprec_math
dist.init_process_group("mpi")
r, n = dist.get_rank(), dist.get_world_size()
x = np.arange(5, dtype=np.float32) + r
dist.all_reduce(x)
assert (x == sum(np.arange(5, dtype=np.float32) + k for k in range(n))).all(), x
h = (np.arange(7, dtype=np.float32) / 3 + r).astype(np.float16)
want = sum((np.arange(7, dtype=np.float32) / 3 + k).astype(np.float16).astype(np.float32) for k in range(n))
dist.all_reduce(h)
assert (h == want.astype(np.float16)).all(), (h, want)
if r == 0:
    print("kernel", lowprec_math._kernel.isa if lowprec_math._kernel else None, "from", dist.__file__)
dist.destroy_process_group()
"""


def _run(cmd: list, timeout: int = 600, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def _tracked_files() -> list[str]:
    r = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip(f"not a git checkout ({r.stderr.strip()}): cannot tell the tracked files")
    return [f for f in r.stdout.splitlines() if (ROOT / f).is_file()]


@pytest.fixture(scope="module")
def dist_dir(tmp_path_factory) -> Path:
    """The sdist and the wheel, built from a copy of the tracked files."""
    src = tmp_path_factory.mktemp("src")
    for f in _tracked_files():
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f)
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", out, src], timeout=900)
    return out


def _one(d: Path, pattern: str) -> Path:
    found = sorted(d.glob(pattern))
    assert len(found) == 1, (pattern, found)
    return found[0]


def _metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(z.read(name).decode())


def _makefile_pythons() -> list[str]:
    m = re.search(r"^PYTHONS \?= (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert m, "Makefile: no PYTHONS ?= line"
    return m.group(1).split()


def test_wheel_holds_the_kernel_the_marker_and_the_license(dist_dir):
    with zipfile.ZipFile(_one(dist_dir, "*.whl")) as z:
        names = z.namelist()
    if shutil.which(os.environ.get("CC", "cc")):
        assert [n for n in names if re.fullmatch(r"mpidist/calls/_lowprec\..*\.so", n)], names
    assert "mpidist/py.typed" in names
    assert [n for n in names if re.search(r"\.dist-info/(licenses/)?LICENSE$", n)], names
    assert not [n for n in names if n.startswith("tests/")]


def test_sdist_holds_what_the_build_and_the_reader_need(dist_dir):
    with tarfile.open(_one(dist_dir, "*.tar.gz")) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    need = {"setup.py", "setup.cfg", "pyproject.toml", "mpidist/calls/_lowprec.c",
            "mpidist/py.typed",
            "LICENSE", "README.md", "CHANGELOG.md"}
    assert need <= names, need - names


def test_metadata_claims_what_is_tried(dist_dir):
    meta = _metadata(_one(dist_dir, "*.whl"))
    assert meta["Requires-Python"] == ">=3.9"
    classifiers = meta.get_all("Classifier")
    claimed = [c.rsplit(" ", 1)[1] for c in classifiers
               if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
    assert claimed == _makefile_pythons(), "each Python claimed is one make test tries"
    assert claimed[0] == meta["Requires-Python"][2:]
    assert "Typing :: Typed" in classifiers
    assert meta.get_all("Project-URL") and (meta["License-Expression"] or meta["License"]) == "MIT"
    requires = meta.get_all("Requires-Dist")
    assert [r for r in requires if "==" in r.split(";")[0]] == [], "ranges, not pins (constraints.txt pins)"
    torch = [r for r in requires if r.startswith("torch")]
    assert torch and ">=" in torch[0], torch


@pytest.fixture(scope="module")
def clean_venv(tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", venv], timeout=300)
    return venv


def _smoke(venv: Path, cwd: Path) -> str:
    r = _run(["timeout", "-k", "10", "240", venv / "bin" / "mpiexec", "-n", "2", venv / "bin" / "python",
              "-c", SMOKE], timeout=300, cwd=cwd)
    assert str(venv) in r.stdout, r.stdout  # the installed copy, not the repository's
    return r.stdout


def test_wheel_and_sdist_install_into_a_clean_venv(dist_dir, clean_venv, tmp_path):
    pip = [clean_venv / "bin" / "python", "-m", "pip", "install", "--no-compile"]
    # the sdist without a C compiler: a warning, no kernel, float16 in numpy
    no_cc = dict(os.environ, CC="false")
    _run([*pip, f"{_one(dist_dir, '*.tar.gz')}[mpich]"], timeout=900, env=no_cc)
    out = _smoke(clean_venv, tmp_path)
    assert "kernel None from" in out, out
    # the wheel: the kernel, loops chosen for this CPU at run time
    _run([*pip, "--force-reinstall", "--no-deps", _one(dist_dir, "*.whl")])
    if shutil.which(os.environ.get("CC", "cc")):
        out = _smoke(clean_venv, tmp_path)
        assert re.search(r"kernel (avx2\+f16c|portable) from", out), out


def test_torch_extra_keeps_the_installed_torch(dist_dir):
    """``pip install "mpidist[torch]"`` where torch is installed: pip keeps it (a range, not a pin).

    A dry run against this very virtualenv, offline and without the machine's pip settings: pip
    resolves the extra from what is installed and would install nothing but mpidist itself.
    """
    torch = pytest.importorskip("torch", reason="torch is not installed here")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    r = _run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--quiet", "--report", "-",
              f"{_one(dist_dir, '*.whl')}[torch]"], env=env)
    installs = {i["metadata"]["name"]: i["metadata"]["version"] for i in json.loads(r.stdout)["install"]}
    assert set(installs) <= {"mpidist"}, f"pip would install {installs} (torch here: {torch.__version__})"

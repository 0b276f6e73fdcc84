"""accelerate's own test scripts, from the installed package, unmodified, at 2 ranks on mpidist and on gloo.

Serial tests, one per script; each starts two jobs under a timeout, in a folder of its own:

- the reference, as accelerate tests multi-CPU runs itself (``debug_launcher``: ``ACCELERATE_USE_CPU``,
  ``ACCELERATE_MIXED_PRECISION=no``, gloo on the loopback): ``torchrun --standalone --nproc-per-node 2``;
- mpidist: ``mpiexec -n 2 python -m mpidist.run --backend-for-cpu mpidist SCRIPT``, which sets
  ``ACCELERATE_USE_CPU`` itself on a host without an accelerator.

Both must end with status 0, print what shows two ranks on ``MULTI_CPU`` and the script's own
distributed-only steps, and print the same section headers in the same order; rank 0
of the mpidist job says once that gloo runs on mpidist. The wall time of each run is printed.

``test_script.py``, ``test_ops.py`` and ``test_sync.py`` run whole. ``test_distributed_data_loop.py``
runs through ``job_accelerate_data_loop.py``: its ``main()``, less the join tests, which are
GPU-only by design (that file says why); each is named in a ``SKIPPED`` line. The script's own
branches stay as written: ``test_script.py`` skips its ``datasets.Dataset`` split where
Hugging Face ``datasets`` is missing, and ``test_sync.py`` runs its ``accumulate`` matrix on
accelerators only. Not run: ``test_ddp_comm_hook.py`` (its reference DDP passes ``device_ids``,
which torch refuses for a CPU module), ``test_merge_weights.py`` (FSDP as ``accelerate launch
--use_fsdp`` sets it up; "requires at least two accelerators"), ``test_notebook.py`` (a launcher
of its own) and ``test_cli.py`` (no collective).
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest
from launcher import _run
from libraries import ANNOUNCED, OFFLINE, need
from torch_scripts import TORCHRUN, clean_env, mpi

pytest.importorskip("torch", reason="torch is not installed (pip install 'mpidist[torch]')")

N = 2
TIMEOUT = 300
HERE = Path(__file__).resolve().parent
#: no download; Python's warnings left on: test_distributed_data_loop.py checks some
ENV = {**{k: v for k, v in OFFLINE.items() if k != "PYTHONWARNINGS"}, "ACCELERATE_MIXED_PRECISION": "no"}
#: what accelerate's debug_launcher sets for its multi-CPU runs, with torchrun's variables
GLOO = {"ACCELERATE_USE_CPU": "yes", "GLOO_SOCKET_IFNAME": "lo"}
#: the scripts' section headers, which rank 0 alone prints, compared between the two runs (the
#: ranks share one pipe, so a line that every rank prints can end glued to another rank's)
SECTIONS = re.compile(r"\*\*[^*\n]+\*\*|^(?:testing|Test|SKIPPED|RAN) .*$", re.MULTILINE)
#: per script: what each run must print (line, how many times)
SHOWS = {
    "test_script.py": [("Num processes: 2", N), ("Process index: 1", 1),
                       ("Distributed environment: DistributedType.MULTI_CPU", N),
                       ("**Test reinstantiated state**", 1)],
    "test_ops.py": [("Num processes: 2", 1), ("DistributedType.MULTI_CPU", 1),
                    ("testing sending tensors across devices", 1)],
    "test_sync.py": [("**Test Distributed `no_sync` context manager**", 1),
                     ("**Test Distributed `no_sync` context manager with multiple forwards**", 1)],
    "test_distributed_data_loop.py": [("Test DataLoader with sampler as an instance of `BatchSampler`", 1)],
}


def _script(name: str) -> str:
    if name == "test_distributed_data_loop.py":
        return str(HERE / "job_accelerate_data_loop.py")
    from accelerate.test_utils import path_in_accelerate_package

    return str(path_in_accelerate_package("test_utils", "scripts", name))


def _sections(text: str) -> list[str]:
    return SECTIONS.findall(text)


def _data_loop_lines(r, where: str) -> None:
    """The driver's SKIPPED lines name exactly the skipped tests; its RAN line every other test of main()."""
    from accelerate.utils import is_torchdata_stateful_dataloader_available
    from job_accelerate_data_loop import GPU_ONLY, NEED_TORCHDATA, called_by_main

    skipped = dict(GPU_ONLY)
    if not is_torchdata_stateful_dataloader_available():
        if os.environ.get("MPIDIST_REQUIRE_LIBRARIES") == "1":
            pytest.fail("torchdata should be installed (make venv-libraries): accelerate's "
                        "StatefulDataLoader tests need it")
        skipped.update(NEED_TORCHDATA)
    said = sorted(line for line in r.stdout.splitlines() if line.startswith("SKIPPED "))
    assert said == sorted(f"SKIPPED {name}: {why}" for name, why in skipped.items()), (where, said)
    print(f"{where}:", *said, sep="\n  ")
    ran = [line.split()[1:] for line in r.stdout.splitlines() if line.startswith("RAN ")]
    assert ran == [[name for name in called_by_main() if name not in skipped]], (where, ran)


@pytest.mark.parametrize("name", list(SHOWS))
def test_accelerate_script_on_mpidist_as_on_gloo(tmp_path, name):
    need("accelerate")
    script = _script(name)
    runs = {}
    for label in ("gloo", "mpidist"):
        cwd = tmp_path / label  # test_script.py writes a file into its working directory
        cwd.mkdir()
        start = time.monotonic()
        if label == "gloo":
            r = _run([sys.executable, *TORCHRUN, str(N), script], TIMEOUT,
                     clean_env(PYTHONUNBUFFERED="", **ENV, **GLOO), cwd)
        else:
            r = mpi(N, ["-m", "mpidist.run", "--backend-for-cpu", "mpidist", script], env=ENV,
                    timeout=TIMEOUT, cwd=cwd)
        runs[label] = r
        print(f"{name} {label}: {time.monotonic() - start:.1f} s")
        where = f"{name} on {label}"
        assert r.returncode == 0, f"{where}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
        for line, count in SHOWS[name]:
            assert r.stdout.count(line) == count, (where, line, r.stdout[-3000:])
        if name == "test_distributed_data_loop.py":
            _data_loop_lines(r, where)
    sections = _sections(runs["gloo"].stdout)
    assert len(sections) >= 4 and _sections(runs["mpidist"].stdout) == sections
    assert runs["mpidist"].stderr.count(ANNOUNCED) == 1, runs["mpidist"].stderr[-3000:]
    assert ANNOUNCED not in runs["gloo"].stderr

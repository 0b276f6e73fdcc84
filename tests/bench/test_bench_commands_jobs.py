"""Every benchmark command the README and the docs show runs, at tiny sizes, so none can rot.

The commands are read from the pages themselves; each script's tiny-size options are added at
the end (argparse keeps the last value given). A command for a script that has no tiny options
here fails the first test, so a new benchmark shown in the docs gets a smoke run too. Serial
tests; each starts its own job through ``launcher``, under a timeout.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cluster import harness
from launcher import ROOT, run_mpi

PAGES = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"(?:mpiexec -n (\d+) )?python (benchmarks/\w+\.py)((?: --?[\w-]+(?: [\w.,]+)?)*)")

#: The tiny-size options of each script; "{out}" is the test's own folder.
TINY: dict[str, list[str]] = {
    "run.py": ["--sizes", "8", "--rounds", "1", "--target", "0.0002", "--calls", "all_reduce,broadcast",
               "--impls", "mpidist,mpi4py", "--out", "{out}", "--no-plot"],
    "allreduce.py": ["--sizes", "8", "--rounds", "1", "--target", "0.0002", "--impls", "mpidist,mpi4py",
                     "--out", "{out}", "--no-plot"],
    "hotpath.py": ["-n", "5", "--warmup", "2", "--calls", "all_reduce", "--impls", "mpidist,mpi4py"],
    "mixed_precision.py": ["--sizes", "1K", "--rounds", "1", "--target", "0.001",
                           "--dtypes", "float32,float16"],
    "thread_levels.py": ["--ranks", "2", "--calls", "all_reduce", "--impls", "mpidist,mpi4py", "--sizes", "8",
                         "--repeats", "1", "--rounds", "1", "--target", "0.0005", "--timeout", "150",
                         "--out", "{out}"],
    "groupby.py": ["--rows", "2000", "--keys", "10", "--ranks", "1,2", "--modes", "root", "--aggs", "sum",
                   "--repeat", "1", "--timeout", "150"],
    "torch_backend.py": ["--max-bytes", "64", "--reps", "2", "--trials", "1", "--large-width", "16",
                         "--ddp-reps", "2", "--rounds", "1", "--sample-us", "5"],
    "torch_layers.py": ["--sizes", "4", "--sweep", "0,4KiB", "--rounds", "1", "--target", "0.0005",
                        "--sweep-reps", "3"],
    "waits.py": ["--rounds", "1", "--target", "0.0005"],
    "late.py": ["--rounds", "4"],
    "scale.py": ["--ranks", "2", "--rounds", "1", "--target", "0.0005", "--timeout-s", "0.5",
                 "--out", "{out}", "--no-plot"],
    "debug_overhead.py": ["--calls", "20", "--rounds", "1"],
    "network.py": ["--rates", "1gbit", "--sizes", "8", "--rounds", "1", "--target", "0.0005",
                   "--calls", "all_reduce", "--ddp-reps", "1", "--out", "{out}"],
    "check_instructions.py": ["-n", "5", "--modes", "default"],  # 2 runs under callgrind
}
#: Options that a command across nodes gets instead: two nodes, the fewest that are a cluster.
TINY_NODES = ["--nodes", "2"]


def _cluster() -> str | None:
    why = harness.unavailable_reason()  # it probes `ip netns`: asked only when it matters
    return why and f"simulated nodes (root, network namespaces): {why}"


#: Commands that need what a plain test machine lacks: the reason, or None where it is there
#: (a function: asked only when such a command is to run).
NEEDS = {
    "network.py": _cluster,
    "--nodes": _cluster,
    "--callgrind": None if shutil.which("valgrind") else "valgrind",
    "check_instructions.py": None if shutil.which("valgrind") else "valgrind",
}


def commands() -> list[tuple[int | None, str, list[str]]]:
    """(ranks or None for a plain ``python``, script, its options) of each command shown; at
    most 2 ranks (the smoke run checks that a command works, not how it scales)."""
    found = set()
    for page in PAGES:
        for n, script, opts in COMMAND.findall(page.read_text()):
            found.add((min(int(n), 2) if n else None, script, tuple(opts.split())))
    return sorted(found, key=lambda c: (c[1], c[2], c[0] or 0))


def test_every_command_shown_has_tiny_options():
    shown = {Path(script).name for _, script, _ in commands()}
    assert {"run.py", "torch_backend.py", "allreduce.py"} <= shown, shown
    assert shown <= set(TINY), shown - set(TINY)


def _id(v: object) -> str:
    return " ".join(v) if isinstance(v, tuple) else str(v)


@pytest.mark.parametrize("n,script,opts", commands(), ids=_id)
def test_command_runs_at_tiny_sizes(tmp_path: Path, n, script, opts):
    name = Path(script).name
    for need, why in NEEDS.items():
        reason = why() if callable(why) and (need == name or need in opts) else why
        if reason and (need == name or need in opts):
            pytest.skip(f"needs {reason}")
    tiny = TINY[name] + (TINY_NODES if "--nodes" in opts else [])
    args = [script, *opts, *(a.replace("{out}", str(tmp_path)) for a in tiny)]
    if n is None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDI_", "HYDRA_"))}
        proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=400, env=env)
    else:
        proc = run_mpi(n, args, timeout=400)
    assert proc.returncode == 0, f"{' '.join(args)}\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}"

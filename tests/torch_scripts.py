"""The torch examples under torchrun, torch's own launcher: the reference other launches must match.

Shared by the tests of ``python -m mpidist.run`` (start/test_run_module.py) and of the same
scripts under Slurm (slurm/test_slurm_run.py). ``dump_script`` (conftest.py) writes what each
rank's environment held; :func:`torchrun` trains an example with torch's own gloo.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import subprocess
import sys

import pytest
from launcher import ROOT, _run, mpiexec_path

from mpidist.start import torchrun_env

EXAMPLES = ROOT / "examples"
TORCHRUN_STYLE = str(EXAMPLES / "torchrun_style.py")
DETR_STYLE = str(EXAMPLES / "detr_style" / "main.py")
#: torch's own launcher; --standalone: a free port, not the fixed default another job may hold
TORCHRUN = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node")
FINAL = re.compile(r"^final: (.*)$", re.MULTILINE)
# Variables a launcher or an earlier job may have left; every job here starts without them.
_LEFTOVERS = ("PMI_", "PMIX_", "HYDI_", "HYDRA_", "MPI_LOCAL", "OMPI_", "PRTE_", "SLURM_", "RANK",
              "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_", "ROLE_", "MASTER_", "TORCHELASTIC_",
              "TORCH_NCCL_ASYNC", "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MPIDIST_ABORT_ON_ERROR")
#: torchrun's values that differ by design (see mpidist/start/torchrun_env.py).
_DIFFER = {"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE"}

DUMP = """
import json, os, sys
rank = os.environ.get("PMI_RANK") or os.environ.get("RANK") or os.environ["SLURM_PROCID"]
with open(os.path.join(os.environ["DUMP_DIR"], f"{os.environ['DUMP_TAG']}-{rank}.json"), "w") as f:
    json.dump({"env": dict(os.environ), "argv": sys.argv, "name": __name__, "path0": sys.path[0]}, f)
"""


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LEFTOVERS)}
    env.update(extra)
    return env


def mpi(n: int, args: list[str], env: dict[str, str] | None = None, timeout: float = 120,
        cwd=ROOT) -> subprocess.CompletedProcess:
    """``mpiexec -n n python <args>`` from a clean environment plus ``env``."""
    return _run([mpiexec_path(), "-n", str(n), sys.executable, *args], timeout,
                clean_env(PYTHONUNBUFFERED="", **(env or {})), cwd)


def python(args: list[str], env: dict[str, str] | None = None, timeout: float = 120
           ) -> subprocess.CompletedProcess:
    """A plain ``python <args>`` (torchrun, or an MPI singleton) from a clean environment plus ``env``."""
    return _run([sys.executable, *args], timeout, clean_env(PYTHONUNBUFFERED="", **(env or {})), ROOT)


def dumps(where, tag: str) -> dict[int, dict]:
    """``{rank: {"env", "argv", "name", "path0"}}`` as each rank of job ``tag`` wrote it."""
    out = {}
    for path in where.glob(f"{tag}-*.json"):
        d = out[int(path.stem.rsplit("-", 1)[1])] = json.loads(path.read_text())
        d["env"].pop("DUMP_TAG")
    return out


#: A launcher's own variables, which differ from one job step to the next (ports, step ids).
_LAUNCHER_OWN = ("PMI_", "PMIX_", "HYDI_", "HYDRA_", "MPI_LOCAL", "OMPI_", "PRTE_", "SLURM_")


def added(job: dict[int, dict], base: dict[int, dict]) -> dict[int, dict[str, str]]:
    """Per rank, the variables ``job`` has that ``base`` lacks or sets otherwise (launchers' own aside)."""
    return {r: {k: v for k, v in d["env"].items()
                if base[r]["env"].get(k) != v and not k.startswith(_LAUNCHER_OWN)} for r, d in job.items()}


def _loopback(host: str) -> bool:
    return all(ipaddress.ip_address(i[4][0]).is_loopback
               for i in socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM))


def torchrun_dumps(dump_script, where, n: int) -> tuple[dict[int, dict], dict[str, str]]:
    """What each of torchrun's ``n`` workers saw, and the environment torchrun was started with."""
    ref = python([*TORCHRUN, str(n), str(dump_script)], {"DUMP_DIR": str(where), "DUMP_TAG": "torchrun"})
    assert ref.returncode == 0, ref.stderr[-3000:]
    return dumps(where, "torchrun"), clean_env(PYTHONUNBUFFERED="", DUMP_DIR=str(where))


def assert_like_torchrun(theirs: dict[int, dict], started_with: dict[str, str], base: dict[int, dict],
                         mine: dict[int, dict]) -> None:
    """What mpidist.run added to each rank (``mine`` less ``base``) is what torchrun added.

    Key by key: the same variables (less :data:`~mpidist.start.torchrun_env.AGENT_ONLY`), the
    same values but for the address, port and run id (one per job) and the agent store.
    """
    n = len(theirs)
    assert sorted(theirs) == sorted(base) == sorted(mine) == list(range(n))
    want = {r: {k: v for k, v in d["env"].items() if started_with.get(k) != v} for r, d in theirs.items()}
    got = added(mine, base)
    for r in range(n):
        assert "RANK" in want[r] and "MASTER_PORT" in want[r], want[r]  # the reference is real
        expected_keys = set(want[r]) - set(torchrun_env.AGENT_ONLY)
        assert set(got[r]) == expected_keys, (r, sorted(set(got[r]) ^ expected_keys))
        for key in expected_keys - _DIFFER:
            assert got[r][key] == want[r][key], (r, key, got[r][key], want[r][key])
        assert _loopback(got[r]["MASTER_ADDR"]) and _loopback(want[r]["MASTER_ADDR"])
        assert 0 < int(got[r]["MASTER_PORT"]) < 65536
        store = "TORCHELASTIC_USE_AGENT_STORE"  # torchrun's agent serves the store; here rank 0 serves
        assert (want[r][store], got[r][store]) == ("True", "True")  # it as an agent store: all connect
    for key in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        assert len({got[r][key] for r in range(n)}) == 1, key


def finals(r: subprocess.CompletedProcess) -> dict[str, str]:
    assert r.returncode == 0, r.stderr[-3000:]
    found = FINAL.findall(r.stdout)
    assert len(found) == 1, r.stdout  # rank 0 alone prints it, after every rank's hash matched
    return dict(item.split("=", 1) for item in found[0].split())


def torchrun(script: str, *args: str, n: int = 4) -> dict[str, str]:
    """The reference: the script under torchrun with torch's own gloo, on the loopback interface.

    Pinned to ``lo`` so that another interface (a simulated cluster's bridge, tests/cluster/)
    is never chosen. The examples free their DDP model before ``destroy_process_group``: a
    gloo group left to interpreter exit aborted 1 run in 6 (see examples/detr_style/main.py).
    """
    return finals(python([*TORCHRUN, str(n), script, *args], {"GLOO_SOCKET_IFNAME": "lo"}, timeout=300))


def same_training(got: dict[str, str], ref: dict[str, str], bitwise: bool) -> None:
    assert got["world_size"] == ref["world_size"] == "4"
    assert float(ref["test_accuracy"]) > 0.8  # it learnt
    if bitwise:  # the same backend (gloo) in the same order: the same bits
        assert got == ref
        return
    # another backend sums in another order: equal up to rounding
    assert got["params_sha256"] != ref["params_sha256"] or got == ref
    assert float(got["test_loss"]) == pytest.approx(float(ref["test_loss"]), rel=1e-4)
    assert abs(float(got["test_accuracy"]) - float(ref["test_accuracy"])) <= 0.005

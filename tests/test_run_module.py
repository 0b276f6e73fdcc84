"""``python -m mpidist.run``: torchrun's variables from MPI, the examples against torchrun, bad input.

Serial tests that start their own jobs: ``mpiexec`` (tests/launcher.py) and torchrun
(``python -m torch.distributed.run``, torch's own launcher) as the reference.
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

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'mpidist[torch]')")

from mpidist import torchrun_env  # noqa: E402
from mpidist.run import Command, UsageError, parse  # noqa: E402

EXAMPLES = ROOT / "examples"
TORCHRUN_STYLE = str(EXAMPLES / "torchrun_style.py")
DETR_STYLE = str(EXAMPLES / "detr_style" / "main.py")
#: torch's own launcher; --standalone: a free port, not the fixed default another job may hold
TORCHRUN = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node")
FINAL = re.compile(r"^final: (.*)$", re.MULTILINE)
# Variables a launcher or an earlier job may have left; every job here starts without them.
_LEFTOVERS = ("PMI_", "PMIX_", "HYDI_", "HYDRA_", "MPI_LOCAL", "OMPI_", "PRTE_", "SLURM_", "RANK",
              "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_", "ROLE_", "MASTER_", "TORCHELASTIC_",
              "TORCH_NCCL_ASYNC", "OMP_NUM_THREADS", "MPIDIST_ABORT_ON_ERROR")
#: torchrun's values that differ by design (see mpidist/torchrun_env.py).
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


@pytest.fixture(scope="module")
def dump_script(tmp_path_factory):
    path = tmp_path_factory.mktemp("run") / "dump_env.py"
    path.write_text(DUMP)
    return path


def torchrun_dumps(dump_script, where, n: int) -> tuple[dict[int, dict], dict[str, str]]:
    """What each of torchrun's ``n`` workers saw, and the environment torchrun was started with."""
    ref = python([*TORCHRUN, str(n), str(dump_script)], {"DUMP_DIR": str(where), "DUMP_TAG": "torchrun"})
    assert ref.returncode == 0, ref.stderr[-3000:]
    return dumps(where, "torchrun"), clean_env(PYTHONUNBUFFERED="", DUMP_DIR=str(where))


def assert_like_torchrun(theirs: dict[int, dict], started_with: dict[str, str], base: dict[int, dict],
                         mine: dict[int, dict]) -> None:
    """What mpidist.run added to each rank (``mine`` less ``base``) is what torchrun added.

    Key by key: the same variables (less :data:`~mpidist.torchrun_env.AGENT_ONLY`), the
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
        store = "TORCHELASTIC_USE_AGENT_STORE"  # torchrun's agent serves the store; here rank 0 does
        assert (want[r][store], got[r][store]) == ("True", "False")
    for key in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        assert len({got[r][key] for r in range(n)}) == 1, key


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_variables_equal_torchruns(dump_script, n, tmp_path):
    theirs, started_with = torchrun_dumps(dump_script, tmp_path, n)
    bare = mpi(n, [str(dump_script)], {"DUMP_DIR": str(tmp_path), "DUMP_TAG": "bare"})
    ours = mpi(n, ["-m", "mpidist.run", str(dump_script), "--flag", "x"],
               {"DUMP_DIR": str(tmp_path), "DUMP_TAG": "ours"})
    assert bare.returncode == 0 and ours.returncode == 0, bare.stderr[-2000:] + ours.stderr[-2000:]
    mine = dumps(tmp_path, "ours")
    assert_like_torchrun(theirs, started_with, dumps(tmp_path, "bare"), mine)
    for r in range(n):  # the script runs as `python script.py --flag x` would run it
        assert mine[r]["argv"] == [str(dump_script), "--flag", "x"]
        assert mine[r]["name"] == "__main__" and mine[r]["path0"] == str(dump_script.parent)


def test_a_module_runs_with_its_arguments(dump_script):
    where = dump_script.parent
    r = mpi(2, ["-m", "mpidist.run", "-m", dump_script.stem, "a", "--b"],
            {"DUMP_DIR": str(where), "DUMP_TAG": "module"}, cwd=where)
    assert r.returncode == 0, r.stderr[-3000:]
    seen = dumps(where, "module")
    assert sorted(seen) == [0, 1]
    for rank, d in seen.items():
        assert d["argv"] == [str(dump_script), "a", "--b"] and d["name"] == "__main__"
        assert (d["env"]["RANK"], d["env"]["WORLD_SIZE"]) == (str(rank), "2")


# -- the examples against torchrun ----------------------------------------------------------

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


@pytest.mark.parametrize("backend_for_cpu", ["gloo", "mpidist"])
def test_torchrun_style_script_agrees_with_torchrun(torchrun_results, backend_for_cpu):
    got = finals(mpi(4, ["-m", "mpidist.run", "--backend-for-cpu", backend_for_cpu,
                                        TORCHRUN_STYLE, "--epochs", "2"], timeout=300))
    assert got["backend"] == backend_for_cpu
    same_training(got, torchrun_results["torchrun_style"], bitwise=backend_for_cpu == "gloo")


@pytest.mark.parametrize("route", ["mpidist.run", "init_distributed_mode"])
def test_detr_style_script_agrees_with_torchrun(torchrun_results, route, tmp_path):
    if route == "mpidist.run":  # unchanged: its own helper reads RANK/WORLD_SIZE/LOCAL_RANK
        args = ["-m", "mpidist.run", DETR_STYLE, "--output_dir", str(tmp_path)]
    else:  # its helper swapped for mpidist.init_distributed_mode(args)
        args = [DETR_STYLE, "--dist-init", "mpidist", "--output_dir", str(tmp_path)]
    r = mpi(4, [*args, "--epochs", "2"], timeout=300)
    got = finals(r)
    assert re.search(r"^backend: (\w+);", r.stdout, re.MULTILINE).group(1) == (
        "gloo" if route == "mpidist.run" else "mpidist")
    same_training(got, torchrun_results["detr_style"], bitwise=route == "mpidist.run")
    saved = torch.load(tmp_path / "checkpoint.pth", weights_only=False)  # save_on_master: rank 0 wrote it
    assert saved["epoch"] == 1 and set(saved["model"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}


def test_without_mpidist_run_a_torchrun_script_has_no_rank():
    # what torch users met before: mpirun gives none of torchrun's variables
    r = mpi(2, [TORCHRUN_STYLE], env={"MPIDIST_ABORT_ON_ERROR": "0"})
    assert r.returncode != 0 and r.stderr.count("KeyError: 'RANK'") == 2, r.stderr[-3000:]


# -- bad input: a clear error on every rank, no hang ---------------------------------------

def _error_lines(stderr: str) -> dict[int, str]:
    found = re.finditer(r"^mpidist\.run: rank (\d+): .*$", stderr, re.MULTILINE)
    return {int(m.group(1)): m.group(0) for m in found}


def test_a_missing_script_is_reported_on_every_rank():
    r = mpi(3, ["-m", "mpidist.run", "no/such/train.py", "--epochs", "1"], timeout=60)
    assert r.returncode == 1, r.stderr
    lines = _error_lines(r.stderr)
    assert sorted(lines) == [0, 1, 2], r.stderr
    assert all("script 'no/such/train.py' does not exist" in line for line in lines.values())


def test_a_missing_module_is_reported_on_every_rank():
    r = mpi(2, ["-m", "mpidist.run", "-m", "no_such_module_here"], timeout=60)
    assert r.returncode == 1
    lines = _error_lines(r.stderr)
    assert sorted(lines) == [0, 1], r.stderr
    assert all("no module named 'no_such_module_here'" in x for x in lines.values())


@pytest.mark.parametrize("var, value", [("RANK", "0"), ("LOCAL_WORLD_SIZE", "7"), ("WORLD_SIZE", "2")])
def test_torchrun_variables_that_contradict_mpi_stop_every_rank(dump_script, var, value):
    r = mpi(3, ["-m", "mpidist.run", str(dump_script)], env={var: value}, timeout=60)
    assert r.returncode == 1, r.stdout
    lines = _error_lines(r.stderr)
    assert sorted(lines) == [0, 1, 2], r.stderr
    for rank, line in lines.items():
        if value != {"RANK": str(rank), "LOCAL_WORLD_SIZE": "3", "WORLD_SIZE": "3"}[var]:
            assert f"${var}={value} but MPI gives" in line, line
        else:  # this rank's own value was right: it names the ranks whose value was not
            assert "cannot start" in line and f"${var}={value}" in line, line


def test_the_singleton_trap_is_refused(dump_script):
    r = python(["-m", "mpidist.run", str(dump_script)], env={"WORLD_SIZE": "4"}, timeout=60)
    assert r.returncode == 1 and "singleton trap" in r.stderr, r.stderr


SECOND_INIT = """
import torch.distributed as dist
dist.init_process_group("gloo")
dist.init_process_group("gloo")
"""


@pytest.mark.parametrize("abort", ["0", "1"])
def test_a_second_init_process_group_fails_on_every_rank(tmp_path, abort):
    script = tmp_path / "twice.py"
    script.write_text(SECOND_INIT)
    r = mpi(3, ["-m", "mpidist.run", str(script)], env={"MPIDIST_ABORT_ON_ERROR": abort},
                  timeout=120)
    assert r.returncode != 0
    twice = r"\[rank ?(\d)\]:? ValueError: trying to initialize the default process group twice"
    said = set(re.findall(twice, r.stderr))
    if abort == "0":  # every rank raises and reports it
        assert said == {"0", "1", "2"}, r.stderr[-3000:]
    else:  # fail fast: the first rank to raise ends the job, its traceback kept
        assert said and "MPI_Abort" in r.stderr, r.stderr[-3000:]


REUSE = """
import argparse, os, torch.distributed as dist, mpidist
if os.environ.get("HALF") and int(os.environ["RANK"]) == 0:  # rank 0 alone, as a world of one
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
elif not os.environ.get("HALF"):
    dist.init_process_group("gloo")
args = argparse.Namespace()
mpidist.init_distributed_mode(args, quiet_non_master=False)
print("REUSED", dist.get_rank(), args.dist_backend, args.world_size, flush=True)
"""


def test_init_distributed_mode_reuses_a_compatible_torch_group(tmp_path):
    script = tmp_path / "reuse.py"
    script.write_text(REUSE)
    r = mpi(3, ["-m", "mpidist.run", str(script)], timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(re.findall(r"^REUSED (\d) gloo 3$", r.stdout, re.MULTILINE)) == ["0", "1", "2"], r.stdout


def test_init_distributed_mode_refuses_a_torch_group_at_odds_with_mpi(tmp_path):
    script = tmp_path / "reuse.py"
    script.write_text(REUSE)
    r = mpi(3, ["-m", "mpidist.run", str(script)],
                  env={"HALF": "1", "MPIDIST_ABORT_ON_ERROR": "0"}, timeout=120)
    assert r.returncode != 0 and "REUSED" not in r.stdout
    said = re.findall(r"RuntimeError: init_distributed_mode: rank (\d): (.*)", r.stderr)
    assert sorted(rank for rank, _ in said) == ["0", "1", "2"], r.stderr[-3000:]
    text = dict(said)
    assert "already initialised as rank 0 of 1, but MPI gives rank 0 of 3" in text["0"]
    assert "not initialised here but is on other ranks" in text["1"]


# -- the command line and the backend mapping, in this process -------------------------------

def test_parse():
    assert parse(["train.py", "--lr", "1"]) == Command("train.py", False, ["--lr", "1"], "gloo")
    assert parse(["--backend-for-cpu", "mpidist", "-m", "pkg.train", "-m", "x"]) == \
        Command("pkg.train", True, ["-m", "x"], "mpidist")
    assert parse(["--backend-for-cpu=gloo", "-mpkg"]) == Command("pkg", True, [], "gloo")
    assert parse(["--", "-odd.py", "1"]) == Command("-odd.py", False, ["1"], "gloo")
    assert parse(["--help"]) is None
    for bad, says in ((["--backend-for-cpu", "nccl", "t.py"], "choose gloo or mpidist"), ([], "no script"),
                      (["--lr", "1"], "unknown option '--lr'"), (["-m"], "-m needs a module")):
        with pytest.raises(UsageError, match=says):
            parse(bad)


def test_usage_errors_exit_2_before_mpi():
    r = python(["-m", "mpidist.run", "--backend-for-cpu", "tcp", "t.py"], timeout=60)
    assert r.returncode == 2 and "choose gloo or mpidist" in r.stderr and "usage:" in r.stderr


def test_mapped_backend_names():
    from mpidist.torch.start import _mapped

    assert _mapped("gloo") == _mapped("GLOO") == "mpidist"
    assert _mapped("cpu:gloo,cuda:nccl") == "cpu:mpidist,cuda:nccl"
    assert _mapped("nccl") == "nccl" and _mapped("mpidist") == "mpidist"
    want_default = "mpidist" if torch.accelerator.current_accelerator() is None else None
    assert _mapped(None) == want_default
    assert sys.modules["mpidist.torch"]  # importing start registered the backend

"""``python -m mpidist.run``: torchrun's variables from MPI, the examples against torchrun, bad input.

Serial tests that start their own jobs: ``mpiexec`` (tests/launcher.py) and torchrun
(``python -m torch.distributed.run``, torch's own launcher) as the reference.
"""

from __future__ import annotations

import re
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'mpidist[torch]')")

from torch_scripts import (  # noqa: E402
    DETR_STYLE,
    TORCHRUN_STYLE,
    assert_like_torchrun,
    dumps,
    finals,
    mpi,
    python,
    same_training,
    torchrun_dumps,
)

from mpidist.run import Command, UsageError, parse  # noqa: E402


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
    want_default = None if torch.accelerator.is_available() else "mpidist"  # what the machine has
    assert _mapped(None) == want_default
    assert sys.modules["mpidist.torch"]  # importing start registered the backend

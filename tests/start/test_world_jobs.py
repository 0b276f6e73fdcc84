"""The default group in fresh processes: use before init, the singleton world, environment variables.

Serial tests; each starts its own job (``mpiexec`` or a plain ``python``) through ``launcher``.
"""

from __future__ import annotations

import json
import tempfile
import textwrap
from pathlib import Path

import pytest
from launcher import run_mpi, run_python

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import mpidist as dist
    out = {}
    def attempt(name, fn):
        try:
            out[name] = ["ok", repr(fn())]
        except Exception as exc:
            out[name] = [type(exc).__name__, str(exc)]
    for name in sys.argv[1:]:
        attempt(name, {
            "before_rank": lambda: dist.get_rank(),
            "before_all_reduce": lambda: dist.all_reduce(np.ones(1)),
            "before_new_group": lambda: dist.new_group([0]),
            "before_destroy": lambda: dist.destroy_process_group(),
            "store_no_rank": lambda: dist.init_process_group(store=object()),
            "init": lambda: dist.init_process_group(abort_on_error=False),
            "after_rank": lambda: (dist.get_rank(), dist.get_world_size()),
            "after_sum": lambda: float(dist.all_reduce(a := np.ones(1)) or a[0]),
        }[name])
    import os
    path = os.path.join(os.environ["PA_OUT"], f"{os.getpid()}.json")
    with open(path, "w") as f:
        json.dump(out, f)
""")


def run_script(names, n=None, env=None):
    """Run SCRIPT's named steps in a fresh job; one result dict per rank."""
    with tempfile.TemporaryDirectory() as out:
        args = ["-c", SCRIPT, *names]
        env = {**(env or {}), "PA_OUT": out}
        proc = run_mpi(n, args, timeout=90, env=env) if n else run_python(args, timeout=90, env=env)
        results = [json.loads(p.read_text()) for p in Path(out).glob("*.json")]
    assert len(results) == (n or 1), proc.stdout + proc.stderr
    return results


def test_use_before_init_and_singleton_world():
    names = ["before_rank", "before_all_reduce", "before_new_group", "before_destroy", "store_no_rank",
             "init", "after_rank", "after_sum"]
    (res,) = run_script(names, env={"RANK": "", "WORLD_SIZE": ""})
    for name in names[:4]:
        kind, msg = res[name]
        assert kind == "RuntimeError", res[name]
        assert "rank 0: the default process group is not initialized; call init_process_group() first" in msg
    assert res["store_no_rank"][0] == "ValueError"
    assert res["init"] == ["ok", "None"]
    assert res["after_rank"] == ["ok", "(0, 1)"]  # a process without a launcher is a world of 1
    assert res["after_sum"] == ["ok", "1.0"]


@pytest.mark.parametrize("var,value,what", [("RANK", "5", "rank"), ("WORLD_SIZE", "3", "world_size")])
def test_environment_mismatch_names_both_values(var, value, what):
    results = run_script(["init"], n=2, env={"RANK": "", "WORLD_SIZE": "", var: value})
    assert len(results) == 2
    for r, res in enumerate(sorted(results, key=lambda x: x["init"][1])):
        kind, msg = res["init"]
        assert kind == "ValueError", res
        actual = r if what == "rank" else 2
        assert f"${var}={value} disagrees with MPI, which gives this process {what}={actual}" in msg


def test_environment_that_agrees_is_accepted():
    results = run_script(["init", "after_rank", "after_sum"], n=2, env={"WORLD_SIZE": "2", "RANK": ""})
    assert sorted(r["after_rank"][1] for r in results) == ["(0, 2)", "(1, 2)"]
    assert all(r["after_sum"] == ["ok", "2.0"] for r in results)

"""MPIDIST_DEBUG=DETAIL set in the environment of a real job.

Serial tests; each starts its own ``mpiexec`` through ``launcher``, under a timeout.
"""

from __future__ import annotations

import textwrap

import pytest
from launcher import run_mpi

SCRIPT = textwrap.dedent("""
    import sys, time
    import numpy as np
    import mpidist as dist
    dist.init_process_group("mpi")
    r = dist.get_rank()
    # rank 1 passes a wrong-typed tensor: with MPIDIST_DEBUG=DETAIL every rank raises
    x = "oops" if r == 1 else np.ones(4, np.float32)
    try:
        dist.all_reduce(x)
    except (TypeError, ValueError) as e:
        err = f"{type(e).__name__}|{e}"
    y = np.ones(2)
    dist.all_reduce(y)
    with open(f"{sys.argv[1]}/rank{r}.txt", "w") as f:
        f.write(f"{err}|{y[0]}")
    dist.destroy_process_group()
""")


@pytest.mark.parametrize("n", [2, 3])
def test_env_detail_job_ends_with_every_rank_naming_the_bad_one(tmp_path, n):
    script = tmp_path / "bad.py"
    script.write_text(SCRIPT)
    proc = run_mpi(n, [str(script), str(tmp_path)], timeout=120, env={"MPIDIST_DEBUG": "DETAIL"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = {(tmp_path / f"rank{r}.txt").read_text() for r in range(n)}
    assert len(results) == 1, results  # the same error on every rank, then a working all_reduce
    kind, text, after = results.pop().split("|")
    assert kind == "TypeError" and "rank 1 passed str" in text and "rank 1 raised TypeError" in text
    assert float(after) == n

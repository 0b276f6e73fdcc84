"""monitored_barrier and the stall watch under injected failures: a rank that never arrives,
a rank that sleeps past the timeout, a job stuck past the group's timeout.

Serial tests; each starts its own ``mpiexec`` through ``launcher``, under a timeout.
"""

from __future__ import annotations

import textwrap
import time

import pytest
from launcher import run_mpi


def _results(tmp_path, n: int) -> dict[int, str]:
    return {r: (tmp_path / f"rank{r}.txt").read_text() for r in range(n)
            if (tmp_path / f"rank{r}.txt").exists()}


BARRIER = """
    dist.init_process_group("mpi")
    r, n = dist.get_rank(), dist.get_world_size()
    late = [int(x) for x in sys.argv[2].split(",")]
    mode = sys.argv[3]
    t0 = time.monotonic()
    msg = "passed"
    if r in late and mode == "absent":
        msg = "skipped"
    else:
        if r in late:
            time.sleep(4)
        try:
            dist.monitored_barrier(timeout=1.5, wait_all_ranks=(mode == "all"))
        except RuntimeError as e:
            msg = f"RuntimeError {time.monotonic() - t0:.2f} {e}"
    dist.barrier()
    if mode != "absent":  # an absent rank skipped a round: later rounds cannot line up
        dist.monitored_barrier(timeout=60)  # later rounds still work
    with open(f"{sys.argv[1]}/rank{r}.txt", "w") as f:
        f.write(msg)
    dist.destroy_process_group()
"""


@pytest.mark.parametrize("n,late,mode", [(2, [1], "absent"), (3, [2], "absent"), (4, [1], "sleep"),
                                         (2, [0], "sleep"), (3, [0], "sleep"), (4, [0], "sleep"),
                                         (4, [2, 3], "all")])
def test_missing_or_late_rank_is_named_on_every_rank(tmp_path, n, late, mode):
    script = tmp_path / "job.py"
    script.write_text("import sys, time\nimport mpidist as dist\n" + textwrap.dedent(BARRIER))
    proc = run_mpi(n, [str(script), str(tmp_path), ",".join(map(str, late)), mode], timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = _results(tmp_path, n)
    assert sorted(res) == list(range(n)), proc.stderr
    named = late[0] if len(late) == 1 else f"{late[0]}–{late[-1]}"  # consecutive: one range
    for r, msg in res.items():
        if r in late and mode == "absent":
            assert msg == "skipped"
            continue
        if 0 in late and r == 0:  # the monitor itself came late: the others gave up, so it raises too
            others = "1" if n == 2 else f"1–{n - 1}"  # a run of ranks reads as a range
            assert msg.startswith("RuntimeError"), (r, msg)
            assert f"came late: rank(s) {others} gave up waiting for it" in msg, msg
            continue
        assert msg.startswith("RuntimeError"), (r, msg)
        waited = float(msg.split()[1])
        if 0 in late:  # the others give up on the monitor and say so
            assert "rank 0 (group rank 0, which monitors the barrier) did not answer" in msg, msg
            assert waited < 4, msg
            continue
        assert f"rank{'s' if len(late) > 1 else ''} {named} did not reach" in msg or \
               f"rank(s) {named} did not reach" in msg, (r, msg)
        if r not in late:
            assert 1.4 < waited < 4, msg  # bounded by the timeout, not by the sleeper


STALL = """
    dist.init_process_group("mpi", timeout=timedelta(seconds=float(sys.argv[2])))
    r = dist.get_rank()
    if r == dist.get_world_size() - 1:
        time.sleep(float(sys.argv[3]))
    x = np.ones(3)
    dist.all_reduce(x)
    with open(f"{sys.argv[1]}/rank{r}.txt", "w") as f:
        f.write(str(x[0]))
    dist.destroy_process_group()
"""


def _stall_job(tmp_path, n, timeout_s, sleep_s):
    script = tmp_path / "job.py"
    script.write_text("import sys, time\nfrom datetime import timedelta\nimport numpy as np\n"
                      "import mpidist as dist\n" + textwrap.dedent(STALL))
    t0 = time.monotonic()
    proc = run_mpi(n, [str(script), str(tmp_path), str(timeout_s), str(sleep_s)], timeout=120,
                   env={"MPIDIST_STALL_WARN_S": "0.5"})
    return proc, time.monotonic() - t0


@pytest.mark.parametrize("n", [2, 3])
def test_stall_report_names_call_rank_and_wait(tmp_path, n):
    proc, _ = _stall_job(tmp_path, n, 600, 3)
    assert proc.returncode == 0, proc.stderr
    assert set(_results(tmp_path, n).values()) == {str(float(n))}
    for r in range(n - 1):  # the ranks that waited report it; the sleeper does not
        assert f"[rank {r}] mpidist stall: rank {r} has waited" in proc.stderr, proc.stderr
    assert "in all_reduce on group 'default_pg'" in proc.stderr
    assert f"[rank {n - 1}] mpidist stall" not in proc.stderr


@pytest.mark.parametrize("n", [2, 4])
def test_past_the_group_timeout_every_waiting_rank_raises(tmp_path, n):
    """An array collective raises GroupTimeoutError; uncaught, it ends the job (fail-fast)."""
    proc, took = _stall_job(tmp_path, n, 2, 60)
    assert proc.returncode != 0
    assert took < 45, took  # well before the sleeper would have arrived
    assert "uncaught GroupTimeoutError" in proc.stderr, proc.stderr
    assert "all_reduce #1 on group 'default_pg'" in proc.stderr and "Timed out after" in proc.stderr
    assert f"not heard from rank {n - 1} (" in proc.stderr
    assert _results(tmp_path, n) == {}


EXIT = """
    import atexit, sys, threading

    def after():  # registered before mpidist's own exit handlers, so it runs after them
        watching = [t for t in threading.enumerate() if t.name == "mpidist-stall-watch"]
        with open(f"{sys.argv[1]}/rank{r}.txt", "a") as f:
            f.write(" alive at exit" if any(t.is_alive() for t in watching) else " stopped at exit")

    atexit.register(after)
    import numpy as np
    import mpidist as dist

    dist.init_process_group("mpi")
    r = dist.get_rank()
    running = any(t.name == "mpidist-stall-watch" for t in threading.enumerate())
    with open(f"{sys.argv[1]}/rank{r}.txt", "w") as f:
        f.write("watched" if running else "not watched")
    x = np.ones(4)
    dist.all_reduce(x)
    dist.destroy_process_group()
"""


@pytest.mark.parametrize("n", [1, 3])
def test_the_stall_watch_stops_before_the_interpreter_finalizes(tmp_path, n):
    """The watch's daemon thread is stopped and joined at exit. Left running into finalization,
    a sample that held the last reference to a returned frame freed that frame's objects on the
    watch's thread; a torch process group freed there aborted the process ("terminate called
    without an active exception", about 1 run in 20 of ``torch_backend.py`` with loader workers)."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(EXIT))
    proc = run_mpi(n, [str(script), str(tmp_path)], timeout=120, env={"MPIDIST_STALL_WARN_S": "0.05"})
    assert proc.returncode == 0, proc.stderr
    assert _results(tmp_path, n) == {r: "watched stopped at exit" for r in range(n)}, proc.stderr

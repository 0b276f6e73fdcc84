"""Fail fast: a raise or an early exit on one rank ends the whole job, non-zero, visibly.

Each case is a real ``mpiexec`` job under a timeout (a hang fails the test instead of
the suite); none asserts on timing.
"""

from __future__ import annotations

import re
import textwrap

import pytest
from launcher import run_mpi

HEAD = """
import os, sys, threading, time
import numpy as np
import mpidist as dist

def say(*words):  # one write per line: ranks share the launcher's stdout
    sys.stdout.write(" ".join(map(str, words)) + "\\n")
    sys.stdout.flush()
"""


def _job(tmp_path, n, body, env=None, timeout=90, args=()):
    script = tmp_path / "job.py"
    script.write_text(HEAD + textwrap.dedent(body))
    return run_mpi(n, [str(script), *args], timeout=timeout, env=env)


def _waiting_ranks_abort(r, victim):
    assert r.returncode != 0
    assert f"rank(s) {victim} ended" in r.stderr, r.stderr
    assert "aborting the MPI job (MPI_Abort)" in r.stderr
    assert "after" not in r.stdout  # nobody got past the collective


@pytest.mark.parametrize("n", [3, 4])
def test_raise_on_one_rank_aborts_the_job(tmp_path, n):
    r = _job(tmp_path, n, """
        dist.init_process_group("mpi")
        if dist.get_rank() == n - 1:
            raise ValueError("boom from the last rank")
        dist.all_reduce(np.ones(3))
        say("after")
    """.replace("n - 1", str(n - 1)))
    assert r.returncode != 0
    assert f"[rank {n - 1}] uncaught ValueError in the main thread" in r.stderr, r.stderr
    assert f"[rank {n - 1}] ValueError: boom from the last rank" in r.stderr
    assert f"[rank {n - 1}] Traceback (most recent call last):" in r.stderr
    assert "after" not in r.stdout


def test_raise_in_a_thread_aborts_the_job(tmp_path):
    r = _job(tmp_path, 3, """
        dist.init_process_group("mpi")
        if dist.get_rank() == 2:
            def work():
                raise KeyError("from a worker thread")
            t = threading.Thread(target=work, name="worker")
            t.start(); t.join()
        dist.barrier()
        say("after")
    """)
    assert r.returncode != 0
    assert "[rank 2] uncaught KeyError in thread 'worker'" in r.stderr, r.stderr
    assert "after" not in r.stdout


@pytest.mark.parametrize("how", ["sys.exit(0)", "return", "sys.exit(3)"])
def test_early_exit_while_others_wait_ends_the_job(tmp_path, how):
    r = _job(tmp_path, 4, f"""
        def main():
            dist.init_process_group("mpi")
            if dist.get_rank() == 1:
                {how}
            dist.all_reduce(np.ones(3))
            say("after")
        main()
    """)
    _waiting_ranks_abort(r, 1)


def test_early_exit_in_a_subgroup_collective_and_p2p(tmp_path):
    r = _job(tmp_path, 3, """
        dist.init_process_group("mpi")
        me = dist.get_rank()
        if me == 2:
            sys.exit(0)
        if me == 0:
            buf = np.zeros(2)
            dist.recv(buf, src=2)
        else:
            dist.all_reduce(np.ones(2), group=dist.new_group([1]))  # completes: rank 1 alone
            dist.broadcast(np.ones(2), src=1)                       # rank 2 never joins
        say("after", me)
    """)
    assert r.returncode != 0
    # rank 1 may finish too: a small broadcast's root can complete before the others join
    assert re.search(r"rank\(s\) (1, )?2 ended", r.stderr), r.stderr
    assert "after 0" not in r.stdout  # rank 0's receive from the exited rank never completes


def test_os_exit_is_ended_by_the_launcher(tmp_path):
    r = _job(tmp_path, 3, """
        dist.init_process_group("mpi")
        if dist.get_rank() == 1:
            os._exit(3)
        dist.all_reduce(np.ones(3))
        say("after")
    """)
    assert r.returncode != 0
    assert "after" not in r.stdout


def test_ranks_that_finish_at_different_times_are_not_aborted(tmp_path):
    r = _job(tmp_path, 3, """
        dist.init_process_group("mpi")
        dist.all_reduce(np.ones(3))
        if dist.get_rank() == 0:
            time.sleep(6)  # working, not waiting in MPI: the others must wait for it
        say("after", dist.get_rank())
    """)
    assert r.returncode == 0, r.stderr
    assert sorted(re.findall(r"after (\d)", r.stdout)) == ["0", "1", "2"]
    assert "waiting up to" in r.stderr  # the early finishers say why they wait


def test_exit_timeout_bounds_the_wait_for_a_rank_that_never_finishes(tmp_path):
    r = _job(tmp_path, 3, """
        dist.init_process_group("mpi")
        if dist.get_rank() == 0:
            time.sleep(60)
        say("after", dist.get_rank())
    """, env={"MPIDIST_EXIT_TIMEOUT": "2"})
    assert r.returncode != 0
    assert "did not finish within 2 s" in r.stderr, r.stderr
    assert "rank(s) 0 did not finish" in r.stderr


def test_without_thread_multiple_the_exit_timeout_still_ends_the_job(tmp_path):
    r = _job(tmp_path, 3, """
        dist.init_process_group("mpi")
        assert not any(t.name == "mpidist-exit-watch" for t in threading.enumerate())
        if dist.get_rank() == 1:
            sys.exit(0)
        dist.all_reduce(np.ones(3))
    """, env={"MPIDIST_THREAD_LEVEL": "funneled", "MPIDIST_EXIT_TIMEOUT": "2"})
    assert r.returncode != 0
    assert "[rank 1] this rank has finished, but rank(s) 0, 2 did not finish within 2 s" in r.stderr, r.stderr


@pytest.mark.parametrize("env, arg", [({"MPIDIST_ABORT_ON_ERROR": "0"}, ""), ({}, "abort_on_error=False")])
def test_opt_out_leaves_python_default_behaviour(tmp_path, env, arg):
    r = _job(tmp_path, 3, f"""
        from mpidist.checks import failure
        dist.init_process_group("mpi", {arg})
        say("installed", failure.installed())
        dist.barrier()
        if dist.get_rank() == 1:
            raise ValueError("plain failure")
        say("after", dist.get_rank())
    """, env=env)
    assert r.stdout.count("installed False") == 3
    assert r.returncode != 0  # rank 1's own exit status
    assert "ValueError: plain failure" in r.stderr
    assert "MPI_Abort" not in r.stderr and "[rank 1]" not in r.stderr
    assert sorted(re.findall(r"after (\d)", r.stdout)) == ["0", "2"]


def test_init_destroy_cycles_with_the_watch(tmp_path):
    r = _job(tmp_path, 3, """
        from mpidist.core import errors
        from mpidist.checks import failure
        for i in range(3):
            dist.init_process_group("mpi")
            assert failure.installed()
            x = np.ones(2)
            dist.all_reduce(x)
            dist.destroy_process_group()
            assert not failure.installed()
        if errors.WORLD_RANK == 2:
            time.sleep(3)  # after destroy the ranks may finish at different times
        say("ok")
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("ok") == 3
    assert "waiting up to" not in r.stderr


def test_bad_exit_timeout_is_refused_at_init(tmp_path):
    r = _job(tmp_path, 2, """
        dist.init_process_group("mpi")
    """, env={"MPIDIST_EXIT_TIMEOUT": "soon"})
    assert r.returncode != 0
    assert "init_process_group: rank 0: MPIDIST_EXIT_TIMEOUT='soon' is not a number of seconds" in r.stderr

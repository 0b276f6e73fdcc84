"""A dead rank under ULFM: every survivor raises ProcessFailureError, shrink_group goes on.

Each case is a real ``mpiexec --with-ft ulfm`` job (Open MPI) in which a rank really dies
(``os._exit`` or SIGKILL), under a timeout. Sums after the shrink are checked against numpy
on the survivors' inputs, computed here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import shm
from ulfm import job, lines, needs_ulfm

from mpidist.core.faults import SHARED_DETECTOR

pytestmark = needs_ulfm

SURVIVE = """
n = {n}; victim = {victim}; how = "{how}"
dist.init_process_group("mpi")
me = dist.get_rank()
x = np.ones({count})
dist.all_reduce(x)
if me == victim:
    {where}
    say("DIED", time.time())
    die(how)
if "{where}" == "pass":
    time.sleep(0.5)  # between steps: the others are computing when the victim dies
try:
    for i in range(200000):
        dist.all_reduce(x)
        x[:] = 1
except dist.ProcessFailureError as e:
    say("PFE", me, time.time(), e.agreed, *e.failed_ranks)
    dist.shrink_group(e.failed_ranks)
    y = np.full(3, me + 1.0)
    dist.all_reduce(y)
    say("SUM", me, dist.get_rank(), dist.get_world_size(), *y)
dist.barrier()
say("END", me)
"""


def _check(r, n, victims):
    pfe = lines(r.stdout, "PFE")
    survivors = sorted(set(range(n)) - set(victims))
    assert sorted(int(p[1]) for p in pfe) == survivors, r.stdout + r.stderr
    for p in pfe:
        assert p[3] == "True" and [int(v) for v in p[4:]] == sorted(victims), p
    sums = lines(r.stdout, "SUM")
    want = np.sum([np.full(3, s + 1.0) for s in survivors], axis=0)  # numpy on the survivors' inputs
    assert sorted(int(s[1]) for s in sums) == survivors
    for s in sums:
        assert int(s[2]) == survivors.index(int(s[1])) and int(s[3]) == len(survivors)
        np.testing.assert_array_equal(np.array(s[4:], float), want)
    assert len(lines(r.stdout, "END")) == len(survivors), r.stdout + r.stderr
    return pfe


@pytest.mark.parametrize("n", [3, 4])
@pytest.mark.parametrize("how", ["exit", "kill"])
@pytest.mark.parametrize("where", ["pass", "time.sleep(0.3)"], ids=["between-steps", "mid-collective"])
def test_every_survivor_raises_and_shrinks(tmp_path, n, how, where):
    victim = n - 1
    r = job(tmp_path, n, SURVIVE.format(n=n, victim=victim, how=how, where=where, count=4))
    pfe = _check(r, n, [victim])
    died = float(lines(r.stdout, "DIED")[0][1])
    for p in pfe:  # a report, not an assertion on time: the detector's timeout is 0.4 s
        print(f"rank {p[1]}: ProcessFailureError {float(p[2]) - died:.2f} s after the death")


@pytest.mark.parametrize("where", ["pass", "time.sleep(0.3)"], ids=["between-steps", "mid-collective"])
def test_survivors_of_a_large_sum_within_a_node_raise(tmp_path, where):
    """Sums of 4 MiB go through the node's shared segment, whose ranks first wait for each other's
    marks in shared memory, not in MPI: a dead peer is still found (ULFM), not waited for until
    the group's timeout."""
    r = job(tmp_path, 3, SURVIVE.format(n=3, victim=2, how="kill", where=where, count=(4 << 20) // 8))
    _check(r, 3, [2])


def test_rank_0_dies(tmp_path):
    r = job(tmp_path, 4, SURVIVE.format(n=4, victim=0, how="kill", where="time.sleep(0.3)", count=4))
    _check(r, 4, [0])


def test_two_failures_one_after_another(tmp_path):
    r = job(tmp_path, 4, """
        dist.init_process_group("mpi")
        me = dist.get_rank()
        x = np.ones(2)
        def run():
            while True:
                dist.all_reduce(x)
                x[:] = 1
        for victim in (3, 1):  # 1 is a rank of the shrunk world (global 1 is still 1)
            if dist.get_rank() == victim:
                time.sleep(0.3)
                die("kill")
            try:
                run()
            except dist.ProcessFailureError as e:
                say("PFE", me, *e.failed_ranks)
                dist.shrink_group(e.failed_ranks)
        y = np.array([me + 1.0])
        dist.all_reduce(y)
        say("SUM", me, dist.get_rank(), dist.get_world_size(), *y)
    """)
    seen = sorted((int(p[1]), int(p[2])) for p in lines(r.stdout, "PFE"))
    assert seen == [(0, 1), (0, 3), (1, 3), (2, 1), (2, 3)], r.stdout + r.stderr
    want = float(np.sum([0 + 1.0, 2 + 1.0]))  # the survivors' (global 0 and 2) inputs
    sums = sorted((int(s[1]), int(s[2]), int(s[3]), float(s[4])) for s in lines(r.stdout, "SUM"))
    assert sums == [(0, 0, 2, want), (2, 1, 2, want)]


def test_subgroup_shrinks_while_others_go_on(tmp_path):
    r = job(tmp_path, 4, """
        dist.init_process_group("mpi")
        me = dist.get_rank()
        g = dist.new_group([0, 1, 2])
        h = dist.new_group([0, 3])
        if me == 2:
            time.sleep(0.3)
            die("kill")
        if me in (0, 1):
            try:
                while True:
                    dist.all_reduce(np.ones(2), group=g)
            except dist.ProcessFailureError as e:
                say("PFE", me, *e.failed_ranks)
                g2 = dist.shrink_group([2], group=g)
                y = np.array([me + 10.0])
                dist.all_reduce(y, group=g2)
                say("G2", me, g2.rank(), g2.size(), *y)
        if me in (0, 3):  # a group without the dead works on, unshrunk
            z = np.array([me + 100.0])
            dist.all_reduce(z, group=h)
            say("H", me, *z)
        try:
            dist.all_reduce(np.ones(1))  # the world holds the dead: it raises too
        except dist.ProcessFailureError as e:
            say("WORLD", me, *e.failed_ranks)
    """)
    pfe = sorted((int(p[1]), int(p[2])) for p in lines(r.stdout, "PFE"))
    assert pfe == [(0, 2), (1, 2)], r.stdout + r.stderr
    g2 = sorted(tuple(map(float, p[1:])) for p in lines(r.stdout, "G2"))
    assert g2 == [(0, 0, 2, 21.0), (1, 1, 2, 21.0)]
    assert sorted(tuple(map(float, p[1:])) for p in lines(r.stdout, "H")) == [(0, 203.0), (3, 203.0)]
    assert sorted((int(p[1]), int(p[2])) for p in lines(r.stdout, "WORLD")) == [(0, 2), (1, 2), (3, 2)]


def test_failure_message_names_the_dead(tmp_path):
    r = job(tmp_path, 3, """
        dist.init_process_group("mpi")
        if dist.get_rank() == 1:
            time.sleep(0.2)
            die("exit")
        try:
            while True:
                dist.broadcast(np.ones(8), src=0)
        except dist.ProcessFailureError as e:
            say("MSG", str(e).replace(chr(10), " "))
    """)
    msgs = [ln for ln in r.stdout.splitlines() if ln.startswith("MSG")]
    assert len(msgs) == 2, r.stdout + r.stderr
    for m in msgs:
        assert "broadcast" in m and "rank 1 (" in m and "shrink_group([1])" in m, m


def test_mpi_err_other_on_a_revoked_or_failed_communicator_is_a_failure(tmp_path):
    """Open MPI's nonblocking collectives end a request whose schedule met a revoked
    communicator or a dead peer with MPI_ERR_OTHER (seen in CI on the simulated cluster): that
    class counts as a failure there, and only there."""
    r = job(tmp_path, 3, """
        from mpi4py import MPI
        from mpidist.core import faults
        dist.init_process_group("mpi")
        me = dist.get_rank()
        healthy, revoked, lost = (MPI.COMM_WORLD.Dup() for _ in range(3))
        other, arg = MPI.Exception(MPI.ERR_OTHER), MPI.Exception(MPI.ERR_ARG)
        if me == 0:
            revoked.Revoke()
        end = time.time() + 30
        while not revoked.Is_revoked() and time.time() < end:  # the revoke travels (bounded)
            time.sleep(0.01)
        say("REVOKED", me, faults.is_failure(other, revoked), faults.is_failure(arg, revoked),
            faults.is_failure(other, healthy), faults.is_failure(other, None))
        dist.barrier()
        if me == 2:
            die("kill")
        end = time.time() + 30
        while not faults._known_dead(lost) and time.time() < end:  # until the detector names it
            try:
                lost.Barrier()
            except MPI.Exception:
                pass
            time.sleep(0.05)
        say("DEAD", me, faults._known_dead(lost), faults.is_failure(other, lost))
    """)
    revoked = sorted(lines(r.stdout, "REVOKED"))
    assert revoked == [["REVOKED", str(k), "True", "False", "False", "False"] for k in range(3)], \
        r.stdout + r.stderr
    assert sorted(lines(r.stdout, "DEAD")) == [["DEAD", str(k), "[2]", "True"] for k in (0, 1)], \
        r.stdout + r.stderr


@pytest.mark.parametrize("first", ["mpidist", "mpi4py"])
def test_a_job_that_loses_no_rank_exits_0(tmp_path, first):
    """Open MPI's MPI_Finalize can hang with the threaded detector: mpidist leaves it out, also
    when mpi4py.MPI was imported (and its finalize armed) before mpidist."""
    script = tmp_path / "ok.py"
    script.write_text(("from mpi4py import MPI\n" if first == "mpi4py" else "") + textwrap.dedent("""
        import numpy as np
        import mpidist as dist
        dist.init_process_group("mpi")
        x = np.ones(2)
        dist.all_reduce(x)
        print("OK", dist.get_rank(), x[0], flush=True)
    """))
    r = job(tmp_path, 3, "", script=str(script), timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(ln.split()[1:] for ln in r.stdout.splitlines() if ln.startswith("OK")) == \
        [["0", "3.0"], ["1", "3.0"], ["2", "3.0"]]


def test_the_survival_benchmark_runs(tmp_path):
    """benchmarks/survive.py at its tiny sizes (a smoke run, so it cannot rot; no timing asserted)."""
    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "survive.py"
    with shm.swept():  # the benchmark starts its own jobs and kills ranks in them
        # the tolerant detector: the fast one's 0.5 s timeout saw false deaths at 3 ranks on 2 cores
        r = subprocess.run([sys.executable, str(bench), "--quick", "-n", "3", "--detector",
                            ",".join(map(str, SHARED_DETECTOR))], capture_output=True, text=True,
                           timeout=600, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "detection (3 ranks" in r.stdout and "over 1 jobs" in r.stdout, r.stdout + r.stderr
    assert "recovery: shrink_group" in r.stdout and "mpidist 8 B ft" in r.stdout, r.stdout

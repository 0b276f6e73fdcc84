"""A private single-node Slurm for the tests: munged, slurmctld and slurmd started by hand.

Everything lives in one state directory (config, munge key and socket, spool, logs) and the
daemons talk over 127.0.0.1 only, on free ports picked at start. Nothing is written to
``/etc``: client commands find the cluster through ``SLURM_CONF`` (see :meth:`LocalSlurm.env`).
The daemons run in the foreground as children of the harness and are stopped by PID; the
PIDs are also written to ``<state>/harness.json`` so another process can stop them
(``python tests/slurm/harness.py stop --dir DIR``) when the one that started them died.

Command line::

    python tests/slurm/harness.py install          # apt-get the packages, where root + apt allow
    python tests/slurm/harness.py start --dir D    # start, wait until the node is idle
    python tests/slurm/harness.py stop --dir D     # cancel jobs, stop the daemons, by PID
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import random
import re
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scontrol", "scancel")
NODE = "localhost"
STATE_FILE = "harness.json"


class SlurmUnavailableError(RuntimeError):
    """Slurm cannot be installed or started here; the message says why."""


def _which(name: str) -> str | None:
    # the daemons live in /usr/sbin, which a non-login PATH may lack
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def missing_programs() -> list[str]:
    """Slurm/munge programs not found on this machine."""
    return [p for p in (*DAEMONS, *CLIENTS) if _which(p) is None]


def unavailable_reason() -> str | None:
    """Why a local Slurm cannot be started here, or ``None`` when it can."""
    missing = missing_programs()
    if missing:
        return (f"Slurm/munge programs not installed: {', '.join(missing)} "
                f"(apt-get install {' '.join(PACKAGES)})")
    if os.geteuid() != 0:
        return "starting slurmd needs root (it launches jobs as their owner)"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "no 'munge' user (the munge package creates it)"
    return None


def install(timeout: float = 600) -> str | None:
    """``apt-get install`` the Slurm and munge packages when missing; ``None`` on success.

    Returns the reason when installing is not possible here (not root, no apt-get) or
    failed, so callers can skip with it.
    """
    if not missing_programs():
        return None
    if os.geteuid() != 0:
        return "Slurm is not installed and installing it needs root"
    apt = shutil.which("apt-get")
    if apt is None:
        return "Slurm is not installed and there is no apt-get to install it"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = [apt, "install", "-y", "--no-install-recommends", *PACKAGES]
    out = ""
    # the package lists may be missing or stale: update once, then retry
    for attempt in ("install", "update", "install"):
        run = [apt, "update"] if attempt == "update" else cmd
        try:
            proc = subprocess.run(run, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"{' '.join(run)} timed out after {timeout:.0f} s"
        out = proc.stdout + proc.stderr
        if attempt == "install" and proc.returncode == 0 and not missing_programs():
            return None
    return f"apt-get install {' '.join(PACKAGES)} failed:\n{out[-2000:]}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


class LocalSlurm:
    """One controller and one node named ``localhost`` at 127.0.0.1, with ``cpus`` CPUs.

    Use as a context manager (``with LocalSlurm() as slurm: slurm.sbatch(...)``); the
    daemons are stopped on exit, also after an exception.
    """

    def __init__(self, state_dir: str | Path | None = None, cpus: int = 8):
        self.state = Path(state_dir) if state_dir else Path(tempfile.mkdtemp(prefix="mpidist-slurm-"))
        self.cpus = cpus
        self.conf = self.state / "slurm.conf"
        self.pids: dict[str, int] = {}
        self._procs: dict[str, subprocess.Popen] = {}

    # -- environment and client commands -------------------------------------------------
    def env(self, base: dict | None = None) -> dict:
        """``base`` (default ``os.environ``) plus ``SLURM_CONF`` pointing at this cluster."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        env["PATH"] = env.get("PATH", "") + ":/usr/sbin:/sbin"
        return env

    def client(self, *args: str, timeout: float = 30, check: bool = True) -> str:
        """Run a Slurm client command (``squeue``, ``scontrol``...) against this cluster."""
        proc = subprocess.run([_which(args[0]) or args[0], *args[1:]], env=self.env(),
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout

    def sbatch(self, script: str | Path | None, *args: str, options: tuple[str, ...] = (),
               env: dict | None = None, cwd: str | Path | None = None) -> int:
        """Submit ``script`` with ``args`` (``None``: ``--wrap`` in ``options``); return the job id."""
        where = [str(script), *args] if script is not None else []
        proc = subprocess.run([_which("sbatch") or "sbatch", "--parsable", *options, *where],
                              env=self.env(env), capture_output=True, text=True, timeout=30,
                              cwd=str(cwd) if cwd else None)
        if proc.returncode != 0:
            raise RuntimeError(f"sbatch {script} failed ({proc.returncode}): {proc.stderr.strip()}")
        return int(proc.stdout.strip().split(";")[0])

    def job_state(self, job_id: int) -> tuple[str, str]:
        """``(state, exit code)`` of a job, e.g. ``("COMPLETED", "0:0")``."""
        out = self.client("scontrol", "-o", "show", "job", str(job_id), check=False)
        state = re.search(r"\bJobState=(\S+)", out)
        code = re.search(r"\bExitCode=(\S+)", out)
        return (state.group(1) if state else "UNKNOWN", code.group(1) if code else "?")

    def wait(self, job_id: int, timeout: float) -> tuple[str, str]:
        """Wait until the job leaves PENDING/RUNNING (or cancel it after ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while True:
            state, code = self.job_state(job_id)
            if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "UNKNOWN"):
                return state, code
            if time.monotonic() > deadline:
                self.client("scancel", str(job_id), check=False)
                return f"TIMEOUT(harness, last {state})", code
            self._check_alive()
            time.sleep(0.5)

    # -- start and stop -------------------------------------------------------------------
    def _write_config(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        # munged (as the munge user) must traverse the state dir but not write to it
        self.state.chmod(0o755)
        for sub in ("ctld", "spool"):
            (self.state / sub).mkdir(exist_ok=True)
        munge = self.state / "munge"
        munge.mkdir(exist_ok=True)
        key = munge / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(128))
        user = pwd.getpwnam("munge")
        for p in (munge, key):
            os.chown(p, user.pw_uid, user.pw_gid)
        munge.chmod(0o755)  # clients need to reach the socket; the key itself stays 0600
        key.chmod(0o600)
        template = string.Template((HERE / "slurm.conf.in").read_text())
        self.conf.write_text(template.substitute(
            state=self.state, ctld_port=_free_port(), slurmd_port=_free_port(),
            munge_socket=munge / "munge.socket", cpus=self.cpus,
            # Job ids restart at 1 in every fresh cluster, so MPICH's shared-memory segment
            # names (derived from the PMI job/step id) repeat across clusters; a segment left
            # in /dev/shm by an aborted job then makes the next job with that name spin in
            # MPI_Init forever. A random first id keeps every cluster's names new.
            first_job_id=random.randrange(10_000, 60_000_000),
        ))

    def _spawn(self, name: str, cmd: list[str], **kw) -> None:
        log = open(self.state / f"{name}.out", "ab")  # noqa: SIM115 (kept open by the child)
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=self.env(), **kw)
        log.close()
        self._procs[name] = proc
        self.pids[name] = proc.pid
        (self.state / STATE_FILE).write_text(json.dumps({"pids": self.pids, "conf": str(self.conf)}))

    def _check_alive(self) -> None:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                out, log = _tail(self.state / f"{name}.out"), _tail(self.state / f"{name}.log")
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{out}\n{log}")

    def _wait_for(self, what: str, ready, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} not ready after {timeout:.0f} s")
            time.sleep(0.25)

    def start(self, timeout: float = 60) -> LocalSlurm:
        """Write the config, start munged, slurmctld, slurmd; wait until the node is idle."""
        reason = unavailable_reason()
        if reason:
            raise SlurmUnavailableError(reason)
        if running_in(self.state):
            raise RuntimeError(f"a local Slurm already runs in {self.state}; stop it first "
                               f"(python {__file__} stop --dir {self.state})")
        self._write_config()
        munge = self.state / "munge"
        try:
            self._spawn("munged", [_which("munged"), "--foreground", f"--socket={munge / 'munge.socket'}",
                                   f"--key-file={munge / 'munge.key'}", f"--pid-file={munge / 'munged.pid'}",
                                   f"--log-file={munge / 'munged.log'}", f"--seed-file={munge / 'seed'}"],
                        user="munge", group="munge")
            self._wait_for("munged", (munge / "munge.socket").exists, timeout)
            self._spawn("slurmctld", [_which("slurmctld"), "-D", "-c", "-f", str(self.conf)])
            self._wait_for("slurmctld", lambda: self.client("scontrol", "ping", check=False).count("UP") > 0,
                           timeout)
            self._spawn("slurmd", [_which("slurmd"), "-D", "-f", str(self.conf), "-N", NODE])
            self._wait_for("the node", lambda: "IDLE" in self.client(
                "scontrol", "-o", "show", "node", NODE, check=False).upper(), timeout)
        except BaseException as exc:
            logs = "\n".join(f"--- {n}\n{_tail(self.state / f'{n}.log', 15)}"
                             for n in ("slurmctld", "slurmd"))
            self.stop()
            if isinstance(exc, Exception):
                raise SlurmUnavailableError(f"local Slurm did not start: {exc}\n{logs}") from exc
            raise
        return self

    def stop(self) -> None:
        """Cancel every job, then stop slurmd, slurmctld and munged by PID (TERM, then KILL)."""
        self.cancel_jobs()
        stop_pids(self.pids, self.conf)
        self.reap()
        state_file = self.state / STATE_FILE
        if state_file.exists():
            state_file.unlink()

    def cancel_jobs(self) -> None:
        """Cancel this user's jobs and wait (up to 15 s) until none is left."""
        if not (self.pids.get("slurmctld") and self.conf.exists()):
            return
        try:
            self.client("scancel", "--user", pwd.getpwuid(os.geteuid()).pw_name, check=False, timeout=10)
            deadline = time.monotonic() + 15
            while (self.client("squeue", "-h", check=False, timeout=10).strip()
                   and time.monotonic() < deadline):
                time.sleep(0.5)
        except (subprocess.SubprocessError, OSError):
            pass

    def reap(self) -> None:
        """Collect the stopped daemons' exit status and forget them."""
        for proc in self._procs.values():
            try:
                proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        self.pids.clear()
        self._procs.clear()

    def __enter__(self) -> LocalSlurm:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _ours(name: str, pid: int, conf: Path) -> bool:
    """The PID still runs the daemon we started (not a reused PID)."""
    cmd = _cmdline(pid)
    marker = str(conf.parent / "munge") if name == "munged" else str(conf)
    return name in cmd and marker in cmd


def stop_pids(pids: dict[str, int], conf: Path, grace: float = 10) -> None:
    """Stop the daemons in ``pids`` (slurmd first), only where the PID still is ours."""
    order = [n for n in ("slurmd", "slurmctld", "munged") if n in pids]
    for name in order:
        pid = pids[name]
        if not _ours(name, pid, conf):
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while _ours(name, pid, conf) and time.monotonic() < deadline:
            try:  # reap it when it is our child; harmless otherwise
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    break
            except ChildProcessError:
                pass
            time.sleep(0.1)
        if _ours(name, pid, conf):
            os.kill(pid, signal.SIGKILL)


def running_in(state_dir: str | Path) -> bool:
    """Some daemon recorded in ``state_dir``'s ``harness.json`` still runs."""
    state_file = Path(state_dir) / STATE_FILE
    if not state_file.exists():
        return False
    info = json.loads(state_file.read_text())
    return any(_ours(n, int(p), Path(info["conf"])) for n, p in info["pids"].items())


def stop_dir(state_dir: str | Path) -> bool:
    """Stop a cluster started by another process from its ``harness.json``; True if one was found."""
    slurm = LocalSlurm(state_dir)
    state_file = slurm.state / STATE_FILE
    if not state_file.exists():
        return False
    info = json.loads(state_file.read_text())
    slurm.pids = {k: int(v) for k, v in info["pids"].items()}
    slurm.conf = Path(info["conf"])
    slurm.stop()
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["install", "start", "stop", "status"])
    ap.add_argument("--dir", help="state directory (default: a new /tmp/mpidist-slurm-*)")
    ap.add_argument("--cpus", type=int, default=8)
    a = ap.parse_args(argv)
    if a.action == "install":
        t0 = time.monotonic()
        reason = install()
        print(f"slurm: {reason or 'installed'} ({time.monotonic() - t0:.1f} s)")
        return 0  # not installable is a skip for the tests, not a failure here
    if a.action == "status":
        print(unavailable_reason() or "slurm: can be started")
        return 0
    if a.action == "stop":
        if not a.dir:
            ap.error("stop needs --dir")
        print("slurm: stopped" if stop_dir(a.dir) else "slurm: nothing to stop")
        return 0
    slurm = LocalSlurm(a.dir, cpus=a.cpus)
    slurm.start()
    print(f"slurm: up; export SLURM_CONF={slurm.conf}\n"
          f"stop with: {sys.executable} {__file__} stop --dir {slurm.state}")
    # the daemons stay up after this process exits (own sessions); `stop --dir` ends them
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A cluster on one machine: N "nodes" as Linux network namespaces, joined by a bridge.

Each node is a network namespace with one link (``eth0`` inside, a veth whose other end sits
on the cluster's bridge), an address of its own, and its own host name: commands enter it
through ``<state>/bin/on NODE CMD...``, which joins the namespace, unshares the UTS and mount
namespaces, sets the host name and bind-mounts the cluster's private hosts file over
``/etc/hosts`` (so node names resolve on every node and nothing in ``/etc`` changes). The
machine itself is the head node: ``mpiexec`` runs there and reaches the nodes over the bridge.

hydra starts its proxies through ``<state>/bin/ssh``, an ssh stand-in that runs the command on
the named node::

    mpiexec -launcher ssh -launcher-exec <state>/bin/ssh -iface <bridge> -hosts node0:2,node1:1 -n 3 ...

:meth:`Cluster.mpiexec_cmd` builds that line and :meth:`Cluster.env` the environment that makes
MPICH use the network between nodes (``MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp``): the mpich
wheel's default UCX netmod sees one machine and moves data through shared memory, so the links
would carry nothing; ``UCX_TLS=tcp`` instead hangs a ``Recv(source=ANY_SOURCE)`` with two ranks
per node (an MPICH/UCX problem, not mpidist's).

Addresses come from the benchmarking range 198.18.0.0/15 only: cluster ``K`` owns
198.18.0.0 + K*256 /24, the head is ``.254``, node ``i`` is ``.(i+1)``. Every name carries the
prefix ``mdc<K>`` (namespaces ``mdc<K>-node<i>``, bridge ``mdc<K>br``, veths ``mdc<K>h<i>``),
and the state lives in ``/tmp/mpidist-cluster-<K>`` (``state.json``: owner PID, names).
Several clusters can run at once (each process its own). Teardown kills every process in the
namespaces by PID, deletes the veths explicitly (they can outlive their namespace), the bridge
and the namespaces; :func:`cleanup_stale` removes what a crashed run left behind (clusters
whose owner died, and ``mdc*`` links or namespaces no live cluster claims).

API (``from cluster.harness import Cluster`` with ``tests/`` on ``sys.path``)::

    with Cluster(3) as c:                       # start 3 nodes; stopped on exit, also on error
        # (Cluster(2, resolve="self"): nodes that cannot resolve each other's names)
        proc = c.run_mpi([2, 1, 2], ["job.py"], timeout=60)   # 5 ranks: 2 + 1 + 2
        c.shape("node1", rate="1gbit")          # tc tbf on node1's link, both directions
        c.cut("node2"); c.restore("node2")      # link down / up
        c.kill_node("node1")                    # SIGKILL every process on node1
        c.exec_on("node0", ["hostname"])        # any command on a node

Command line::

    python tests/cluster/harness.py up [--nodes 2]        # start a cluster that outlives the command
    python tests/cluster/harness.py run [--layout 2,1] -- python examples/train.py   # mpiexec across it
    python tests/cluster/harness.py status | down [--all] | install
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

#: Every cluster's /24 lies in this range (RFC 2544 benchmarking addresses).
NETWORK = ipaddress.ip_network("198.18.0.0/15")
MAX_CLUSTERS = NETWORK.num_addresses // 256
PREFIX = "mdc"
STATE_ROOT = Path(tempfile.gettempdir())
STATE_GLOB = "mpidist-cluster-*"
LOCK = STATE_ROOT / "mpidist-cluster.lock"
NETNS_DIR = Path("/var/run/netns")
PACKAGES = ("iproute2", "util-linux")
PROGRAMS = ("ip", "tc", "nsenter", "unshare")
#: What makes MPICH carry traffic between nodes over TCP (see the module docstring).
NETWORK_ENV = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}
_NAME = re.compile(rf"^{PREFIX}(\d+)")


class ClusterUnavailableError(RuntimeError):
    """Namespaces cannot be made here (not root, no ``ip netns``...); the message says why."""


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")


def _run(args: Sequence[str], *, check: bool = True, timeout: float = 30, stdin: str | None = None
         ) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, input=stdin)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def missing_programs() -> list[str]:
    """The programs the harness needs (``ip``, ``tc``, ``nsenter``, ``unshare``) that are missing."""
    return [p for p in PROGRAMS if _which(p) is None]


def install(timeout: float = 300) -> str | None:
    """``apt-get install`` iproute2/util-linux when missing; ``None`` on success, else why not."""
    if not missing_programs():
        return None
    if os.geteuid() != 0:
        return f"{', '.join(missing_programs())} missing and installing needs root"
    apt = shutil.which("apt-get")
    if apt is None:
        return f"{', '.join(missing_programs())} missing and there is no apt-get"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    out = ""
    for run in ([apt, "install", "-y", "--no-install-recommends", *PACKAGES], [apt, "update"],
                [apt, "install", "-y", "--no-install-recommends", *PACKAGES]):
        try:
            proc = subprocess.run(run, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"{' '.join(run)} timed out after {timeout:.0f} s"
        out = proc.stdout + proc.stderr
        if run[1] == "install" and proc.returncode == 0 and not missing_programs():
            return None
    return f"apt-get install {' '.join(PACKAGES)} failed:\n{out[-2000:]}"


_probe_result: list[str | None] = []


def unavailable_reason() -> str | None:
    """Why no cluster can be started here, or ``None`` when it can (probes ``ip netns`` once)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = missing_programs()
    if missing:
        return f"programs missing: {', '.join(missing)} (apt-get install {' '.join(PACKAGES)})"
    if not _probe_result:
        name = f"{PREFIX}probe{os.getpid()}"
        proc = _run([_which("ip"), "netns", "add", name], check=False)
        reason = None
        if proc.returncode != 0:
            reason = f"`ip netns add` does not work here: {proc.stderr.strip()}"
        else:
            enter = _run([_which("nsenter"), f"--net={NETNS_DIR / name}", _which("unshare"), "--uts",
                          "--mount", "sh", "-c", "hostname probe && mount --bind /etc/hosts /etc/hosts"],
                         check=False)
            if enter.returncode != 0:
                reason = f"cannot enter a namespace with its own host name and mounts: {enter.stderr.strip()}"
            _run([_which("ip"), "netns", "del", name], check=False)
        _probe_result.append(reason)
    return _probe_result[0]


# ---------------------------------------------------------------- ownership and stale state

def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (guards against a reused PID), or ``None`` if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(owner: dict) -> bool:
    pid = owner.get("pid")
    return pid is not None and _start_time(pid) == owner.get("start")


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """The machine-wide lock under which clusters are created and stale ones removed."""
    with open(LOCK, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _read_state(state_dir: Path) -> dict | None:
    try:
        return json.loads((state_dir / "state.json").read_text())
    except (OSError, ValueError):
        return None


def _netns_names() -> list[str]:
    try:
        return sorted(p.name for p in NETNS_DIR.iterdir())
    except OSError:
        return []


def _link_names() -> list[str]:
    out = _run([_which("ip"), "-o", "link", "show"], check=False).stdout
    return [m.group(1).split("@")[0] for m in re.finditer(r"^\d+:\s+(\S+?):", out, re.MULTILINE)]


def _ns_pids(netns: str) -> list[int]:
    """PIDs whose network namespace is ``netns`` (what ``ip netns pids`` prints)."""
    try:
        inode = os.stat(NETNS_DIR / netns).st_ino
    except OSError:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            link = os.readlink(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        if link == f"net:[{inode}]":
            pids.append(int(entry))
    return pids


def _kill_pids(pids: list[int], grace: float = 2.0) -> None:
    """TERM, then KILL after ``grace`` seconds, each PID in ``pids`` that still runs."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
                alive.append(pid)
        deadline = time.monotonic() + grace
        while alive and time.monotonic() < deadline:
            alive = [p for p in alive if _start_time(p) is not None and not _zombie(p)]
            time.sleep(0.05)
        pids = alive
        if not pids:
            return


def _zombie(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    if state == "Z":
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
        return True
    return False


def end_group(pgid: int) -> None:
    """SIGKILL what is left of a finished job's process group (its session's launcher started
    it): a remote-shell stand-in that was still starting a node's proxy when ``mpiexec`` gave up
    (an unknown host) goes on into the node's namespace after the job has ended."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _empty(netns: str, looks: int = 5) -> None:
    """Kill every process in ``netns``; look again, since one may fork between a look and its kill."""
    for _ in range(looks):
        pids = _ns_pids(netns)
        if not pids:
            return
        _kill_pids(pids)


def _teardown(cid: int, netns: list[str], links: list[str]) -> None:
    """Kill the namespaces' processes, delete veths, bridge and namespaces; ignore what is gone."""
    for ns in netns:
        _empty(ns)
    ip = _which("ip")
    for link in links:  # veths first: deleting one end deletes its peer
        _run([ip, "link", "del", link], check=False)
    for ns in netns:
        _run([ip, "netns", "del", ns], check=False)
    _run([ip, "link", "del", f"{PREFIX}{cid}br"], check=False)


def cleanup_stale(verbose: bool = False) -> list[str]:
    """Remove what crashed runs left: clusters whose owner died, unclaimed ``mdc*`` names.

    Detached clusters (``harness.py up``) are kept: ``harness.py down`` ends them. Returns
    what was removed.
    """
    removed: list[str] = []
    with _locked():
        claimed: set[int] = set()
        for state_dir in sorted(STATE_ROOT.glob(STATE_GLOB)):
            st = _read_state(state_dir)
            if st is None:
                shutil.rmtree(state_dir, ignore_errors=True)
                continue
            if st.get("detached") or _alive(st["owner"]):
                claimed.add(st["id"])
                continue
            _stop_state(st)
            shutil.rmtree(state_dir, ignore_errors=True)
            removed.append(f"cluster {st['id']} (owner PID {st['owner'].get('pid')} is gone)")
        for ns in _netns_names():
            m = _NAME.match(ns)
            if m and int(m.group(1)) not in claimed:
                _teardown(int(m.group(1)), [ns], [])
                removed.append(f"namespace {ns}")
        for link in _link_names():
            m = _NAME.match(link)
            if m and int(m.group(1)) not in claimed:
                _run([_which("ip"), "link", "del", link], check=False)
                removed.append(f"link {link}")
    if verbose and removed:
        print("cluster: removed leftovers: " + "; ".join(removed), file=sys.stderr)
    return removed


def _stop_state(st: dict) -> None:
    """Stop the processes recorded in a state (daemons first), then the namespaces and links."""
    daemons = [int(p) for p in st.get("daemons", {}).values()]
    _kill_pids([p for p in daemons if _start_time(p) is not None], grace=5.0)
    _teardown(st["id"], [n["netns"] for n in st["nodes"]], [n["veth"] for n in st["nodes"]])


# ---------------------------------------------------------------- the cluster

@dataclass(frozen=True)
class Node:
    """One node: its host name, address, namespace and the host-side end of its link."""

    name: str
    address: str
    netns: str
    veth: str  # on the bridge (head side); the node side is ``eth0`` inside the namespace


ON_SCRIPT = """#!/bin/sh
# Run a command on a node of mpidist test cluster {cid}: its network namespace, its host name,
# the cluster's /etc/hosts, and the node's extra mounts (e.g. a hidden directory).
node=$1; shift
case "$node" in
{cases}
  *) echo "ssh: Could not resolve hostname $node: Name or service not known" >&2; exit 255;;
esac
exec {nsenter} --net={netns_dir}/"$ns" {unshare} --uts --mount sh -c '
mount --bind "$0" /etc/hosts && hostname "$1" || exit 255
if [ -f "$2" ]; then . "$2" || exit 255; fi
shift 2; exec "$@"' {state}/hosts.d/"$node" "$node" {state}/mounts/"$node".sh "$@"
"""

SSH_SCRIPT = """#!/bin/sh
# ssh stand-in for hydra's ssh launcher: skip ssh's options, run the command on the named node.
while [ $# -gt 0 ]; do
  case "$1" in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2;;
    -*) shift;;
    *) break;;
  esac
done
host=$1; shift
exec {on} "$host" sh -c "$*"
"""


class Cluster:
    """N nodes on this machine; a context manager that stops them on exit, also after an error.

    Parameters
    ----------
    nodes : int or sequence of str
        How many nodes (named ``node0``, ``node1``...) or their host names.
    detached : bool
        Leave the cluster up when this process ends (``harness.py up``); without it a later
        :func:`cleanup_stale` removes a cluster whose owner died.
    resolve : {"all", "self"}
        ``"all"``: every node resolves every node's name (and ``head``). ``"self"``: a node
        knows only its own name, at 127.0.1.1 as Debian's ``/etc/hosts`` writes it, like
        nodes without DNS; peers' names do not resolve.
    """

    def __init__(self, nodes: int | Sequence[str] = 2, *, detached: bool = False,
                 resolve: str = "all") -> None:
        if resolve not in ("all", "self"):
            raise ValueError(f"resolve must be 'all' or 'self', got {resolve!r}")
        self.resolve = resolve
        names = [f"node{i}" for i in range(nodes)] if isinstance(nodes, int) else list(nodes)
        if not names or len(names) > 250 or len(set(names)) != len(names):
            raise ValueError(f"need 1-250 distinct node names, got {names!r}")
        bad = [n for n in names if not re.fullmatch(r"[a-z][a-z0-9-]{0,30}", n)]
        if bad:
            raise ValueError(f"node names must be lower-case host names, got {bad!r}")
        self.names = names
        self.detached = detached
        self.id: int | None = None
        self.nodes: list[Node] = []
        self.state: Path | None = None
        self.daemons: dict[str, int] = {}

    # -- facts ------------------------------------------------------------------------------
    @property
    def bridge(self) -> str:
        """The bridge joining the nodes; hydra's ``-iface`` (the head's address is on it)."""
        return f"{PREFIX}{self.id}br"

    @property
    def head_address(self) -> str:
        return str(self._net()[254])

    @property
    def ssh(self) -> str:
        """The ssh stand-in for ``mpiexec -launcher ssh -launcher-exec``."""
        return str(self.state / "bin" / "ssh")

    @property
    def on(self) -> str:
        """``<on> NODE CMD...`` runs CMD on NODE (namespace, host name, /etc/hosts)."""
        return str(self.state / "bin" / "on")

    @property
    def hosts_file(self) -> Path:
        return self.state / "hosts"

    def node(self, name: str | int) -> Node:
        """The node called ``name`` (or the ``name``-th node)."""
        if isinstance(name, int):
            return self.nodes[name]
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node {name!r} in this cluster ({', '.join(self.names)})")

    def _net(self) -> ipaddress.IPv4Network:
        base = int(NETWORK.network_address) + 256 * self.id
        return ipaddress.ip_network(f"{ipaddress.IPv4Address(base)}/24")

    # -- start and stop ----------------------------------------------------------------------
    def start(self) -> Cluster:
        """Create the namespaces, links and scripts; returns ``self``."""
        reason = unavailable_reason()
        if reason:
            raise ClusterUnavailableError(reason)
        cleanup_stale(verbose=True)
        with _locked():
            self.id = self._free_id()
            self.state = STATE_ROOT / f"mpidist-cluster-{self.id}"
            self.state.mkdir(mode=0o755)
            net = self._net()
            self.nodes = [Node(name, str(net[i + 1]), f"{PREFIX}{self.id}-{name}", f"{PREFIX}{self.id}h{i}")
                          for i, name in enumerate(self.names)]
            self._save()  # claimed before anything exists, so a concurrent cleanup leaves it alone
        try:
            self._create()
        except BaseException:
            self.stop()
            raise
        return self

    def _free_id(self) -> int:
        used = {st["id"] for d in STATE_ROOT.glob(STATE_GLOB) if (st := _read_state(d))}
        used |= {int(m.group(1)) for n in _link_names() + _netns_names() if (m := _NAME.match(n))}
        for cid in range(MAX_CLUSTERS):
            if cid not in used and not (STATE_ROOT / f"mpidist-cluster-{cid}").exists():
                return cid
        raise ClusterUnavailableError(f"all {MAX_CLUSTERS} cluster subnets of {NETWORK} are in use")

    def _save(self) -> None:
        owner = {"pid": os.getpid(), "start": _start_time(os.getpid())}
        st = {"id": self.id, "owner": owner, "detached": self.detached, "bridge": self.bridge,
              "head": self.head_address, "resolve": self.resolve, "nodes": [n.__dict__ for n in self.nodes],
              "daemons": self.daemons}
        tmp = self.state / "state.json.tmp"
        tmp.write_text(json.dumps(st, indent=1))
        tmp.replace(self.state / "state.json")

    def _create(self) -> None:
        ip = _which("ip")
        prefix = self._net().prefixlen
        cmds = [f"link add {self.bridge} type bridge",
                f"addr add {self.head_address}/{prefix} dev {self.bridge}", f"link set {self.bridge} up"]
        for i, n in enumerate(self.nodes):
            _run([ip, "netns", "add", n.netns])
            cmds += [f"link add {n.veth} type veth peer name {PREFIX}{self.id}n{i}",
                     f"link set {PREFIX}{self.id}n{i} netns {n.netns}",
                     f"link set {n.veth} master {self.bridge} up"]
        _run([ip, "-batch", "-"], stdin="\n".join(cmds) + "\n")
        for i, n in enumerate(self.nodes):
            _run([ip, "-n", n.netns, "-batch", "-"], stdin="\n".join([
                f"link set {PREFIX}{self.id}n{i} name eth0", f"addr add {n.address}/{prefix} dev eth0",
                "link set eth0 up", "link set lo up"]) + "\n")
        lines = ["127.0.0.1 localhost", f"{self.head_address} head"]
        lines += [f"{n.address} {n.name}" for n in self.nodes]
        self.hosts_file.write_text("\n".join(lines) + "\n")
        (self.state / "hosts.d").mkdir()
        for n in self.nodes:
            own = lines if self.resolve == "all" else ["127.0.0.1 localhost", f"127.0.1.1 {n.name}"]
            (self.state / "hosts.d" / n.name).write_text("\n".join(own) + "\n")
        (self.state / "mounts").mkdir()
        (self.state / "bin").mkdir()
        cases = "\n".join(f"  {n.name}) ns={n.netns};;" for n in self.nodes)
        self._script("on", ON_SCRIPT.format(
            cid=self.id, cases=cases, nsenter=_which("nsenter"), unshare=_which("unshare"),
            netns_dir=NETNS_DIR, state=self.state))
        self._script("ssh", SSH_SCRIPT.format(on=self.on))

    def _script(self, name: str, text: str) -> None:
        path = self.state / "bin" / name
        path.write_text(text)
        path.chmod(0o755)

    def stop(self) -> None:
        """Kill every process on the nodes, delete links, bridge and namespaces, drop the state."""
        if self.state is None:
            return
        with _locked():
            st = _read_state(self.state)
            if st is not None:
                _stop_state(st)
            elif self.id is not None:
                _teardown(self.id, [n.netns for n in self.nodes], [n.veth for n in self.nodes])
            shutil.rmtree(self.state, ignore_errors=True)
        self.state = None

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @classmethod
    def attach(cls, state_dir: str | Path) -> Cluster:
        """The cluster recorded in ``state_dir`` (started by another process, e.g. ``harness.py up``)."""
        st = _read_state(Path(state_dir))
        if st is None:
            raise ClusterUnavailableError(f"no cluster recorded in {state_dir}")
        c = cls([n["name"] for n in st["nodes"]], detached=st["detached"], resolve=st.get("resolve", "all"))
        c.id, c.state = st["id"], Path(state_dir)
        c.nodes = [Node(**n) for n in st["nodes"]]
        c.daemons = dict(st.get("daemons", {}))
        return c

    # -- running things ----------------------------------------------------------------------
    def env(self, base: dict | None = None, **extra: str) -> dict[str, str]:
        """``base`` (default ``os.environ``) plus :data:`NETWORK_ENV`, without launcher leftovers."""
        env = {k: v for k, v in (os.environ if base is None else base).items()
               if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "HYDI_", "MPI_LOCALRANK", "SLURM_", "OMPI_"))}
        env.update(NETWORK_ENV)
        env.update(extra)
        return env

    def hosts_arg(self, ranks_per_node: Sequence[int]) -> str:
        """hydra's ``-hosts`` value for ``ranks_per_node`` (``[2, 1]`` -> ``node0:2,node1:1``)."""
        if len(ranks_per_node) > len(self.nodes) or any(int(r) < 1 for r in ranks_per_node):
            raise ValueError(f"layout {list(ranks_per_node)} does not fit {len(self.nodes)} nodes "
                             "(one count >= 1 per node used)")
        return ",".join(f"{n.name}:{int(r)}" for n, r in zip(self.nodes, ranks_per_node))

    def mpiexec_cmd(self, ranks_per_node: Sequence[int], argv: Sequence[str],
                    mpiexec: str | None = None, extra: Sequence[str] = ()) -> list[str]:
        """``mpiexec -launcher ssh ... -hosts node0:a,node1:b -n a+b <argv>`` for this cluster."""
        if mpiexec is None:
            local = Path(sys.executable).parent / "mpiexec"
            mpiexec = str(local) if local.exists() else (shutil.which("mpiexec") or "mpiexec")
        return [mpiexec, "-launcher", "ssh", "-launcher-exec", self.ssh, "-iface", self.bridge,
                "-hosts", self.hosts_arg(ranks_per_node), *extra, "-n", str(sum(ranks_per_node)), *argv]

    def run_mpi(self, ranks_per_node: Sequence[int], args: Sequence[str], timeout: float = 120,
                env: dict | None = None, mpiexec_args: Sequence[str] = (), cwd: str | Path | None = None
                ) -> subprocess.CompletedProcess:
        """``mpiexec ... python <args>`` across the nodes; output captured; killed after ``timeout``.

        On a timeout every process of the job is killed (launcher, and all processes on the
        nodes) and ``subprocess.TimeoutExpired`` is raised with the output so far.
        """
        full_env = self.env(**(env or {}))
        full_env.setdefault("PYTHONUNBUFFERED", "")
        cmd = self.mpiexec_cmd(ranks_per_node, [sys.executable, *args], extra=mpiexec_args)
        return self.run(cmd, timeout=timeout, env=full_env, cwd=cwd)

    def run(self, cmd: Sequence[str], timeout: float = 120, env: dict | None = None,
            cwd: str | Path | None = None) -> subprocess.CompletedProcess:
        """Run ``cmd`` on the head, captured, in its own session; on timeout kill it and the nodes'."""
        with subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=self.env() if env is None else env, cwd=str(cwd) if cwd else None,
                              start_new_session=True) as proc:
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                self.kill_jobs()
                out, err = proc.communicate()
                raise subprocess.TimeoutExpired(list(cmd), timeout, out, err) from None
            end_group(proc.pid)
        return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)

    def exec_on(self, node: str | int, argv: Sequence[str], timeout: float = 30, check: bool = False,
                env: dict | None = None) -> subprocess.CompletedProcess:
        """Run ``argv`` on ``node`` (its namespace and host name) and wait for it."""
        proc = subprocess.run([self.on, self.node(node).name, *argv], capture_output=True, text=True,
                              timeout=timeout, env=env)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} on {node} failed ({proc.returncode}): {proc.stderr}")
        return proc

    def pids(self, node: str | int) -> list[int]:
        """PIDs of the processes running on ``node``."""
        return _ns_pids(self.node(node).netns)

    def kill_node(self, node: str | int, sig: int = signal.SIGKILL) -> list[int]:
        """Send ``sig`` to every process on ``node`` (its daemons too); returns the PIDs."""
        pids = self.pids(node)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return pids

    def kill_jobs(self) -> None:
        """Kill every process on every node except the cluster's daemons (e.g. after a timeout)."""
        keep = set(self.daemons.values())
        for n in self.nodes:
            _kill_pids([p for p in _ns_pids(n.netns) if p not in keep], grace=1.0)

    # -- the network ---------------------------------------------------------------------------
    def cut(self, node: str | int) -> None:
        """Take ``node``'s link down at the bridge (the cable pulled: no packet in or out)."""
        _run([_which("ip"), "link", "set", self.node(node).veth, "down"])

    def restore(self, node: str | int) -> None:
        """Bring ``node``'s link back up."""
        _run([_which("ip"), "link", "set", self.node(node).veth, "up"])

    def shape(self, node: str | int, rate: str = "1gbit", burst: str = "256kb",
              latency: str = "50ms") -> None:
        """Limit ``node``'s link to ``rate`` in both directions (``tc qdisc ... tbf``).

        The head-side veth shapes traffic to the node, the node's ``eth0`` traffic from it.
        ``netem`` (delay, loss) is not available in every kernel; tbf is.
        """
        n = self.node(node)
        tbf = ["qdisc", "replace", "root", "tbf", "rate", rate, "burst", burst, "latency", latency]
        _run([_which("tc"), *tbf[:2], "dev", n.veth, *tbf[2:]])
        _run([_which("tc"), "-n", n.netns, *tbf[:2], "dev", "eth0", *tbf[2:]])

    def unshape(self, node: str | int) -> None:
        """Remove :meth:`shape`'s limits from ``node``'s link."""
        n = self.node(node)
        _run([_which("tc"), "qdisc", "del", "dev", n.veth, "root"], check=False)
        _run([_which("tc"), "-n", n.netns, "qdisc", "del", "dev", "eth0", "root"], check=False)

    def hide(self, node: str | int, path: str | Path) -> None:
        """Make ``path`` an empty directory on ``node`` (e.g. the virtualenv: "a node without it").

        Applies to commands started on the node from now on (an empty tmpfs mounted over it).
        """
        name = self.node(node).name
        with open(self.state / "mounts" / f"{name}.sh", "a") as fh:
            fh.write(f"mount -t tmpfs -o size=1m,mode=0755 mpidist-hidden {shlex.quote(str(path))}\n")

    def unhide(self, node: str | int) -> None:
        """Undo every :meth:`hide` on ``node``."""
        (self.state / "mounts" / f"{self.node(node).name}.sh").unlink(missing_ok=True)

    # -- daemons (e.g. Slurm's) ---------------------------------------------------------------
    def track_daemon(self, name: str, pid: int) -> None:
        """Record a daemon's PID in the state, so :meth:`stop` and :func:`cleanup_stale` end it."""
        self.daemons[name] = pid
        self._save()

    def describe(self) -> str:
        lines = [f"cluster {self.id}: state {self.state}, bridge {self.bridge} (head {self.head_address})"]
        lines += [f"  {n.name:<8} {n.address:<15} netns {n.netns}, link {n.veth}" for n in self.nodes]
        return "\n".join(lines)


def detached_clusters() -> list[Cluster]:
    """The clusters started with ``harness.py up`` that are still recorded."""
    out = []
    for d in sorted(STATE_ROOT.glob(STATE_GLOB)):
        st = _read_state(d)
        if st and st.get("detached"):
            out.append(Cluster.attach(d))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["install", "status", "up", "down", "run"])
    ap.add_argument("--nodes", type=int, default=2, help="up: how many nodes")
    ap.add_argument("--dir", help="down/run: the cluster's state directory (default: the only one up)")
    ap.add_argument("--all", action="store_true", help="down: every detached cluster and all leftovers")
    ap.add_argument("--layout", default=None, help="run: ranks per node, e.g. 2,1 (default: 2 per node)")
    ap.add_argument("--timeout", type=float, default=600, help="run: seconds before the job is killed")
    ap.add_argument("command", nargs="*", help="run: the program and its arguments, after --")
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[argv.index("--") + 1:] if "--" in argv else []
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    command = command or a.command
    if a.action == "install":
        reason = install()
        print(f"cluster: {reason or 'programs present'}")
        return 0
    if a.action == "status":
        print(unavailable_reason() or "cluster: can be started")
        for c in detached_clusters():
            print(c.describe())
        return 0
    if a.action == "up":
        c = Cluster(a.nodes, detached=True).start()
        print(c.describe())
        print(f"run a job:  {sys.executable} {__file__} run -- python examples/train.py\n"
              f"stop it:    {sys.executable} {__file__} down")
        return 0
    clusters = [Cluster.attach(a.dir)] if a.dir else detached_clusters()
    if a.action == "down":
        for c in clusters if (a.all or a.dir or len(clusters) <= 1) else []:
            c.stop()
            print(f"cluster {c.id}: stopped")
        if len(clusters) > 1 and not (a.all or a.dir):
            ap.error(f"{len(clusters)} clusters are up: name one with --dir or use --all")
        removed = cleanup_stale()
        if a.all:
            print("cluster: removed " + ("; ".join(removed) if removed else "no leftovers"))
        return 0
    if len(clusters) != 1:
        ap.error("no cluster is up (harness.py up)" if not clusters else "several clusters are up: use --dir")
    c = clusters[0]
    if not command:
        ap.error("run needs a command, e.g. run -- python examples/train.py")
    if command[0] in ("python", "python3"):
        command[0] = sys.executable
    layout = [int(x) for x in a.layout.split(",")] if a.layout else [2] * len(c.nodes)
    cmd = c.mpiexec_cmd(layout, command)
    print("+ " + shlex.join(cmd), file=sys.stderr, flush=True)
    env = c.env()
    env.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    try:
        return subprocess.run(cmd, env=env, timeout=a.timeout).returncode
    except subprocess.TimeoutExpired:
        c.kill_jobs()
        print(f"cluster: the job ran past {a.timeout:g} s and was killed", file=sys.stderr)
        return 124


if __name__ == "__main__":
    sys.exit(main())

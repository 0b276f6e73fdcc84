"""torchrun's worker environment, computed from MPI under any MPI launcher.

A script written for ``torchrun`` reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ... from its environment. :func:`torchrun_environment` computes the same
variables from MPI (never from the launcher's variables): rank and size from
``MPI_COMM_WORLD``, the node layout from ``MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)``
(:func:`mpidist.start.launcher.node_layout`), and the rendezvous address from rank 0, sent to
every rank with ``MPI_Bcast``. No torch import.

What is set, against what ``torchrun --nproc-per-node N`` sets:

========================================  ==============================================
``RANK``, ``WORLD_SIZE``                  MPI rank and size
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``      rank and size of this rank's node (shared memory)
``GROUP_RANK``, ``GROUP_WORLD_SIZE``      node number (in order of lowest rank), nodes
``ROLE_RANK``, ``ROLE_WORLD_SIZE``,       as torchrun's single role ``default``: the
``ROLE_NAME``                             global rank and size
``MASTER_ADDR``, ``MASTER_PORT``          rank 0's address (``127.0.0.1`` on one node) and
                                          a port that was free there (``hosted``: the
                                          address and port of the store rank 0 serves)
``TORCHELASTIC_RUN_ID``                   one id for the job (``is_torchelastic_launched()``)
``TORCHELASTIC_RESTART_COUNT``,           ``0``: MPI jobs are not restarted
``TORCHELASTIC_MAX_RESTARTS``
``TORCHELASTIC_USE_AGENT_STORE``          ``True`` where rank 0 serves the store itself, as
                                          torchrun's agent (``hosted``: ``mpidist.run``,
                                          ``use_for_cpu``, the Lightning environment), unless
                                          ``MASTER_PORT`` was set by hand; ``False`` otherwise
``TORCH_NCCL_ASYNC_ERROR_HANDLING``       ``1`` unless set, as torchrun
``OMP_NUM_THREADS``                       ``1`` when a node has several ranks, unless set,
                                          as torchrun
``OMP_WAIT_POLICY``                       ``PASSIVE`` where the node's ranks times their
                                          threads exceed its cores, no policy is set and
                                          torch is not imported yet (it reads the policy
                                          once; :mod:`mpidist.start.threads`)
========================================  ==============================================

Not set: ``TORCHELASTIC_ERROR_FILE`` and ``TORCHELASTIC_SIGNALS_TO_HANDLE`` (they talk to
torchrun's agent, which does not exist here; see :data:`AGENT_ONLY`).
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import os
import random
import socket
import struct
import sys
import time
import uuid

from mpi4py import MPI

from ..core import errors, job, ranklists
from . import threads
from .launcher import node_layout

CALL = "mpidist.run"

#: Variables that follow from the job's layout; a value already set must equal MPI's.
LAYOUT_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
               "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE")
#: torchrun variables only its agent process uses; never set here.
AGENT_ONLY = ("TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE")
#: Seconds a remote node waits to reach one of rank 0's candidate addresses.
PROBE_TIMEOUT = 3.0
#: The lowest port rank 0 draws for the script's store (above the well-known services').
PORTS_FROM = 20000


def agree(problem: str | None, comm: MPI.Intracomm, call: str = CALL) -> None:
    """Raise ``RuntimeError`` on every rank when any rank has a ``problem`` (``MPI_Allgather``).

    A rank with its own problem reports it; the others name the ranks that had one and
    the first such problem, so no rank walks on into a collective that would hang.
    """
    problems = comm.allgather(problem)
    bad = [r for r, p in enumerate(problems) if p is not None]
    if not bad:
        return
    if problem is not None:
        raise errors.runtime_error(call, problem)
    raise errors.runtime_error(
        call, f"rank(s) {ranklists.ranges(bad)} cannot start; rank {bad[0]}: {problems[bad[0]]}")


def layout_environment(comm: MPI.Intracomm | None = None) -> dict[str, str]:
    """The layout variables of :data:`LAYOUT_VARS` plus ``ROLE_NAME`` for this rank.

    Collective over ``comm`` (default ``MPI_COMM_WORLD``): see :func:`~mpidist.start.launcher.node_layout`.
    """
    comm = comm if comm is not None else job.world
    local_rank, local_size, node_rank, num_nodes = node_layout(comm)
    rank, size = comm.Get_rank(), comm.Get_size()
    values = (rank, size, local_rank, local_size, node_rank, num_nodes, rank, size)
    env = {var: str(v) for var, v in zip(LAYOUT_VARS, values)}
    env["ROLE_NAME"] = "default"
    return env


def contradictions(wanted: dict[str, str], environ: dict[str, str] | None = None) -> str | None:
    """Text naming every layout variable already set to a value other than MPI's, else ``None``."""
    environ = os.environ if environ is None else environ
    wrong = []
    for var in LAYOUT_VARS:
        have = environ.get(var, "").strip()
        if have and have != wanted[var]:
            wrong.append(f"${var}={have} but MPI gives {wanted[var]}")
    if not wrong:
        return None
    return ("torchrun variables contradict MPI: " + "; ".join(wrong) + ". MPI is the source of truth: "
            "unset them (they leak in from the shell, or from `mpiexec -x`/`-genv`), or start the "
            "job with the matching `mpiexec -n N`")


def _interface_addresses() -> list[str]:
    """IPv4 addresses of this host's interfaces (Linux ``SIOCGIFADDR``), loopback excluded."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
            except OSError:  # an interface without an IPv4 address
                continue
            found.append(socket.inet_ntoa(packed[20:24]))
    return [a for a in found if not ipaddress.ip_address(a).is_loopback]


def _candidates() -> list[str]:
    """Rank 0's names and addresses that another node may reach: FQDN first, as torchrun."""
    out = []
    for name in (socket.getfqdn(), socket.gethostname()):
        try:
            infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
        except OSError:
            continue
        ips = [i[4][0] for i in infos]
        if ips and not all(ipaddress.ip_address(ip).is_loopback for ip in ips):
            out.append(name)
        out.extend(ip for ip in ips if not ipaddress.ip_address(ip).is_loopback)
    out.extend(_interface_addresses())
    return list(dict.fromkeys(out))


def _reachable(candidates: list[str], port: int) -> list[str]:
    """The candidates a TCP connection to ``port`` reaches from here (within :data:`PROBE_TIMEOUT`)."""
    ok = []
    for host in candidates:
        try:
            socket.create_connection((host, port), timeout=PROBE_TIMEOUT).close()
            ok.append(host)
        except OSError:
            continue
    return ok


def _ephemeral() -> range:
    """The ports the kernel gives outgoing connections (``ip_local_port_range``)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = map(int, f.read().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    return range(low, high + 1)


def _listener(host: str) -> socket.socket:
    """A socket listening on a free port for the script's store, below the ephemeral range.

    The port is free now, but the store binds it seconds later (the script imports torch
    first). Any outgoing connection on the machine may take an ephemeral port in between, and
    the store then fails with EADDRINUSE (seen once in the suite), so the port is drawn from
    below that range, where only a deliberate bind can take it. No SO_REUSEADDR: a port that a
    socket holds, even in TIME_WAIT, is refused here rather than in the store.
    """
    ephemeral = _ephemeral()
    draws = random.Random(os.getpid() ^ time.time_ns())
    ports = [draws.randrange(PORTS_FROM, ephemeral.start) for _ in range(50)] \
        if ephemeral.start > PORTS_FROM + 1000 else []
    for port in ports:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((host, port))
            break
        except OSError:
            sock.close()
    else:  # every draw taken (or no room below the range): the kernel's choice
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((host, 0))
    sock.listen(socket.SOMAXCONN)  # probes queue up unaccepted
    return sock


def _listeners(hosts: list[str]) -> list[socket.socket]:
    """Sockets listening on one free port, one on each IPv4 address of ``hosts`` (names resolved here).

    Never on every interface: a peer's probe reaches only the addresses offered to it.
    ``OSError`` when a host has no address of this machine, or no port is free on all of them.
    """
    addresses = list(dict.fromkeys(socket.gethostbyname(h) for h in hosts))
    if not addresses:
        raise OSError("no address other than loopback to listen on")
    for _ in range(20):
        socks = [_listener(addresses[0])]
        port = socks[0].getsockname()[1]
        try:
            for address in addresses[1:]:
                socks.append(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                socks[-1].bind((address, port))
                socks[-1].listen(socket.SOMAXCONN)
            return socks
        except OSError as exc:
            for s in socks:
                s.close()
            if exc.errno != errno.EADDRINUSE:
                raise
    raise OSError(f"no port was free on every one of {addresses}")


def master_address(comm: MPI.Intracomm, local_rank: int, single_node: bool, call: str = CALL
                   ) -> tuple[str, str]:
    """``(MASTER_ADDR, MASTER_PORT)``: rank 0's choice, the same on every rank.

    Collective over ``comm``. A ``MASTER_ADDR``/``MASTER_PORT`` set on rank 0 is kept.
    Otherwise rank 0 listens on a free port; on one node the address is ``127.0.0.1``,
    across nodes each other node's first rank tries rank 0's host names and addresses
    and the first that every node reached is taken (``MPI_Bcast`` out, ``MPI_Allgather``
    back). A rank whose own ``MASTER_ADDR``/``MASTER_PORT`` differs from rank 0's raises.

    While the nodes probe, rank 0 listens on loopback (one node) or on each candidate's
    address (``MASTER_ADDR``'s alone when set), never on every interface; it stops when the
    choice is made. The store that later binds the port is the caller's: torch's own
    ``TCPStore`` server binds every interface (``[::]``), which is why mpidist's entry points host
    the store themselves, on the one address (:func:`torchrun_environment`'s ``hosted``,
    :func:`mpidist.torch.rendezvous.serve_env_store`).
    """
    rank = comm.Get_rank()
    given = (os.environ.get("MASTER_ADDR", "").strip(), os.environ.get("MASTER_PORT", "").strip())
    listeners: list[socket.socket] = []
    problem, plan = None, None
    if rank == 0:
        try:
            addr, port = given
            candidates = [addr] if addr else ["127.0.0.1"] if single_node else _candidates()
            if not port:
                listeners = [_listener("127.0.0.1")] if single_node else _listeners(candidates)
                port = str(listeners[0].getsockname()[1])
            elif not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"$MASTER_PORT={port!r} is not a port number (1-65535)")
            plan = (candidates, port, not single_node and not addr and bool(listeners))
        except (OSError, ValueError) as exc:
            problem = f"rank 0 cannot choose MASTER_ADDR/MASTER_PORT: {exc}"
    try:
        agree(problem, comm, call)
        candidates, port, probe = comm.bcast(plan, root=0)
        seen = _reachable(candidates, int(port)) if probe and local_rank == 0 and rank != 0 else None
        heard = comm.allgather(seen)
    finally:
        for listener in listeners:
            listener.close()
    reached = [h for h in candidates if all(s is None or h in s for s in heard)]
    problem = None
    if not reached:
        problem = (f"no address of rank 0 ({', '.join(candidates) or 'none found'}) was reachable on port "
                   f"{port} from every node; set MASTER_ADDR to rank 0's address on the network the "
                   "nodes share")
    agree(problem, comm, call)
    addr = reached[0]
    mine = []
    for var, have, want in (("MASTER_ADDR", given[0], addr), ("MASTER_PORT", given[1], port)):
        if have and have != want:
            mine.append(f"${var}={have} here but rank 0 uses {want}")
    agree("; ".join(mine) or None, comm, call)
    return addr, port


def torchrun_environment(comm: MPI.Intracomm | None = None, call: str = CALL, hosted: bool = False
                         ) -> dict[str, str]:
    """Every variable this rank should get (see the module docstring), checked on every rank.

    Collective over ``comm`` (default ``MPI_COMM_WORLD``). A layout variable already set
    to another value than MPI's, on any rank, makes every rank raise ``RuntimeError``.

    ``hosted``: the caller serves the store itself, as torchrun's agent does (rank 0 holds a
    ``TCPStore`` bound to one address, :func:`mpidist.torch.rendezvous.mpi_store`), and adds
    ``MASTER_ADDR``/``MASTER_PORT`` once it listens; ``TORCHELASTIC_USE_AGENT_STORE`` is then
    ``True``, so that torch's ``env://`` rendezvous connects to it on every rank instead of
    starting a second server on rank 0, one that would listen on every interface.
    """
    comm = comm if comm is not None else job.world
    env = layout_environment(comm)
    agree(contradictions(env), comm, call)
    single_node = env["GROUP_WORLD_SIZE"] == "1"
    if not hosted:
        env["MASTER_ADDR"], env["MASTER_PORT"] = master_address(comm, int(env["LOCAL_RANK"]), single_node,
                                                                call)
    env["TORCHELASTIC_RUN_ID"] = comm.bcast(f"mpidist-{uuid.uuid4().hex[:12]}" if comm.Get_rank() == 0
                                            else None, root=0)
    env["TORCHELASTIC_RESTART_COUNT"] = env["TORCHELASTIC_MAX_RESTARTS"] = "0"
    env["TORCHELASTIC_USE_AGENT_STORE"] = str(hosted)
    env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if "OMP_NUM_THREADS" in os.environ or env["LOCAL_WORLD_SIZE"] != "1":
        env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
    policy = threads.wait_policy(int(env["LOCAL_WORLD_SIZE"]),
                                 threads.threads_of(env.get("OMP_NUM_THREADS")) or threads.usable_cores(),
                                 masks=threads.gather_masks(comm))
    # more threads than cores: OpenMP's spins would take them. Read when torch loads OpenMP, so
    # only before that; later the torch backend's warning says what to do
    if policy is not None and "torch" not in sys.modules:
        env["OMP_WAIT_POLICY"] = policy
    return env


def export(env: dict[str, str]) -> None:
    """Put ``env`` into ``os.environ`` and drop :data:`AGENT_ONLY` leftovers."""
    for var in AGENT_ONLY:
        os.environ.pop(var, None)
    os.environ.update(env)

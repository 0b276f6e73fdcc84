"""torch's rendezvous from MPI: rank, world size and a real store, with no variables set.

torch wants a store plus rank and world size, or the ``env://`` variables. Under an MPI
launcher all of it follows from MPI: :func:`install` wraps torch's ``env://`` handler so
that, when ``MASTER_ADDR``/``MASTER_PORT`` are not set, rank 0 starts a ``TCPStore`` on a
free port and broadcasts its address with ``MPI_Bcast``. The store has no authentication, so it
listens on loopback when the job is on one node and on the one address of rank 0's host that the
other nodes reach otherwise, never on every interface (:func:`mpi_store`). Where a library sets
up ``env://`` itself (``python -m mpidist.run``, :func:`mpidist.torch.use_for_cpu`, Lightning),
:func:`serve_env_store` serves that store before it starts, as torchrun's agent does. Rank and
size come from ``MPI_COMM_WORLD``; a ``RANK``/``WORLD_SIZE`` (variable or argument) that disagrees
with MPI raises ``ValueError``, in a job of several ranks on every rank at once (also when the
variables are set: then torch's own handler runs after the check).
"""

from __future__ import annotations

import importlib
import ipaddress
import os
import socket
from datetime import timedelta
from typing import Any, Iterator
from urllib.parse import parse_qs, urlsplit

from mpi4py import MPI

from ..core import errors, job

CALL = "init_process_group"


def local_rank_and_size() -> tuple[int, int]:
    """This process's rank among the ranks of its node (``MPI_COMM_TYPE_SHARED``)."""
    node = job.world.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_rank(), node.Get_size()
    finally:
        node.Free()


def _stated(url: str) -> dict[str, int]:
    out = {}
    for key, var in (("rank", "RANK"), ("world_size", "WORLD_SIZE")):
        values = parse_qs(urlsplit(url).query).get(key)
        text = values[-1] if values else os.environ.get(var, "").strip()
        if text:
            try:
                out[key] = int(text)
            except ValueError:
                raise errors.value_error(CALL, f"{var}={text!r} is not an integer") from None
    return out


def identity_problem(rank: int, world_size: int) -> str | None:
    """Why ``rank``/``world_size`` (``-1``: not stated) contradict MPI's, else ``None``."""
    me, size = job.world.Get_rank(), job.world.Get_size()
    for what, value, actual in (("world_size", world_size, size), ("rank", rank, me)):
        if value not in (-1, None) and value != actual:
            return (f"{what}={value} disagrees with MPI, which gives this process {what}={actual}; "
                    + _fix(rank, world_size))
    return None


def _fix(rank: int, world_size: int) -> str:
    """How to get out of a contradiction: Slurm's proxy step under mpiexec is the usual cause."""
    if os.environ.get("SLURM_PROCID") is not None and job.world.Get_size() > 1 and \
            (str(rank), str(world_size)) == (os.environ["SLURM_PROCID"], os.environ.get("SLURM_NTASKS")):
        return (f"these are SLURM_PROCID={rank} and SLURM_NTASKS={world_size}, which under mpiexec inside "
                "an allocation describe mpiexec's own launch step, not the ranks (Lightning's "
                "SLURMEnvironment reads them). Start the ranks with `srun --mpi=pmi2 python ...`, or "
                "keep mpiexec and call mpidist.torch.use_for_cpu() first (or run the script through "
                "`python -m mpidist.run`), or give Lightning "
                "plugins=[mpidist.integrations.lightning.MpidistEnvironment()]")
    return ("MPI is the source of truth (start the job with mpiexec -n N, or drop the setting)")


def check_identity(rank: int, world_size: int) -> None:
    """``rank``/``world_size`` (``-1``: not stated) must equal MPI's; ``ValueError`` on this rank."""
    problem = identity_problem(rank, world_size)
    if problem is not None:
        raise errors.value_error(CALL, problem)


def agree_identity(rank: int, world_size: int) -> None:
    """:func:`check_identity` on every rank at once: ``ValueError`` everywhere when any rank's is wrong.

    Collective over ``MPI_COMM_WORLD`` (``MPI_Allgather``): a rank whose own values are right
    must not walk on into a rendezvous its peers never reach.
    """
    problems = job.world.allgather(identity_problem(rank, world_size))
    bad = [r for r, p in enumerate(problems) if p is not None]
    if not bad:
        return
    mine = problems[job.world.Get_rank()]
    raise errors.value_error(CALL, mine or f"rank(s) {', '.join(map(str, bad))} were given a rank or world "
                             f"size that contradicts MPI; rank {bad[0]}: {problems[bad[0]]}")


def export_environment() -> None:
    """Set ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` from MPI where unset."""
    local, local_size = local_rank_and_size()
    for var, value in (("RANK", job.world.Get_rank()), ("WORLD_SIZE", job.world.Get_size()),
                       ("LOCAL_RANK", local), ("LOCAL_WORLD_SIZE", local_size)):
        os.environ.setdefault(var, str(value))


def _node_facts(comm: MPI.Intracomm) -> tuple[bool, bool]:
    """``(one node, first rank of this node)`` from ``MPI_COMM_TYPE_SHARED``: the same on every rank."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_size() == comm.Get_size(), node.Get_rank() == 0
    finally:
        node.Free()


def _candidates(call: str = CALL) -> list[tuple[str, str]]:
    """Rank 0's ``(name to advertise, IPv4 address to bind)`` pairs for a job across nodes.

    ``MASTER_ADDR`` alone when set; otherwise every interface address, then the host's name
    where it resolves to an address of its own that no interface listed.
    """
    from . import netaddr

    here = socket.gethostname()
    given = os.environ.get("MASTER_ADDR", "").strip()
    if given:
        address = netaddr.ipv4_of(given)
        if address is None or ipaddress.ip_address(address).is_loopback:
            raise errors.runtime_error(
                call, f"MASTER_ADDR={given!r} resolves to {address or 'no IPv4 address'} on rank 0's host "
                f"{here}, which the other nodes cannot reach; set MASTER_ADDR to an address of an interface "
                "they share (or unset it: rank 0 then finds one)")
        return [(given, address)]
    found = [(str(iface.ip), str(iface.ip)) for _, iface in netaddr.interfaces()]
    name = socket.getfqdn()
    address = netaddr.ipv4_of(name)
    if address is not None and not ipaddress.ip_address(address).is_loopback and \
            address not in {a for _, a in found}:
        found.append((name, address))
    if not found:
        raise errors.runtime_error(
            call, f"rank 0's host {here} has no IPv4 address other than loopback for the ranks on the other "
                  "nodes; set MASTER_ADDR to one they can reach")
    return found


def _choose(offer: list[tuple[str, str, int]], reports: list[Any], call: str = CALL) -> int:
    """The offered address every node reaches, directly where possible; ``RuntimeError`` when none.

    ``reports`` holds, from one rank per node other than rank 0's, ``(host, scores)`` as
    :func:`netaddr.probe` gives them (``None`` from every other rank).
    """
    reports = [r for r in reports if r is not None]
    if not reports:  # every rank is on rank 0's node
        return 0
    worst = [min(scores[i] for _, scores in reports) for i in range(len(offer))]
    if max(worst) > 0:
        return worst.index(max(worst))  # ties: the first in rank 0's order (interfaces, then its name)
    seen = "; ".join(f"{host} reached {[offer[i][0] for i, s in enumerate(scores) if s] or 'none'}"
                     for host, scores in reports)
    raise errors.runtime_error(
        call, f"no address of rank 0's host {socket.gethostname()} ({[o[0] for o in offer]}) is reached from "
        f"every node ({seen}); set MASTER_ADDR to an address of rank 0's host that the other nodes can reach")


def mpi_store(timeout: timedelta, call: str = CALL) -> Any:
    """A ``TCPStore`` served by rank 0 on a free port, its address sent by ``MPI_Bcast``.

    Collective over ``MPI_COMM_WORLD``; every rank gets its client of the store, or the same
    ``RuntimeError`` when rank 0 could not start it.

    What the store listens on: torch's store has no authentication, so it never listens on
    every interface. When every rank is on rank 0's node (``MPI_COMM_TYPE_SHARED``) it
    listens on loopback only, ``127.0.0.1``. Across nodes it listens on one address of rank
    0's host: ``MASTER_ADDR`` when set without ``MASTER_PORT`` (it must resolve, on rank 0's
    host, to one of its addresses other than loopback), otherwise the one of its interface
    addresses (and its host name) that one rank of every other node reaches: rank 0 holds a
    listening socket on each, the other nodes try them all at once (:func:`netaddr.probe`),
    and rank 0 keeps the one every node reached, on the nodes' own subnet where there is one,
    else the first in its interfaces' order. So a host name that does not resolve on the
    other nodes, or resolves to loopback there, does not matter. The socket is bound before
    torch gets it (``master_listen_fd``), so the store never listens more widely, not even
    for a moment.
    """
    from torch.distributed import TCPStore

    from . import netaddr

    comm = job.world
    me, size = comm.Get_rank(), comm.Get_size()
    single, first_on_node = _node_facts(comm)
    error: Exception | None = None
    listeners: list[socket.socket] = []
    offer: list[tuple[str, str, int]] | None = None
    if me == 0:
        try:
            pairs = [("127.0.0.1", "127.0.0.1")] if single else _candidates(call)
            for name, address in pairs:
                try:
                    listeners.append(netaddr.listener(address))
                except OSError as exc:
                    raise errors.runtime_error(
                        call, f"rank 0 cannot listen on {address} ({name}) on its host "
                        f"{socket.gethostname()}: {exc}; MASTER_ADDR, when set, must be an address of "
                        "rank 0's host") from exc
            offer = [(name, address, s.getsockname()[1]) for (name, address), s in zip(pairs, listeners)]
        except Exception as exc:  # noqa: BLE001 - every rank must learn that it failed
            error = exc
    offer = comm.bcast(offer if error is None else None, 0)
    reports: list[Any] = []
    if offer is not None and not single:
        # one rank per node probes: the ranks of a node reach the same addresses
        mine = (socket.gethostname(), netaddr.probe(offer)) if first_on_node and me != 0 else None
        reports = comm.gather(mine, 0) or []
    store, chosen = None, None
    if me == 0:
        try:
            if error is None:
                index = _choose(offer, reports, call)
                name, _, port = offer[index]
                # torch's store takes the socket over and closes it: it must not be closed here too
                fd = listeners.pop(index).detach()
                store = TCPStore(name, port, size, True, timeout=timeout, wait_for_workers=False,
                                 master_listen_fd=fd)
                chosen = (name, port)
        except Exception as exc:  # noqa: BLE001
            error = exc
        finally:
            for s in listeners:  # the addresses not chosen stop listening at once
                s.close()
        failed = None if error is None else f"{type(error).__name__}: {error}"
        comm.bcast((chosen, failed), 0)
        if error is not None:
            raise error
        return store
    chosen, failed = comm.bcast(None, 0)
    if chosen is None:
        raise errors.runtime_error(call, f"rank 0 could not start the TCPStore: {failed or 'see its error'}")
    name, port = chosen
    return TCPStore(name, port, size, False, timeout=timeout)


_served: Any = None  # rank 0's store from serve_env_store, alive with the process (torchrun's agent store)
_served_port: str | None = None  # the MASTER_PORT serve_env_store set last (every rank): not one set by hand


def serve_env_store(timeout: timedelta = timedelta(minutes=30), call: str = CALL) -> tuple[str, int]:
    """Serve torch's ``env://`` store from rank 0 on one address, as torchrun's agent does; ``(host, port)``.

    Collective over ``MPI_COMM_WORLD``; every rank gets the same address and port, also in
    ``MASTER_ADDR``/``MASTER_PORT``. What ``python -m mpidist.run``, :func:`mpidist.torch.use_for_cpu`
    and Lightning's :class:`~mpidist.integrations.lightning.MpidistEnvironment` do before
    torch.distributed starts. Rank 0 starts :func:`mpi_store`'s ``TCPStore`` (``127.0.0.1`` on one
    node; across nodes the one address every node reached) and keeps it for the life of the
    process; ``TORCHELASTIC_USE_AGENT_STORE=True`` then makes torch's ``env://`` rendezvous
    connect to it from every rank, rank 0 included, instead of starting its own server, which
    listens on every interface (``[::]``) whatever ``MASTER_ADDR`` says. A later call serves a
    new store in place of this process's earlier one (torch.distributed must not be up then).

    A ``MASTER_PORT`` set by hand on rank 0 is kept: nothing is served, the address is agreed as
    :func:`mpidist.start.torchrun_env.master_address` agrees it, ``TORCHELASTIC_USE_AGENT_STORE``
    is ``False`` and torch's own server starts on rank 0, on every interface, as under plain
    ``env://``.
    """
    global _served, _served_port
    from ..start import launcher, torchrun_env

    comm = job.world
    port = os.environ.get("MASTER_PORT", "").strip()
    by_hand = comm.bcast(bool(port) and port != _served_port if comm.Get_rank() == 0 else None, 0)
    if by_hand:
        local_rank, _, _, num_nodes = launcher.node_layout(comm)
        host, port = torchrun_env.master_address(comm, local_rank, num_nodes == 1, call)
        os.environ.update(MASTER_ADDR=host, MASTER_PORT=port, TORCHELASTIC_USE_AGENT_STORE="False")
        return host, int(port)
    store = mpi_store(timeout, call)
    _served = store if comm.Get_rank() == 0 else None  # other ranks' clients close: torch connects its own
    _served_port = str(store.port)
    os.environ.update(MASTER_ADDR=store.host, MASTER_PORT=_served_port, TORCHELASTIC_USE_AGENT_STORE="True")
    return store.host, store.port


def _env_handler(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs: Any) -> Iterator[Any]:
    from ..start import spares

    spares.park()  # a spare waits here until called in (MPIDIST_SPARES)
    stated = _stated(url)
    rank, world_size = stated.get("rank", -1), stated.get("world_size", -1)
    if job.is_newcomer():
        # a spare called in by heal_group: the survivors are not in a rendezvous, and the mpidist
        # backend needs no store, so this process's store is its own
        from torch.distributed import HashStore

        check_identity(rank, world_size)
        yield HashStore(), job.world.Get_rank(), job.world.Get_size()
        raise RuntimeError("env:// rendezvous from MPI cannot re-rendezvous")
    if job.world.Get_size() > 1:
        # before any store is started: ranks that all believe they are rank 0 (Slurm's variables
        # under mpiexec) would otherwise race for one port and train apart
        agree_identity(rank, world_size)
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        yield from _original(url, timeout=timeout, **kwargs)
        return
    check_identity(rank, world_size)
    export_environment()
    store = mpi_store(timeout)
    yield store, job.world.Get_rank(), job.world.Get_size()
    raise RuntimeError("env:// rendezvous from MPI cannot re-rendezvous")


_original: Any = None


def install() -> None:
    """Route torch's ``env://`` rendezvous through :func:`_env_handler` (idempotent)."""
    global _original
    rdzv = importlib.import_module("torch.distributed.rendezvous")

    current = rdzv._rendezvous_handlers.get("env")
    if current is _env_handler:
        return
    _original = current
    rdzv._rendezvous_handlers["env"] = _env_handler

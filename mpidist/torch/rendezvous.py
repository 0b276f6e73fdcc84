"""torch's rendezvous from MPI: rank, world size and a real store, with no variables set.

torch wants a store plus rank and world size, or the ``env://`` variables. Under an MPI
launcher all of it follows from MPI: :func:`install` wraps torch's ``env://`` handler so
that, when ``MASTER_ADDR``/``MASTER_PORT`` are not set, rank 0 starts a ``TCPStore`` on a
free port and broadcasts its address with ``MPI_Bcast``. Rank and size come from
``MPI_COMM_WORLD``; a ``RANK``/``WORLD_SIZE`` (variable or argument) that disagrees with
MPI raises ``ValueError``, in a job of several ranks on every rank at once (also when the
variables are set: then torch's own handler runs after the check).
"""

from __future__ import annotations

import importlib
import os
import socket
from datetime import timedelta
from typing import Any, Iterator
from urllib.parse import parse_qs, urlsplit

from mpi4py import MPI

from ..core import errors

CALL = "init_process_group"


def local_rank_and_size() -> tuple[int, int]:
    """This process's rank among the ranks of its node (``MPI_COMM_TYPE_SHARED``)."""
    node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
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
    me, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    for what, value, actual in (("world_size", world_size, size), ("rank", rank, me)):
        if value not in (-1, None) and value != actual:
            return (f"{what}={value} disagrees with MPI, which gives this process {what}={actual}; "
                    + _fix(rank, world_size))
    return None


def _fix(rank: int, world_size: int) -> str:
    """How to get out of a contradiction: Slurm's proxy step under mpiexec is the usual cause."""
    if os.environ.get("SLURM_PROCID") is not None and MPI.COMM_WORLD.Get_size() > 1 and \
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
    problems = MPI.COMM_WORLD.allgather(identity_problem(rank, world_size))
    bad = [r for r, p in enumerate(problems) if p is not None]
    if not bad:
        return
    mine = problems[MPI.COMM_WORLD.Get_rank()]
    raise errors.value_error(CALL, mine or f"rank(s) {', '.join(map(str, bad))} were given a rank or world "
                             f"size that contradicts MPI; rank {bad[0]}: {problems[bad[0]]}")


def export_environment() -> None:
    """Set ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` from MPI where unset."""
    local, local_size = local_rank_and_size()
    for var, value in (("RANK", MPI.COMM_WORLD.Get_rank()), ("WORLD_SIZE", MPI.COMM_WORLD.Get_size()),
                       ("LOCAL_RANK", local), ("LOCAL_WORLD_SIZE", local_size)):
        os.environ.setdefault(var, str(value))


def _single_node(comm: MPI.Intracomm) -> bool:
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_size() == comm.Get_size()
    finally:
        node.Free()


def mpi_store(timeout: timedelta) -> Any:
    """A ``TCPStore`` served by rank 0 on a free port, its address sent by ``MPI_Bcast``.

    On one node the store listens on loopback. Across nodes rank 0 advertises its
    interface addresses (``MASTER_ADDR`` alone, when set without ``MASTER_PORT``) and
    every other rank connects to the first it can reach (its own subnets first), so a
    host name that does not resolve on the other nodes, or resolves to loopback there,
    does not matter.
    """
    from torch.distributed import TCPStore

    from . import netaddr

    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    single = _single_node(comm)
    if comm.Get_rank() == 0:
        error = None
        try:
            given = os.environ.get("MASTER_ADDR", "").strip()
            candidates = ["127.0.0.1"] if single else ([given] if given else netaddr.advertised_addresses())
            # the server listens on every interface; rank 0's own client uses the first address
            store = TCPStore(candidates[0], 0, size, True, timeout=timeout, wait_for_workers=False)
            address: Any = (candidates, store.port)
        except Exception as exc:  # noqa: BLE001 - every rank must learn that it failed
            error, address = exc, None
        address = comm.bcast(address, 0)
        if error is not None:
            raise error
        return store
    address = comm.bcast(None, 0)
    if address is None:
        raise errors.runtime_error(CALL, "rank 0 could not start the TCPStore; see its error")
    candidates, port = address
    host = candidates[0] if len(candidates) == 1 else netaddr.reachable(candidates, port)
    if host is None:
        raise errors.runtime_error(
            CALL, f"rank {comm.Get_rank()} on {socket.gethostname()} cannot reach rank 0's store at any of "
            f"{candidates} (port {port}); set MASTER_ADDR to an address of rank 0's host that the "
            "other nodes can reach"
        )
    return TCPStore(host, port, size, False, timeout=timeout)


def _env_handler(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs: Any) -> Iterator[Any]:
    stated = _stated(url)
    rank, world_size = stated.get("rank", -1), stated.get("world_size", -1)
    if MPI.COMM_WORLD.Get_size() > 1:
        # before any store is started: ranks that all believe they are rank 0 (Slurm's variables
        # under mpiexec) would otherwise race for one port and train apart
        agree_identity(rank, world_size)
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        yield from _original(url, timeout=timeout, **kwargs)
        return
    check_identity(rank, world_size)
    export_environment()
    store = mpi_store(timeout)
    yield store, MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
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

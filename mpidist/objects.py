"""Object collectives: picklable Python objects over MPI, as :mod:`mpidist.pickles` messages.

Each call exchanges the messages' sizes, then the messages, with the nonblocking MPI
routines waited on within the group's timeout (:mod:`mpidist.timeouts`): a missing rank makes
every waiting rank raise, as in the array calls. (mpi4py's pickling calls, ``pkl5`` included,
block inside MPI and cannot.) A receive probes for its message (``MPI_Improbe``, safe with
several receiving threads) and takes exactly that message (``MPI_Imrecv``). Results are
written into the caller's lists, as torch does; arrays in them are views of the received
bytes. Objects only ever arrive over MPI from ranks of the same job; nothing here reads a socket.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from . import debug, errors
from .calls import define
from .fingerprint import LENGTH, ROOT, agree
from .groups import ProcessGroup, group_rank_of, resolve
from .issue import displacements
from .p2p import peer_rank
from .pickles import Pickled, datatypes, load, receive_type, unit_for, units
from .tags import OBJECTS, mpi_tag
from .timeouts import until, wait


def _start(pg: ProcessGroup) -> MPI.Intracomm:
    """The group's communicator, taken right before the first MPI call (DETAIL checks here)."""
    if debug.LEVEL:
        debug.check(pg)
    pg.seq += 1
    return pg.comm


def _sizes(pg: ProcessGroup, call: Any, comm: MPI.Intracomm, nbytes: int) -> list[int]:
    """Every rank's pickle size (``MPI_Iallgather``)."""
    sizes = np.zeros(pg._size, np.int64)
    bufs = ([np.array([nbytes], np.int64), MPI.INT64_T], [sizes, MPI.INT64_T])
    wait((comm.Iallgather(*bufs),), pg, call, bufs)
    return sizes.tolist()


def _gatherv(pg: ProcessGroup, call: Any, comm: MPI.Intracomm, mine: Pickled,
             sizes: list[int], root: int | None) -> tuple[np.ndarray, list[int]]:
    """Every rank's message back to back (``MPI_Iallgatherv``, or ``MPI_Igatherv`` to ``root``),
    and where each starts. Off the root the bytes are empty."""
    unit = unit_for(sum(sizes))
    counts = [units(s, unit) for s in sizes]
    offsets = [d * unit for d in displacements(counts)]
    here = root is None or pg._rank == root
    whole = np.empty(sum(counts) * unit if here else 0, np.uint8)
    with datatypes() as keep:
        dt = receive_type(unit, keep)
        bufs = (mine.message(unit, keep), [whole, (counts, displacements(counts)), dt])
        if root is None:
            req = comm.Iallgatherv(*bufs)
        else:
            req = comm.Igatherv(bufs[0], bufs[1] if here else None, root)
        wait((req,), pg, call, (bufs, keep))
    return whole, offsets


def allgather(pg: ProcessGroup, call: Any, obj: Any) -> list[Any]:
    """Every rank's ``obj`` on every rank, in rank order (for mpidist's own exchanges too)."""
    comm = _start(pg)
    mine = Pickled(obj)
    sizes = _sizes(pg, call, comm, mine.nbytes)
    whole, offsets = _gatherv(pg, call, comm, mine, sizes, None)
    return [load(whole, off) for off in offsets]


def _bcast(pg: ProcessGroup, call: Any, comm: MPI.Intracomm, mine: Pickled | None,
           root: int) -> np.ndarray | None:
    """The root's message on the other ranks (``MPI_Ibcast`` of its size, then of it)."""
    size = np.array([0 if mine is None else mine.nbytes], np.int64)
    wait((comm.Ibcast([size, MPI.INT64_T], root),), pg, call, size)
    unit = unit_for(int(size[0]))
    with datatypes() as keep:
        if mine is not None:
            buf, msg = None, mine.message(unit, keep)
        else:
            buf = np.empty(units(int(size[0]), unit) * unit, np.uint8)
            msg = [buf, buf.size // unit, receive_type(unit, keep)]
        wait((comm.Ibcast(msg, root),), pg, call, (msg, keep))
    return buf


def _list(obj: Any, call: Any, arg: str, length: int | None = None) -> list:
    if not isinstance(obj, list):
        raise errors.type_error(call, f"argument '{arg}' must be a list, got {errors.type_name(obj)}")
    if length is not None and len(obj) != length:
        raise errors.value_error(
            call, f"argument '{arg}' has {len(obj)} entries; the group has {length} ranks"
        )
    return obj


@define(fingerprint=agree(src=ROOT, object_list=LENGTH))
def broadcast_object_list(object_list: list[Any], src: int | None = None, group: Any = None,
                          device: Any = None, group_src: int | None = None) -> None:
    """Replace every rank's ``object_list`` contents with ``src``'s.

    Becomes ``MPI_Ibcast`` of the pickle's size, then of the pickle. Every rank passes a
    list of the same length; only ``src``'s contents matter.
    """
    call = broadcast_object_list.call
    pg = resolve(group, call)
    root = group_rank_of(pg, src, group_src, call, "src")
    _list(object_list, call, "object_list")
    comm = _start(pg)
    buf = _bcast(pg, call, comm, Pickled(object_list) if pg._rank == root else None, root)
    if buf is not None:
        received = load(buf)
        if len(received) != len(object_list):
            raise errors.value_error(
                call, f"the source sent {len(received)} objects but 'object_list' has "
                f"{len(object_list)} entries"
            )
        object_list[:] = received


@define(fingerprint=agree())
def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
    """Every rank's ``obj`` into ``object_list[rank]`` on every rank.

    Becomes ``MPI_Iallgather`` of the pickles' sizes, then ``MPI_Iallgatherv`` of the pickles.
    """
    call = all_gather_object.call
    pg = resolve(group, call)
    _list(object_list, call, "object_list", pg._size)
    object_list[:] = allgather(pg, call, obj)


@define(fingerprint=agree(dst=ROOT))
def gather_object(obj: Any, object_gather_list: list[Any] | None = None, dst: int | None = None,
                  group: Any = None, group_dst: int | None = None) -> None:
    """Every rank's ``obj`` into ``object_gather_list`` on ``dst``.

    Becomes ``MPI_Iallgather`` of the sizes (every rank must know them, as in torch), then
    ``MPI_Igatherv`` of the pickles. Only the destination passes a list (of group size); the
    others pass ``None``.
    """
    call = gather_object.call
    pg = resolve(group, call)
    root = group_rank_of(pg, dst, group_dst, call, "dst")
    if pg._rank == root:
        if object_gather_list is None:
            raise errors.value_error(call, "object_gather_list is required on the destination rank")
        _list(object_gather_list, call, "object_gather_list", pg._size)
    elif object_gather_list:
        raise errors.value_error(call, "object_gather_list must be given only on the destination rank")
    comm = _start(pg)
    mine = Pickled(obj)
    sizes = _sizes(pg, call, comm, mine.nbytes)
    whole, offsets = _gatherv(pg, call, comm, mine, sizes, root)
    if pg._rank == root:
        object_gather_list[:] = [load(whole, off) for off in offsets]


@define(fingerprint=agree(src=ROOT))
def scatter_object_list(scatter_object_output_list: list[Any],
                        scatter_object_input_list: list[Any] | None = None,
                        src: int | None = None, group: Any = None,
                        group_src: int | None = None) -> None:
    """``src``'s ``scatter_object_input_list[i]`` into rank i's ``scatter_object_output_list[0]``.

    Becomes ``MPI_Ibcast`` of the pickles' sizes, then ``MPI_Iscatterv`` of the pickles.
    """
    call = scatter_object_list.call
    pg = resolve(group, call)
    root = group_rank_of(pg, src, group_src, call, "src")
    out = _list(scatter_object_output_list, call, "scatter_object_output_list")
    if not out:
        raise errors.value_error(call, "scatter_object_output_list must have at least one entry")
    if pg._rank == root:
        if scatter_object_input_list is None:
            raise errors.value_error(call, "scatter_object_input_list is required on the source rank")
        _list(scatter_object_input_list, call, "scatter_object_input_list", pg._size)
    comm = _start(pg)
    sizes = np.zeros(pg._size, np.int64)
    if pg._rank == root:
        each = [Pickled(o) for o in scatter_object_input_list]
        sizes[:] = [p.nbytes for p in each]
    wait((comm.Ibcast([sizes, MPI.INT64_T], root),), pg, call, sizes)
    unit = unit_for(int(sizes.sum()))
    counts = [units(int(s), unit) for s in sizes]
    mine = np.empty(counts[pg._rank] * unit, np.uint8)
    with datatypes() as keep:
        dt = receive_type(unit, keep)
        send = None
        if pg._rank == root:  # MPI_Scatterv sends from one buffer: the messages copied into it
            whole = np.empty(sum(counts) * unit, np.uint8)
            for p, at in zip(each, displacements(counts)):
                p.copy_into(whole[at * unit:])
            send = [whole, (counts, displacements(counts)), dt]
        bufs = (send, [mine, dt])
        wait((comm.Iscatterv(*bufs, root),), pg, call, (bufs, keep))
    out[0] = load(mine)


def _send(pg: ProcessGroup, call: Any, mine: Pickled, peer: int, tag: int) -> None:
    """One message to ``peer`` (``MPI_Isend``)."""
    comm = _start(pg)
    unit = unit_for(mine.nbytes)
    with datatypes() as keep:
        msg = mine.message(unit, keep)
        wait((comm.Isend(msg, peer, tag),), pg, call, (msg, keep))


def _recv(pg: ProcessGroup, call: Any, source: int, tag: int, status: MPI.Status) -> np.ndarray:
    """The next message from ``source`` on ``tag``, whatever its size (``MPI_Improbe``, ``MPI_Imrecv``)."""
    comm = _start(pg)
    found: list[MPI.Message] = []

    def probed() -> bool:
        m = comm.Improbe(source, tag, status)
        if m is not None:
            found.append(m)
        return m is not None

    if not probed():
        until(probed, pg, call)
    nbytes = status.Get_elements(MPI.BYTE)
    unit = unit_for(nbytes)
    buf = np.empty(nbytes, np.uint8)
    with datatypes() as keep:
        msg = [buf, nbytes // unit, receive_type(unit, keep)]
        wait((found[0].Irecv(msg),), pg, call, (msg, keep))
    return buf


@define(hooked=False)
def send_object_list(object_list: list[Any], dst: int | None = None, group: Any = None,
                     device: Any = None, group_dst: int | None = None) -> None:
    """Send the objects of ``object_list`` to ``dst`` (``MPI_Isend`` of one pickle)."""
    call = send_object_list.call
    pg = resolve(group, call)
    peer = peer_rank(pg, dst, group_dst, call, "dst")
    _list(object_list, call, "object_list")
    _send(pg, call, Pickled(list(object_list)), peer, mpi_tag(0, call, OBJECTS))


@define(hooked=False)
def recv_object_list(object_list: list[Any], src: int | None = None, group: Any = None,
                     device: Any = None, group_src: int | None = None) -> int:
    """Receive objects into ``object_list`` (same length as sent); return the sender's global rank.

    Becomes ``MPI_Improbe`` and ``MPI_Imrecv``; ``src=None`` receives from any rank
    (``MPI_ANY_SOURCE``).
    """
    call = recv_object_list.call
    pg = resolve(group, call)
    source = peer_rank(pg, src, group_src, call, "src", any_source=True)
    _list(object_list, call, "object_list")
    status = MPI.Status()
    received = load(_recv(pg, call, source, mpi_tag(0, call, OBJECTS), status))
    sender = pg.ranks[status.Get_source()]
    if len(received) != len(object_list):
        raise errors.value_error(
            call, f"rank {sender} sent {len(received)} objects but 'object_list' has "
            f"{len(object_list)} entries"
        )
    object_list[:] = received
    return sender


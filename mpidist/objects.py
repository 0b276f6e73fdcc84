"""Object collectives: picklable Python objects over MPI with pickle protocol 5.

``mpi4py.util.pkl5`` does the transport: protocol-5 pickles with out-of-band buffers
(numpy arrays travel without an extra copy) and no 2 GiB limit on a message. Results
are written into the caller's lists, as torch does. Objects only ever arrive over MPI
from ranks of the same job; nothing here reads a socket.
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI
from mpi4py.util import pkl5

from . import debug, errors
from .calls import define
from .fingerprint import LENGTH, ROOT, agree
from .groups import ProcessGroup, group_rank_of, resolve
from .p2p import peer_rank
from .tags import OBJECTS, mpi_tag


def _comm(pg: ProcessGroup) -> pkl5.Intracomm:
    """The pickling communicator, taken right before the MPI call (DETAIL checks happen here)."""
    if debug.LEVEL:
        debug.check(pg)
    pg.seq += 1
    return pkl5.Intracomm(pg.comm)


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
    """Replace every rank's ``object_list`` contents with ``src``'s (``MPI_Bcast`` of pickles).

    Every rank passes a list of the same length; only ``src``'s contents matter.
    """
    call = broadcast_object_list.call
    pg = resolve(group, call)
    root = group_rank_of(pg, src, group_src, call, "src")
    _list(object_list, call, "object_list")
    received = _comm(pg).bcast(object_list if pg._rank == root else None, root)
    if pg._rank != root:
        if len(received) != len(object_list):
            raise errors.value_error(
                call, f"the source sent {len(received)} objects but 'object_list' has "
                f"{len(object_list)} entries"
            )
        object_list[:] = received


@define(fingerprint=agree())
def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
    """Every rank's ``obj`` into ``object_list[rank]`` on every rank (``MPI_Allgather``)."""
    call = all_gather_object.call
    pg = resolve(group, call)
    _list(object_list, call, "object_list", pg._size)
    object_list[:] = _comm(pg).allgather(obj)


@define(fingerprint=agree(dst=ROOT))
def gather_object(obj: Any, object_gather_list: list[Any] | None = None, dst: int | None = None,
                  group: Any = None, group_dst: int | None = None) -> None:
    """Every rank's ``obj`` into ``object_gather_list`` on ``dst`` (``MPI_Gather``).

    Only the destination passes a list (of group size); the others pass ``None``.
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
    result = _comm(pg).gather(obj, root)
    if pg._rank == root:
        object_gather_list[:] = result


@define(fingerprint=agree(src=ROOT))
def scatter_object_list(scatter_object_output_list: list[Any],
                        scatter_object_input_list: list[Any] | None = None,
                        src: int | None = None, group: Any = None,
                        group_src: int | None = None) -> None:
    """``src``'s ``scatter_object_input_list[i]`` into rank i's ``scatter_object_output_list[0]``.

    Becomes ``MPI_Scatter`` of pickles.
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
    out[0] = _comm(pg).scatter(scatter_object_input_list if pg._rank == root else None, root)


@define(hooked=False)
def send_object_list(object_list: list[Any], dst: int | None = None, group: Any = None,
                     device: Any = None, group_dst: int | None = None) -> None:
    """Send the objects of ``object_list`` to ``dst`` (``MPI_Send`` of one pickle)."""
    call = send_object_list.call
    pg = resolve(group, call)
    peer = peer_rank(pg, dst, group_dst, call, "dst")
    _list(object_list, call, "object_list")
    _comm(pg).send(list(object_list), peer, mpi_tag(0, call, OBJECTS))


@define(hooked=False)
def recv_object_list(object_list: list[Any], src: int | None = None, group: Any = None,
                     device: Any = None, group_src: int | None = None) -> int:
    """Receive objects into ``object_list`` (same length as sent); return the sender's global rank.

    ``src=None`` receives from any rank (``MPI_ANY_SOURCE``).
    """
    call = recv_object_list.call
    pg = resolve(group, call)
    source = peer_rank(pg, src, group_src, call, "src", any_source=True)
    _list(object_list, call, "object_list")
    status = MPI.Status()
    received = _comm(pg).recv(None, source, mpi_tag(0, call, OBJECTS), status)
    sender = pg.ranks[status.Get_source()]
    if len(received) != len(object_list):
        raise errors.value_error(
            call, f"rank {sender} sent {len(received)} objects but 'object_list' has "
            f"{len(object_list)} entries"
        )
    object_list[:] = received
    return sender

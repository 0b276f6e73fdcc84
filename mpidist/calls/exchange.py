"""Gathers, scatter and all-to-alls: one function per torch.distributed call.

The same steps as :mod:`mpidist.calls.collectives`: resolve the group, convert and check the
buffers, then call MPI through :func:`~mpidist.calls.path.issue`. Equal sizes become the plain MPI
routine, unequal ones its ``v`` variant. A rank's own slot of an output doubles as its input
where MPI allows (``MPI_IN_PLACE``); MPI forbids aliasing otherwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from ..checks.fingerprint import ARRAY, DTYPE, ROOT, agree, list_counts, split_counts
from ..core import errors
from ..core.buffers import DType, address, as_buffer, as_buffers, same_dtype
from ..core.groups import ProcessGroup, group_rank_of, resolve
from ..core.registry import define
from ..core.work import Work
from .path import (
    INSIDE,
    OWN_SLOT,
    VECTOR_BYTES,
    Step,
    copied_list,
    displacements,
    from_list,
    into_list,
    issue,
    output_and_input,
    overlap,
    size_error,
    spans_meet,
    vector_list,
)

IN_PLACE = MPI.IN_PLACE
#: What a rooted call records for the cross-rank check (:mod:`mpidist.checks.signature`).
ROOTED = ("count", "dtype", "root")


@define(fingerprint=agree(tensor=DTYPE, tensor_list=ARRAY), signature=("dtype", "counts"))
def all_gather(tensor_list: list[Any], tensor: Any, group: Any = None,
               async_op: bool = False) -> Work | None:
    """Gather every rank's ``tensor`` into ``tensor_list`` on every rank (``MPI_Allgather``).

    ``tensor_list[i]`` receives rank i's tensor; entries may differ in size
    (``MPI_Allgatherv``), but ``tensor_list[rank]`` must match ``tensor``.
    """
    call = all_gather.call
    pg = resolve(group, call)
    staging: list = []
    inp, d = as_buffer(tensor, call, "tensor", False, staging)
    outs = as_buffers(tensor_list, call, "tensor_list", True, pg._size, staging, d)
    me = pg._rank
    counts = [a.size for a, _ in outs]
    if counts[me] != inp.size:
        raise size_error(call, f"tensor_list[{me}]", counts[me], inp.size, "the size of 'tensor'")
    whole, post = into_list(outs, d)
    send: Any = [inp, d.mpi]
    if post is None and inp.size and address(inp) == address(outs[me][0]):
        send = IN_PLACE  # tensor is its own slot of the output: MPI forbids aliasing
    comm = pg.comm
    sig = (call.name, d.name, tuple(counts))
    if all(c == inp.size for c in counts):
        return issue(pg, call, async_op, comm.Allgather, comm.Iallgather, (send, [whole, d.mpi]), post,
                     tensor_list, staging, sig=sig)
    recv = [whole, (counts, displacements(counts)), d.mpi]
    return issue(pg, call, async_op, comm.Allgatherv, comm.Iallgatherv, (send, recv), post, tensor_list,
                 staging, sig=sig)


@define(fingerprint=agree(output_tensor=ARRAY, input_tensor=ARRAY), gpu_direct=True,
        signature=("count", "dtype"))
def all_gather_into_tensor(output_tensor: Any, input_tensor: Any, group: Any = None,
                           async_op: bool = False) -> Work | None:
    """Concatenate every rank's ``input_tensor`` into ``output_tensor`` (``MPI_Allgather``).

    ``output_tensor`` holds ``world_size * input_tensor.numel()`` elements, rank-major
    (shape ``(world_size * n, ...)`` or ``(world_size, n, ...)``).
    """
    call = all_gather_into_tensor.call
    pg = resolve(group, call)
    staging: list = []
    out, inp, d = output_and_input(call, output_tensor, "output_tensor", input_tensor, "input_tensor",
                                   staging)
    if out.size != inp.size * pg._size:
        raise size_error(call, "output_tensor", out.size, inp.size * pg._size,
                         "world_size * input_tensor.numel()")
    send: Any = [inp, d.mpi]
    if inp.size and address(inp) == address(out) + pg._rank * inp.nbytes:
        send = IN_PLACE
    comm = pg.comm
    return issue(pg, call, async_op, comm.Allgather, comm.Iallgather, (send, [out, d.mpi]), None,
                 output_tensor, staging, sig=(call.name, inp.size, d.name))


#: torch's newer name for the same call (``torch.distributed.all_gather_single``).
all_gather_single = all_gather_into_tensor


def _rooted(call: Any, group: Any, tensor: Any, writable: bool, root: tuple[Any, Any, str], lst: Any,
            arg: str, role: str, staging: list) -> tuple[Any, int, np.ndarray, DType, list | None]:
    """The opening gather and scatter share: group, root, ``tensor``, and the root's list.

    ``root`` is ``(global rank, group rank, name)``; only the root (the ``role`` rank,
    "destination" or "source") may pass the list, of ``tensor``'s dtype and size per entry.
    Returns ``(group, root, tensor's array, dtype, the list's arrays or None)``.
    """
    pg = resolve(group, call)
    r = group_rank_of(pg, root[0], root[1], call, root[2])
    arr, d = as_buffer(tensor, call, "tensor", writable, staging)
    return pg, r, arr, d, _root_list(pg, call, lst, arg, r, role, d, arr.size, not writable, staging)


def _root_list(pg: ProcessGroup, call: Any, lst: Any, arg: str, root: int, role: str, d: DType,
               n: int, writable: bool, staging: list) -> list[tuple[np.ndarray, DType]] | None:
    if pg._rank != root:
        if lst:
            raise errors.value_error(call, f"argument '{arg}' must be given only on the {role} rank")
        return None
    if lst is None:
        raise errors.value_error(call, f"argument '{arg}' is required on the {role} rank")
    bufs = as_buffers(lst, call, arg, writable, pg._size, staging, d)
    for i, (a, _) in enumerate(bufs):
        if a.size != n:
            raise size_error(call, f"{arg}[{i}]", a.size, n, "the size of 'tensor'")
    return bufs


@define(fingerprint=agree(tensor=ARRAY, dst=ROOT), signature=ROOTED)
def gather(tensor: Any, gather_list: list[Any] | None = None, dst: int | None = None,
           group: Any = None, async_op: bool = False, group_dst: int | None = None) -> Work | None:
    """Gather every rank's ``tensor`` into ``gather_list`` on ``dst`` (``MPI_Gather``; from
    :data:`~mpidist.calls.path.VECTOR_BYTES` per block ``MPI_Gatherv``, which writes each entry
    of ``gather_list`` where it lies).

    Only the destination passes ``gather_list`` (one array per rank, each the size of
    ``tensor``); the others pass ``None``.
    """
    call = gather.call
    staging: list = []
    pg, root, inp, d, outs = _rooted(call, group, tensor, False, (dst, group_dst, "dst"), gather_list,
                                     "gather_list", "destination", staging)
    comm = pg.comm
    sig = (call.name, inp.size, d.name, pg.ranks[root])
    vector = inp.nbytes >= VECTOR_BYTES
    routines = (comm.Gatherv, comm.Igatherv) if vector else (comm.Gather, comm.Igather)
    if outs is None:
        return issue(pg, call, async_op, *routines, ([inp, d.mpi], None, root), None, None, staging, sig=sig)
    if vector:
        recv, post, where = vector_list(outs, d, True, inp, root)
        send: Any = IN_PLACE if where == OWN_SLOT else [inp.copy() if where == INSIDE else inp, d.mpi]
        return issue(pg, call, async_op, *routines, (send, recv, root), post, gather_list, staging, sig=sig,
                     hold=outs)
    whole, post = into_list(outs, d)
    send: Any = [inp, d.mpi]
    if post is None and inp.size and address(inp) == address(outs[root][0]):
        send = IN_PLACE
    return issue(pg, call, async_op, *routines, (send, [whole, d.mpi], root), post, gather_list, staging,
                 sig=sig)


@define(fingerprint=agree(tensor=ARRAY, src=ROOT), signature=ROOTED)
def scatter(tensor: Any, scatter_list: list[Any] | None = None, src: int | None = None,
            group: Any = None, async_op: bool = False, group_src: int | None = None) -> Work | None:
    """Send ``scatter_list[i]`` from ``src`` to rank i's ``tensor`` (``MPI_Scatter``; from
    :data:`~mpidist.calls.path.VECTOR_BYTES` per block ``MPI_Scatterv``, which reads each entry
    of ``scatter_list`` where it lies).

    Only the source passes ``scatter_list`` (one array per rank, each the size of
    ``tensor``); the others pass ``None``.
    """
    call = scatter.call
    staging: list = []
    pg, root, out, d, ins = _rooted(call, group, tensor, True, (src, group_src, "src"), scatter_list,
                                    "scatter_list", "source", staging)
    comm = pg.comm
    sig = (call.name, out.size, d.name, pg.ranks[root])
    vector = out.nbytes >= VECTOR_BYTES
    routines = (comm.Scatterv, comm.Iscatterv) if vector else (comm.Scatter, comm.Iscatter)
    if ins is None:
        return issue(pg, call, async_op, *routines, (None, [out, d.mpi], root), None, tensor, staging,
                     sig=sig)
    if vector:
        sendv, _, where = vector_list(ins, d, False, out, root)
        if where == INSIDE:  # MPI would write what it still reads: send a copy of the list
            sendv = copied_list(ins, d)
        recv = IN_PLACE if where == OWN_SLOT else [out, d.mpi]
        return issue(pg, call, async_op, *routines, (sendv, recv, root), None, tensor, staging, sig=sig,
                     hold=ins)
    send = from_list(ins, d)
    recv: Any = [out, d.mpi]
    if out.size and address(out) == address(send) + root * out.nbytes:
        recv = IN_PLACE
    return issue(pg, call, async_op, *routines, ([send, d.mpi], recv, root), None, tensor, staging, sig=sig,
                 hold=ins)


def _alltoall(pg: ProcessGroup, call: Any, send: np.ndarray, scounts: list[int], recv: np.ndarray,
              rcounts: list[int], d: DType, post: Step | None, async_op: bool, output: Any,
              staging: list, equal: bool) -> Work | None:
    """``MPI_Alltoall`` where ``equal`` (no split sizes given: every rank knows the split is
    even), else ``MPI_Alltoallv``: every rank must call the same routine, and equal sizes on
    one rank say nothing of another's."""
    if overlap(send, recv):
        send = send.copy()  # MPI forbids overlapping send and receive buffers
    comm = pg.comm
    sig, pairs = (call.name, d.name), (scounts, rcounts)
    if equal:
        return issue(pg, call, async_op, comm.Alltoall, comm.Ialltoall, ([send, d.mpi], [recv, d.mpi]),
                     post, output, staging, sig=sig, pairs=pairs)
    return issue(pg, call, async_op, comm.Alltoallv, comm.Ialltoallv,
                 ([send, (scounts, displacements(scounts)), d.mpi],
                  [recv, (rcounts, displacements(rcounts)), d.mpi]), post, output, staging, sig=sig,
                 pairs=pairs)


@define(fingerprint=agree(list_counts, dtype=(DTYPE, "input_tensor_list")), signature=("dtype",))
def all_to_all(output_tensor_list: list[Any], input_tensor_list: list[Any], group: Any = None,
               async_op: bool = False) -> Work | None:
    """Send ``input_tensor_list[j]`` to rank j, receive rank j's into ``output_tensor_list[j]``.

    Becomes ``MPI_Alltoallv`` on every rank (one rank's equal sizes say nothing of another's, and
    every rank must call the same routine), which reads and writes each entry where it lies.
    """
    call = all_to_all.call
    pg = resolve(group, call)
    staging: list = []
    outs = as_buffers(output_tensor_list, call, "output_tensor_list", True, pg._size, staging)
    ins = as_buffers(input_tensor_list, call, "input_tensor_list", False, pg._size, staging)
    if not outs:
        return None
    d = ins[0][1]
    same_dtype(ins, d, call, "input_tensor_list")
    same_dtype(outs, d, call, "output_tensor_list")
    recv, post, _ = vector_list(outs, d, True)
    send, _, _ = vector_list(ins, d, False)
    if spans_meet(send[0], recv[0]):  # MPI forbids overlapping send and receive buffers
        send = copied_list(ins, d)
    comm = pg.comm
    return issue(pg, call, async_op, comm.Alltoallv, comm.Ialltoallv, (send, recv), post, output_tensor_list,
                 staging, sig=(call.name, d.name), pairs=(send[1][0], recv[1][0]), hold=ins)


def _even(splits: Any) -> bool:
    """No split sizes given: the rows split evenly (torch's ``None`` or ``[]``)."""
    return splits is None or len(splits) == 0


def _splits(splits: Any, rows: int, size: int, call: Any, arg: str) -> list[int]:
    if _even(splits):
        if rows % size:
            raise errors.value_error(
                call, f"the first dimension of '{arg.split('_')[0]}' ({rows}) is not divisible "
                f"by the group size {size}; pass {arg}"
            )
        return [rows // size] * size
    out = [int(s) for s in splits]
    if len(out) != size:
        raise errors.value_error(call, f"{arg} has {len(out)} entries; the group has {size} ranks")
    if any(s < 0 for s in out) or sum(out) != rows:
        raise errors.value_error(
            call, f"{arg}={out} must be non-negative and sum to the first dimension ({rows})"
        )
    return out


@define(fingerprint=agree(split_counts, dtype=(DTYPE, "input")), gpu_direct=True, signature=("dtype",))
def all_to_all_single(output: Any, input: Any, output_split_sizes: list[int] | None = None,  # noqa: A002
                      input_split_sizes: list[int] | None = None, group: Any = None,
                      async_op: bool = False) -> Work | None:
    """Split ``input`` along dim 0, send piece j to rank j, concatenate what arrives in ``output``.

    No split sizes (an even split) become ``MPI_Alltoall``; given ``*_split_sizes`` (rows per
    rank), even equal ones, ``MPI_Alltoallv``, as in torch's MPI backend: every rank must call
    the same routine, and one rank's equal sizes say nothing of another's.
    """
    call = all_to_all_single.call
    pg = resolve(group, call)
    staging: list = []
    out, inp, d = output_and_input(call, output, "output", input, "input", staging)
    in_rows = inp.shape[0] if inp.ndim else 1
    out_rows = out.shape[0] if out.ndim else 1
    row = inp.size // in_rows if in_rows else 0
    out_row = out.size // out_rows if out_rows else 0
    if in_rows and out_rows and row != out_row:
        raise errors.value_error(call, f"input rows have {row} elements but output rows have {out_row}")
    row = row or out_row
    scounts = [s * row for s in _splits(input_split_sizes, in_rows, pg._size, call, "input_split_sizes")]
    rcounts = [s * row for s in _splits(output_split_sizes, out_rows, pg._size, call, "output_split_sizes")]
    return _alltoall(pg, call, inp.reshape(-1), scounts, out.reshape(-1), rcounts, d, None, async_op,
                     output, staging, _even(input_split_sizes) and _even(output_split_sizes))

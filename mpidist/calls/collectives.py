"""Reductions, broadcast and barrier: one function per torch.distributed call.

Every function follows the same steps: resolve the group, convert and check the buffers,
map the op, then call MPI through :func:`~mpidist.calls.path.issue`: the nonblocking ``I*``
routine and the bounded wait, or under ``async_op=True`` a :class:`~mpidist.core.work.Work`.
Results land in the caller's arrays. The gather and all-to-all families live in
:mod:`mpidist.calls.exchange`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np
from mpi4py import MPI

from ..checks.fingerprint import ARRAY, OP, ROOT, agree
from ..core.buffers import DType, as_buffer, as_buffers
from ..core.groups import ProcessGroup, group_rank_of, limited, resolve
from ..core.registry import define
from ..core.timeouts import wait
from ..core.waiting import positive_seconds
from ..core.work import Work
from . import sparse
from .ops import Plan, ReduceOp, divide, op_name, plan, premultiply
from .path import Step, from_list, issue, output_and_input, overlap, size_error, then

#: What the reductions record for the cross-rank check (:mod:`mpidist.checks.signature`).
REDUCED = ("count", "dtype", "op")

IN_PLACE = MPI.IN_PLACE


def _send_operand(arr: np.ndarray, d: DType, p: Plan) -> np.ndarray:
    """The array a rank contributes to a reduction: a scaled copy under PREMUL_SUM."""
    return arr if p.factor is None else premultiply(arr, d, p.factor)


def _average(p: Plan, arr: np.ndarray, d: DType, n: int) -> Step | None:
    if not p.average:
        return None
    return lambda: divide(arr, d, n)


@define(fingerprint=agree(tensor=ARRAY, op=OP), gpu_direct=True, reducing=True, signature=REDUCED)
def all_reduce(tensor: Any, op: Any = ReduceOp.SUM, group: Any = None,
               async_op: bool = False) -> Work | None:
    """Reduce ``tensor`` across the group; every rank gets the result in place.

    Becomes ``MPI_Iallreduce(MPI_IN_PLACE, ...)`` and the bounded wait (a ``Work`` under
    ``async_op``); ``MPI_Allreduce`` on a group of one. MPI chooses the algorithm for every size
    (docs/performance.md names its knobs). ``ReduceOp.AVG`` divides the sum by the group size;
    ``PREMUL_SUM`` scales first; a sparse tensor is gathered and summed (:mod:`mpidist.calls.sparse`).

    Example: ranks 0..3 each pass ``np.full(2, rank)``; with ``SUM`` every rank ends
    with ``[6, 6]``.
    """
    call = all_reduce.call
    pg = resolve(group, call)
    staging: list = []
    try:
        arr, d = as_buffer(tensor, call, "tensor", True, staging)
    except TypeError:
        if sparse.is_sparse(tensor):
            return sparse.all_reduce(tensor, op, pg, async_op)
        raise
    p = plan(op, d, call)
    sig = (call.name, arr.size, d.name, op_name(op, call))
    _premultiply(arr, d, p)
    comm = _reducer(p, pg, call)
    return issue(pg, call, async_op, comm.Allreduce, comm.Iallreduce, (IN_PLACE, [arr, d.mpi], p.op),
                 _average(p, arr, d, pg._size), tensor, staging, p.lowprec is not None, sig)


def _premultiply(arr: np.ndarray, d: DType, p: Plan) -> None:
    """PREMUL_SUM: scale the caller's array in place (after the cross-rank check)."""
    if p.factor is not None:
        premultiply(arr, d, p.factor, out=arr)


def _reducer(p: Plan, pg: ProcessGroup, call: Any) -> Any:
    """The communicator, or for fp16/bf16 the 16-bit reductions, each step within the group's timeout."""
    if p.lowprec is None:
        return pg.comm
    return p.reducer(pg.comm, lambda reqs, keep: wait(reqs, pg, call, keep))


@define(fingerprint=agree(tensor=ARRAY, src=ROOT), gpu_direct=True, signature=("count", "dtype", "src"))
def broadcast(tensor: Any, src: int | None = None, group: Any = None, async_op: bool = False,
              group_src: int | None = None) -> Work | None:
    """Copy ``tensor`` from rank ``src`` (global) or ``group_src`` to every rank (``MPI_Bcast``)."""
    call = broadcast.call
    pg = resolve(group, call)
    root = group_rank_of(pg, src, group_src, call, "src")
    staging: list = []
    arr, d = as_buffer(tensor, call, "tensor", pg._rank != root, staging)
    comm = pg.comm
    return issue(pg, call, async_op, comm.Bcast, comm.Ibcast, ([arr, d.mpi], root), None, tensor, staging,
                 sig=(call.name, arr.size, d.name, pg.ranks[root]))


@define(fingerprint=agree(tensor=ARRAY, op=OP, dst=ROOT), gpu_direct=True, reducing=True,
        signature=(*REDUCED, "dst"))
def reduce(tensor: Any, dst: int | None = None, op: Any = ReduceOp.SUM, group: Any = None,
           async_op: bool = False, group_dst: int | None = None) -> Work | None:
    """Reduce ``tensor`` onto rank ``dst``/``group_dst`` in place (``MPI_Reduce``).

    Other ranks' tensors are left as they were.
    """
    call = reduce.call
    pg = resolve(group, call)
    root = group_rank_of(pg, dst, group_dst, call, "dst")
    is_root = pg._rank == root
    staging: list = []
    arr, d = as_buffer(tensor, call, "tensor", is_root, staging)
    p = plan(op, d, call)
    comm = _reducer(p, pg, call)
    if is_root:
        _premultiply(arr, d, p)
        args = (IN_PLACE, [arr, d.mpi], p.op, root)
        post = _average(p, arr, d, pg._size)
    else:
        args = ([_send_operand(arr, d, p), d.mpi], None, p.op, root)
        post = None
    return issue(pg, call, async_op, comm.Reduce, comm.Ireduce, args, post, tensor, staging,
                 p.lowprec is not None, (call.name, arr.size, d.name, op_name(op, call), pg.ranks[root]))


def _reduce_scatter(pg: ProcessGroup, call: Any, out: np.ndarray, send: np.ndarray, d: DType,
                    p: Plan, async_op: bool, output: Any, staging: list, op: Any,
                    hold: Any = None) -> Work | None:
    recv = out
    post = _average(p, out, d, pg._size)
    if overlap(out, send):  # MPI forbids overlapping send and receive buffers
        recv = np.empty_like(out)

        def copy_back() -> None:
            out[...] = recv
        post = then(copy_back, post)
    comm = _reducer(p, pg, call)
    return issue(pg, call, async_op, comm.Reduce_scatter_block, comm.Ireduce_scatter_block,
                 ([send, d.mpi], [recv, d.mpi], p.op), post, output, staging, p.lowprec is not None,
                 (call.name, out.size, d.name, op_name(op, call)), hold=hold)


@define(fingerprint=agree(op=OP, output=ARRAY, input_list=ARRAY), reducing=True, signature=REDUCED)
def reduce_scatter(output: Any, input_list: list[Any], op: Any = ReduceOp.SUM, group: Any = None,
                   async_op: bool = False) -> Work | None:
    """Reduce ``input_list[i]`` over ranks into rank i's ``output`` (``MPI_Reduce_scatter_block``)."""
    call = reduce_scatter.call
    pg = resolve(group, call)
    staging: list = []
    out, d = as_buffer(output, call, "output", True, staging)
    ins = as_buffers(input_list, call, "input_list", False, pg._size, staging, d)
    for i, (a, _) in enumerate(ins):
        if a.size != out.size:
            raise size_error(call, f"input_list[{i}]", a.size, out.size, "the size of 'output'")
    p = plan(op, d, call)
    send = _send_operand(from_list(ins, d), d, p)  # a view where the entries lie back to back
    return _reduce_scatter(pg, call, out, send, d, p, async_op, output, staging, op, hold=ins)


@define(fingerprint=agree(op=OP, output=ARRAY, input=ARRAY), gpu_direct=True, reducing=True,
        signature=REDUCED)
def reduce_scatter_tensor(output: Any, input: Any, op: Any = ReduceOp.SUM,  # noqa: A002
                          group: Any = None, async_op: bool = False) -> Work | None:
    """Reduce ``input`` over ranks; rank i keeps block i in ``output`` (``MPI_Reduce_scatter_block``).

    ``input`` holds ``world_size * output.numel()`` elements, rank-major.
    """
    call = reduce_scatter_tensor.call
    pg = resolve(group, call)
    staging: list = []
    out, inp, d = output_and_input(call, output, "output", input, "input", staging)
    if inp.size != out.size * pg._size:
        raise size_error(call, "input", inp.size, out.size * pg._size, "world_size * output.numel()")
    p = plan(op, d, call)
    return _reduce_scatter(pg, call, out, _send_operand(inp, d, p), d, p, async_op, output, staging, op)


#: torch's newer name for the same call (``torch.distributed.reduce_scatter_single``).
reduce_scatter_single = reduce_scatter_tensor


@define(fingerprint=agree())
def barrier(group: Any = None, async_op: bool = False, device_ids: Any = None,
            timeout: timedelta | None = None) -> Work | None:
    """Block until every rank of the group arrives (``MPI_Barrier`` / ``MPI_Ibarrier``).

    ``timeout`` takes the place of the group's timeout for this barrier: past it every rank that
    waits raises :class:`~mpidist.core.timeouts.GroupTimeoutError` and the group is broken, as past
    the group's own.
    """
    call = barrier.call
    pg = resolve(group, call)
    comm = pg.comm
    if timeout is not None:
        limit = positive_seconds(timeout, call)
        with limited(pg, limit):
            work = issue(pg, call, True, comm.Barrier, comm.Ibarrier, (), sig=(call.name,))
        work.limit = limit
        if async_op:
            return work
        work.wait()
        return None
    return issue(pg, call, async_op, comm.Barrier, comm.Ibarrier, (), sig=(call.name,))

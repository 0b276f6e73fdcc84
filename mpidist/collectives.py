"""Collectives: one function per torch.distributed call, each a thin path to one MPI call.

Every function follows the same steps: resolve the group, convert and check the
buffers, map the op, then call MPI — the blocking routine, or its nonblocking ``I*``
variant under ``async_op=True``, which returns a :class:`~mpidist.work.Work`. Results
land in the caller's arrays. List arguments that lie back to back in memory (``chunk``
or ``split`` of one buffer) are used directly; other lists go through one staging buffer.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
from mpi4py import MPI

from . import debug, errors, gpu, sparse
from .buffers import DType, address, as_buffer, as_buffers, complete, joined, same_dtype
from .groups import ProcessGroup, group_rank_of, resolve
from .ops import ReduceOp, divide, plan, premultiply
from .work import Work, seconds

IN_PLACE = MPI.IN_PLACE


def issue(pg: ProcessGroup, call: str, async_op: bool, blocking: Callable[..., Any],
          nonblocking: Callable[..., MPI.Request], args: tuple, post: Callable[[], None] | None = None,
          output: Any = None) -> Work | None:
    """Run ``blocking(*args)`` then ``post()``, or start ``nonblocking(*args)`` as a Work."""
    if debug.LEVEL:
        debug.check(pg)  # DETAIL: all ranks agree on the call before MPI sees it
    if gpu.in_flight():
        post = complete(post, output)  # staged GPU buffers: copy back, return to the pool
    if async_op:
        return Work((nonblocking(*args),), call, post, output, seconds(pg.timeout), keep=args)
    blocking(*args)
    if post is not None:
        post()
    return None


def _size_error(call: str, arg: str, got: int, want: int, why: str) -> ValueError:
    return errors.value_error(call, f"argument '{arg}' has {got} elements, expected {want} ({why})")


def _unstage(stage: np.ndarray, outs: list[tuple[np.ndarray, DType]]) -> Callable[[], None]:
    """The post-step that copies a staging buffer out into the caller's list entries."""
    def copy_out() -> None:
        off = 0
        for arr, _ in outs:
            n = arr.size
            arr.reshape(-1)[...] = stage[off:off + n]
            off += n
    return copy_out


def _stack(bufs: list[tuple[np.ndarray, DType]], d: DType) -> np.ndarray:
    """The entries of a list argument as one contiguous 1-D array (a view when possible)."""
    whole = joined(bufs)
    if whole is not None:
        return whole
    if not bufs:
        return np.empty(0, d.raw)
    return np.concatenate([a.reshape(-1) for a, _ in bufs])


def _displacements(counts: Sequence[int]) -> list[int]:
    out, off = [], 0
    for c in counts:
        out.append(off)
        off += c
    return out


def _chain(*steps: Callable[[], None] | None) -> Callable[[], None] | None:
    steps = tuple(s for s in steps if s is not None)
    if not steps:
        return None
    if len(steps) == 1:
        return steps[0]

    def run() -> None:
        for s in steps:
            s()
    return run


def _send_operand(arr: np.ndarray, d: DType, p: Any) -> np.ndarray:
    """The array a rank contributes to a reduction: a scaled copy under PREMUL_SUM."""
    return arr if p.factor is None else premultiply(arr, d, p.factor)


def _average(p: Any, arr: np.ndarray, d: DType, n: int) -> Callable[[], None] | None:
    if not p.average:
        return None
    return lambda: divide(arr, d, n)


def all_reduce(tensor: Any, op: Any = ReduceOp.SUM, group: Any = None,
               async_op: bool = False) -> Work | None:
    """Reduce ``tensor`` across the group; every rank gets the result in place.

    Becomes ``MPI_Allreduce(MPI_IN_PLACE, ...)`` (``MPI_Iallreduce`` when ``async_op``).
    ``ReduceOp.AVG`` divides the sum by the group size; ``PREMUL_SUM`` scales first.

    Example: ranks 0..3 each pass ``np.full(2, rank)``; with ``SUM`` every rank ends
    with ``[6, 6]``.
    """
    if debug.LEVEL and debug.outermost():
        return debug.run(all_reduce, "all_reduce", locals())
    call = "all_reduce"
    pg = resolve(group, call)
    try:
        arr, d = as_buffer(tensor, call, "tensor", True)
    except TypeError:
        if sparse.is_sparse(tensor):  # gathered and summed (mpidist/sparse.py); off the fast path
            return sparse.all_reduce(tensor, op, pg, async_op)
        raise
    p = plan(op, d, call)
    if p.factor is not None:
        premultiply(arr, d, p.factor, out=arr)
    if not (async_op or p.words or debug.LEVEL or gpu.in_flight()):
        # the common case, without issue(): this call's overhead is measured in benchmarks/
        pg.comm.Allreduce(IN_PLACE, [arr, d.mpi], p.op)
        if p.average:
            divide(arr, d, pg._size)
        return None
    comm = p.on(pg.comm)
    return issue(pg, call, async_op, comm.Allreduce, comm.Iallreduce,
                 (IN_PLACE, [arr, d.mpi], p.op), _average(p, arr, d, pg._size), tensor)


def broadcast(tensor: Any, src: int | None = None, group: Any = None, async_op: bool = False,
              group_src: int | None = None) -> Work | None:
    """Copy ``tensor`` from rank ``src`` (global) or ``group_src`` to every rank (``MPI_Bcast``)."""
    if debug.LEVEL and debug.outermost():
        return debug.run(broadcast, "broadcast", locals())
    call = "broadcast"
    pg = resolve(group, call)
    root = group_rank_of(pg, src, group_src, call, "src")
    arr, d = as_buffer(tensor, call, "tensor", pg._rank != root)
    comm = pg.comm
    if not (async_op or debug.LEVEL or gpu.in_flight()):
        comm.Bcast([arr, d.mpi], root)  # the common case, without issue()
        return None
    return issue(pg, call, async_op, comm.Bcast, comm.Ibcast, ([arr, d.mpi], root), None, tensor)


def reduce(tensor: Any, dst: int | None = None, op: Any = ReduceOp.SUM, group: Any = None,
           async_op: bool = False, group_dst: int | None = None) -> Work | None:
    """Reduce ``tensor`` onto rank ``dst``/``group_dst`` in place (``MPI_Reduce``).

    Other ranks' tensors are left as they were.
    """
    if debug.LEVEL and debug.outermost():
        return debug.run(reduce, "reduce", locals())
    call = "reduce"
    pg = resolve(group, call)
    root = group_rank_of(pg, dst, group_dst, call, "dst")
    is_root = pg._rank == root
    arr, d = as_buffer(tensor, call, "tensor", is_root)
    p = plan(op, d, call)
    comm = p.on(pg.comm)
    if is_root:
        if p.factor is not None:
            premultiply(arr, d, p.factor, out=arr)
        args = (IN_PLACE, [arr, d.mpi], p.op, root)
        post = _average(p, arr, d, pg._size)
    else:
        args = ([_send_operand(arr, d, p), d.mpi], None, p.op, root)
        post = None
    return issue(pg, call, async_op, comm.Reduce, comm.Ireduce, args, post, tensor)


def all_gather(tensor_list: list[Any], tensor: Any, group: Any = None,
               async_op: bool = False) -> Work | None:
    """Gather every rank's ``tensor`` into ``tensor_list`` on every rank (``MPI_Allgather``).

    ``tensor_list[i]`` receives rank i's tensor; entries may differ in size
    (``MPI_Allgatherv``), but ``tensor_list[rank]`` must match ``tensor``.
    """
    if debug.LEVEL and debug.outermost():
        return debug.run(all_gather, "all_gather", locals())
    call = "all_gather"
    pg = resolve(group, call)
    inp, d = as_buffer(tensor, call, "tensor", False)
    outs = as_buffers(tensor_list, call, "tensor_list", True, pg._size)
    same_dtype(outs, d, call, "tensor_list")
    me = pg._rank
    counts = [a.size for a, _ in outs]
    if counts[me] != inp.size:
        raise _size_error(call, f"tensor_list[{me}]", counts[me], inp.size, "the size of 'tensor'")
    whole = joined(outs)
    post = None
    if whole is None:
        whole = np.empty(sum(counts), d.raw)
        post = _unstage(whole, outs)
    send: Any = [inp, d.mpi]
    if post is None and inp.size and address(inp) == address(outs[me][0]):
        send = IN_PLACE  # tensor is its own slot of the output: MPI forbids aliasing
    comm = pg.comm
    if all(c == inp.size for c in counts):
        return issue(pg, call, async_op, comm.Allgather, comm.Iallgather,
                     (send, [whole, d.mpi]), post, tensor_list)
    recv = [whole, (counts, _displacements(counts)), d.mpi]
    return issue(pg, call, async_op, comm.Allgatherv, comm.Iallgatherv, (send, recv), post,
                 tensor_list)


def all_gather_into_tensor(output_tensor: Any, input_tensor: Any, group: Any = None,
                           async_op: bool = False) -> Work | None:
    """Concatenate every rank's ``input_tensor`` into ``output_tensor`` (``MPI_Allgather``).

    ``output_tensor`` holds ``world_size * input_tensor.numel()`` elements, rank-major
    (shape ``(world_size * n, ...)`` or ``(world_size, n, ...)``).
    """
    if debug.LEVEL and debug.outermost():
        return debug.run(all_gather_into_tensor, "all_gather_into_tensor", locals())
    call = "all_gather_into_tensor"
    pg = resolve(group, call)
    inp, d = as_buffer(input_tensor, call, "input_tensor", False)
    out, do = as_buffer(output_tensor, call, "output_tensor", True)
    if do is not d:
        raise errors.type_error(call, f"output_tensor is {do.name} but input_tensor is {d.name}")
    if out.size != inp.size * pg._size:
        raise _size_error(call, "output_tensor", out.size, inp.size * pg._size,
                          "world_size * input_tensor.numel()")
    send: Any = [inp, d.mpi]
    if inp.size and address(inp) == address(out) + pg._rank * inp.nbytes:
        send = IN_PLACE
    comm = pg.comm
    return issue(pg, call, async_op, comm.Allgather, comm.Iallgather, (send, [out, d.mpi]),
                 None, output_tensor)


def _root_list_absent(lst: Any, call: str, arg: str, root_arg: str) -> None:
    if lst:
        raise errors.value_error(call, f"argument '{arg}' must be given only on the {root_arg} rank")


def gather(tensor: Any, gather_list: list[Any] | None = None, dst: int | None = None,
           group: Any = None, async_op: bool = False, group_dst: int | None = None) -> Work | None:
    """Gather every rank's ``tensor`` into ``gather_list`` on ``dst`` (``MPI_Gather``).

    Only the destination passes ``gather_list`` (one array per rank, each the size of
    ``tensor``); the others pass ``None``.
    """
    if debug.LEVEL and debug.outermost():
        return debug.run(gather, "gather", locals())
    call = "gather"
    pg = resolve(group, call)
    root = group_rank_of(pg, dst, group_dst, call, "dst")
    inp, d = as_buffer(tensor, call, "tensor", False)
    comm = pg.comm
    if pg._rank != root:
        _root_list_absent(gather_list, call, "gather_list", "destination")
        return issue(pg, call, async_op, comm.Gather, comm.Igather, ([inp, d.mpi], None, root))
    if gather_list is None:
        raise errors.value_error(call, "argument 'gather_list' is required on the destination rank")
    outs = as_buffers(gather_list, call, "gather_list", True, pg._size)
    same_dtype(outs, d, call, "gather_list")
    for i, (a, _) in enumerate(outs):
        if a.size != inp.size:
            raise _size_error(call, f"gather_list[{i}]", a.size, inp.size, "the size of 'tensor'")
    whole = joined(outs)
    post = None
    if whole is None:
        whole = np.empty(inp.size * pg._size, d.raw)
        post = _unstage(whole, outs)
    send: Any = [inp, d.mpi]
    if post is None and inp.size and address(inp) == address(outs[root][0]):
        send = IN_PLACE
    return issue(pg, call, async_op, comm.Gather, comm.Igather, (send, [whole, d.mpi], root),
                 post, gather_list)


def scatter(tensor: Any, scatter_list: list[Any] | None = None, src: int | None = None,
            group: Any = None, async_op: bool = False, group_src: int | None = None) -> Work | None:
    """Send ``scatter_list[i]`` from ``src`` to rank i's ``tensor`` (``MPI_Scatter``).

    Only the source passes ``scatter_list`` (one array per rank, each the size of
    ``tensor``); the others pass ``None``.
    """
    if debug.LEVEL and debug.outermost():
        return debug.run(scatter, "scatter", locals())
    call = "scatter"
    pg = resolve(group, call)
    root = group_rank_of(pg, src, group_src, call, "src")
    out, d = as_buffer(tensor, call, "tensor", True)
    comm = pg.comm
    if pg._rank != root:
        _root_list_absent(scatter_list, call, "scatter_list", "source")
        return issue(pg, call, async_op, comm.Scatter, comm.Iscatter,
                     (None, [out, d.mpi], root), None, tensor)
    if scatter_list is None:
        raise errors.value_error(call, "argument 'scatter_list' is required on the source rank")
    ins = as_buffers(scatter_list, call, "scatter_list", False, pg._size)
    same_dtype(ins, d, call, "scatter_list")
    for i, (a, _) in enumerate(ins):
        if a.size != out.size:
            raise _size_error(call, f"scatter_list[{i}]", a.size, out.size, "the size of 'tensor'")
    send = _stack(ins, d)
    recv: Any = [out, d.mpi]
    if out.size and address(out) == address(send) + root * out.nbytes:
        recv = IN_PLACE
    return issue(pg, call, async_op, comm.Scatter, comm.Iscatter, ([send, d.mpi], recv, root),
                 None, tensor)


def _overlap(a: np.ndarray, b: np.ndarray) -> bool:
    """May ``a`` and ``b`` share memory? Two distinct arrays that own their data cannot."""
    if a.base is None and b.base is None:
        return a is b
    return np.may_share_memory(a, b)


def _reduce_scatter(pg: ProcessGroup, call: str, out: np.ndarray, send: np.ndarray, d: DType,
                    p: Any, async_op: bool, output: Any) -> Work | None:
    recv = out
    post = _average(p, out, d, pg._size)
    if _overlap(out, send):  # MPI forbids overlapping send and receive buffers
        recv = np.empty_like(out)

        def copy_back() -> None:
            out[...] = recv
        post = _chain(copy_back, post)
    comm = p.on(pg.comm)
    return issue(pg, call, async_op, comm.Reduce_scatter_block, comm.Ireduce_scatter_block,
                 ([send, d.mpi], [recv, d.mpi], p.op), post, output)


def reduce_scatter(output: Any, input_list: list[Any], op: Any = ReduceOp.SUM, group: Any = None,
                   async_op: bool = False) -> Work | None:
    """Reduce ``input_list[i]`` over ranks into rank i's ``output`` (``MPI_Reduce_scatter_block``)."""
    if debug.LEVEL and debug.outermost():
        return debug.run(reduce_scatter, "reduce_scatter", locals())
    call = "reduce_scatter"
    pg = resolve(group, call)
    out, d = as_buffer(output, call, "output", True)
    ins = as_buffers(input_list, call, "input_list", False, pg._size)
    same_dtype(ins, d, call, "input_list")
    for i, (a, _) in enumerate(ins):
        if a.size != out.size:
            raise _size_error(call, f"input_list[{i}]", a.size, out.size, "the size of 'output'")
    p = plan(op, d, call)
    send = _send_operand(_stack(ins, d), d, p)
    return _reduce_scatter(pg, call, out, send, d, p, async_op, output)


def reduce_scatter_tensor(output: Any, input: Any, op: Any = ReduceOp.SUM,  # noqa: A002
                          group: Any = None, async_op: bool = False) -> Work | None:
    """Reduce ``input`` over ranks; rank i keeps block i in ``output`` (``MPI_Reduce_scatter_block``).

    ``input`` holds ``world_size * output.numel()`` elements, rank-major.
    """
    if debug.LEVEL and debug.outermost():
        return debug.run(reduce_scatter_tensor, "reduce_scatter_tensor", locals())
    call = "reduce_scatter_tensor"
    pg = resolve(group, call)
    out, d = as_buffer(output, call, "output", True)
    inp, di = as_buffer(input, call, "input", False)
    if di is not d:
        raise errors.type_error(call, f"output is {d.name} but input is {di.name}")
    if inp.size != out.size * pg._size:
        raise _size_error(call, "input", inp.size, out.size * pg._size, "world_size * output.numel()")
    p = plan(op, d, call)
    return _reduce_scatter(pg, call, out, _send_operand(inp, d, p), d, p, async_op, output)


def _alltoall(pg: ProcessGroup, call: str, send: np.ndarray, scounts: list[int],
              recv: np.ndarray, rcounts: list[int], d: DType, post: Callable[[], None] | None,
              async_op: bool, output: Any) -> Work | None:
    if _overlap(send, recv):
        send = send.copy()  # MPI forbids overlapping send and receive buffers
    comm = pg.comm
    n = scounts[0] if scounts else 0
    if all(c == n for c in scounts) and all(c == n for c in rcounts):
        return issue(pg, call, async_op, comm.Alltoall, comm.Ialltoall,
                     ([send, d.mpi], [recv, d.mpi]), post, output)
    return issue(pg, call, async_op, comm.Alltoallv, comm.Ialltoallv,
                 ([send, (scounts, _displacements(scounts)), d.mpi],
                  [recv, (rcounts, _displacements(rcounts)), d.mpi]), post, output)


def all_to_all(output_tensor_list: list[Any], input_tensor_list: list[Any], group: Any = None,
               async_op: bool = False) -> Work | None:
    """Send ``input_tensor_list[j]`` to rank j, receive rank j's into ``output_tensor_list[j]``.

    Becomes ``MPI_Alltoall`` for equal sizes, ``MPI_Alltoallv`` otherwise.
    """
    if debug.LEVEL and debug.outermost():
        return debug.run(all_to_all, "all_to_all", locals())
    call = "all_to_all"
    pg = resolve(group, call)
    outs = as_buffers(output_tensor_list, call, "output_tensor_list", True, pg._size)
    ins = as_buffers(input_tensor_list, call, "input_tensor_list", False, pg._size)
    if not outs:
        return None
    d = ins[0][1]
    same_dtype(ins, d, call, "input_tensor_list")
    same_dtype(outs, d, call, "output_tensor_list")
    recv = joined(outs)
    post = None
    rcounts = [a.size for a, _ in outs]
    if recv is None:
        recv = np.empty(sum(rcounts), d.raw)
        post = _unstage(recv, outs)
    return _alltoall(pg, call, _stack(ins, d), [a.size for a, _ in ins], recv, rcounts, d,
                     post, async_op, output_tensor_list)


def _splits(splits: Any, rows: int, size: int, call: str, arg: str) -> list[int]:
    if splits is None or len(splits) == 0:
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


def all_to_all_single(output: Any, input: Any, output_split_sizes: list[int] | None = None,  # noqa: A002
                      input_split_sizes: list[int] | None = None, group: Any = None,
                      async_op: bool = False) -> Work | None:
    """Split ``input`` along dim 0, send piece j to rank j, concatenate what arrives in ``output``.

    Equal splits become ``MPI_Alltoall``; ``*_split_sizes`` (rows per rank) ``MPI_Alltoallv``.
    """
    if debug.LEVEL and debug.outermost():
        return debug.run(all_to_all_single, "all_to_all_single", locals())
    call = "all_to_all_single"
    pg = resolve(group, call)
    out, d = as_buffer(output, call, "output", True)
    inp, di = as_buffer(input, call, "input", False)
    if di is not d:
        raise errors.type_error(call, f"output is {d.name} but input is {di.name}")
    in_rows = inp.shape[0] if inp.ndim else 1
    out_rows = out.shape[0] if out.ndim else 1
    row = inp.size // in_rows if in_rows else 0
    out_row = out.size // out_rows if out_rows else 0
    if in_rows and out_rows and row != out_row:
        raise errors.value_error(
            call, f"input rows have {row} elements but output rows have {out_row}"
        )
    row = row or out_row
    scounts = [s * row for s in _splits(input_split_sizes, in_rows, pg._size, call, "input_split_sizes")]
    rcounts = [s * row for s in _splits(output_split_sizes, out_rows, pg._size, call, "output_split_sizes")]
    return _alltoall(pg, call, inp.reshape(-1), scounts, out.reshape(-1), rcounts, d, None,
                     async_op, output)


def barrier(group: Any = None, async_op: bool = False, device_ids: Any = None) -> Work | None:
    """Block until every rank of the group arrives (``MPI_Barrier`` / ``MPI_Ibarrier``)."""
    if debug.LEVEL and debug.outermost():
        return debug.run(barrier, "barrier", locals())
    call = "barrier"
    pg = resolve(group, call)
    comm = pg.comm
    return issue(pg, call, async_op, comm.Barrier, comm.Ibarrier, ())

"""all_reduce of sparse COO torch tensors, as gloo does it: gather every rank's entries, then sum.

Each rank coalesces its tensor, the ranks exchange their number of entries and layout
(:func:`mpidist.calls.objects.allgather`), then every rank's indices and values
(``MPI_Allgatherv`` twice); the sum of all entries, coalesced, replaces the caller's tensor
in place (``Tensor.copy_``), so every rank ends with the same coalesced tensor. Only ``SUM``
is defined for sparse tensors (as in gloo). Other collectives take dense tensors only and
refuse sparse ones with a ``TypeError`` naming the call (see :mod:`mpidist.core.buffers`).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..core import errors, timeouts
from ..core.buffers import as_buffer
from ..core.groups import resolve
from ..core.work import Work, completed
from . import objects
from .ops import ReduceOp

CALL = "all_reduce"


def is_sparse(x: Any) -> bool:
    """Whether ``x`` is a torch tensor in a sparse layout (COO, CSR, CSC, BSR, BSC)."""
    torch = sys.modules.get("torch")
    return (torch is not None and isinstance(x, torch.Tensor)
            and x.layout in (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr,
                             torch.sparse_bsc))


def _is_sum(op: Any) -> bool:
    if op is ReduceOp.SUM:
        return True
    kind = getattr(op, "op", op)  # torch's ReduceOp
    return getattr(kind, "name", None) == "SUM" and getattr(op, "factor", None) is None


def all_reduce(tensor: Any, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False,
               call: str = CALL) -> Work | None:
    """Sum a sparse COO ``tensor`` across the group; every rank gets the coalesced sum in place.

    Becomes an all-gather of entry counts and layouts (``MPI_Iallgather`` of their pickles'
    sizes, ``MPI_Iallgatherv`` of the pickles), then ``MPI_Iallgatherv`` of the indices
    and of the values; the ranks' entries are added in rank order (as gloo adds them, so the
    result is bit for bit gloo's) and coalesced. ``async_op=True`` returns a
    finished :class:`~mpidist.core.work.Work` (the exchange itself runs blocking).

    Example: rank 0 holds ``{0: 1.0}`` and rank 1 ``{0: 2.0, 3: 5.0}`` (index: value) of a
    length-4 tensor; both end with the coalesced ``{0: 3.0, 3: 5.0}``.
    """
    import torch

    pg = resolve(group, call)
    if tensor.layout is not torch.sparse_coo:
        raise errors.type_error(call, f"sparse layout {tensor.layout} is not supported; "
                                "only sparse COO tensors are reduced (tensor.to_sparse_coo())")
    if not _is_sum(op):
        raise errors.value_error(call, f"op {op!r} is not defined for sparse tensors; "
                                 "only SUM is (as in gloo)")
    local = tensor.detach().coalesce()
    indices = local.indices().contiguous()
    values = local.values().contiguous()
    meta = (local._nnz(), local.sparse_dim(), local.dense_dim(), tuple(local.shape), str(local.dtype))
    metas = objects.allgather(pg, call, meta)
    if any(m[1:] != metas[pg._rank][1:] for m in metas):
        layouts = {r: f"shape {m[3]}, {m[4]}, sparse_dim {m[1]}, dense_dim {m[2]}"
                   for r, m in enumerate(metas)}
        raise errors.value_error(call, f"the ranks' sparse tensors differ: {layouts}")
    counts = [m[0] for m in metas]
    sparse_dim, dense_shape = local.sparse_dim(), tuple(values.shape[1:])
    per_value = int(np.prod(dense_shape, dtype=np.int64))
    flat_indices = _allgatherv(pg, call, indices, torch.int64, [c * sparse_dim for c in counts])
    flat_values = _allgatherv(pg, call, values, values.dtype, [c * per_value for c in counts])
    # rank by rank, as gloo adds them: the same summation order gives the same bits
    result = None
    i_off = v_off = 0
    for c in counts:
        part = torch.sparse_coo_tensor(flat_indices[i_off:i_off + c * sparse_dim].reshape(sparse_dim, c),
                                       flat_values[v_off:v_off + c * per_value].reshape(c, *dense_shape),
                                       local.shape, dtype=local.dtype)
        result = part if result is None else result + part
        i_off, v_off = i_off + c * sparse_dim, v_off + c * per_value
    with torch.no_grad():
        tensor.copy_(result.coalesce())
    return completed(call, tensor) if async_op else None


def _allgatherv(pg: Any, call: str, local: Any, dtype: Any, sizes: list[int]) -> Any:
    """``MPI_Iallgatherv`` of every rank's ``local`` (``sizes[r]`` elements from rank ``r``), flat."""
    import torch

    out = torch.empty(sum(sizes), dtype=dtype)
    if sum(sizes) == 0:
        return out
    send, d = as_buffer(local.reshape(-1), CALL, "tensor", False)
    recv, _ = as_buffer(out, CALL, "tensor", True)
    displs = np.concatenate(([0], np.cumsum(sizes)[:-1])).tolist()
    bufs = ([send, d.mpi], [recv, (sizes, displs), d.mpi])
    pg.seq += 1
    timeouts.wait((pg.comm.Iallgatherv(*bufs),), pg, call, bufs)
    return out

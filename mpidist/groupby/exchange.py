"""Moving tables (lists of equal-length 1-D columns) between ranks: Gatherv and Alltoallv.

Every column travels as raw bytes (``MPI.BYTE``), so numbers, bools and fixed-width
strings take the same path; the dtypes and string widths are agreed beforehand by the
schema check, so the receiver knows how to read them. Row counts move first, with one
``MPI_Gather``/``MPI_Alltoall`` of int64 counts.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from mpi4py import MPI


def _bytes(col: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(col).view(np.uint8)


def _displs(counts: np.ndarray) -> np.ndarray:
    out = np.zeros_like(counts)
    np.cumsum(counts[:-1], out=out[1:])
    return out


def gatherv(comm: MPI.Intracomm, cols: Sequence[np.ndarray], root: int) -> list[np.ndarray] | None:
    """Concatenate every rank's ``cols`` on ``root``, in rank order (``MPI_Gatherv``).

    Returns the concatenated columns on ``root`` and ``None`` elsewhere.
    """
    n = np.array([len(cols[0]) if cols else 0], dtype=np.int64)
    is_root = comm.Get_rank() == root
    counts = np.empty(comm.Get_size(), dtype=np.int64) if is_root else None
    comm.Gather(n, counts, root=root)
    out = []
    for col in cols:
        if is_root:
            recv = np.empty(int(counts.sum()), dtype=col.dtype)
            size = col.dtype.itemsize
            spec = [recv.view(np.uint8), counts * size, _displs(counts) * size, MPI.BYTE]
            comm.Gatherv([_bytes(col), MPI.BYTE], spec, root=root)
            out.append(recv)
        else:
            comm.Gatherv([_bytes(col), MPI.BYTE], None, root=root)
    return out if is_root else None


def alltoallv(comm: MPI.Intracomm, cols: Sequence[np.ndarray], dest: np.ndarray) -> list[np.ndarray]:
    """Send row ``i`` of every column to rank ``dest[i]`` (``MPI_Alltoallv``).

    What a rank receives is in source-rank order, and within one source in the order of
    that source's rows, so "earliest rank first" survives the exchange.
    """
    size = comm.Get_size()
    order = np.argsort(dest, kind="stable")
    send_counts = np.bincount(dest, minlength=size).astype(np.int64)
    recv_counts = np.empty(size, dtype=np.int64)
    comm.Alltoall(send_counts, recv_counts)
    sd, rd = _displs(send_counts), _displs(recv_counts)
    out = []
    for col in cols:
        size_b = col.dtype.itemsize
        send = col[order]
        recv = np.empty(int(recv_counts.sum()), dtype=col.dtype)
        comm.Alltoallv([_bytes(send), send_counts * size_b, sd * size_b, MPI.BYTE],
                       [recv.view(np.uint8), recv_counts * size_b, rd * size_b, MPI.BYTE])
        out.append(recv)
    return out

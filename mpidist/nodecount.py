"""How many nodes a communicator spans, asked of MPI once and cached on the communicator.

``MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`` groups the ranks that share memory (one node);
an ``MPI_Allreduce`` counts the node leaders. The answer is kept as an MPI attribute of the
communicator (``MPI_Comm_set_attr``), so it lives and dies with it. Both steps are collective:
call :func:`nodes` where every rank of the communicator makes the same call (the first
reduction on it, the first collective of a torch group).
"""

from __future__ import annotations

from mpi4py import MPI

_keyval: int | None = None


def nodes(comm: MPI.Comm) -> int:
    """The number of nodes (shared-memory domains) ``comm``'s ranks run on; collective the first time."""
    global _keyval
    if _keyval is None:
        _keyval = MPI.Comm.Create_keyval()
    n = comm.Get_attr(_keyval)
    if n is None:
        if comm.Get_size() == 1:
            n = 1
        else:
            node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
            try:
                n = comm.allreduce(int(node.Get_rank() == 0), op=MPI.SUM)
            finally:
                node.Free()
        comm.Set_attr(_keyval, n)
    return n

"""Which asynchronous torch calls run the blocking MPI call, and which overlap with backward.

torch marks DDP's bucket all-reduces asynchronous. Running one as the nonblocking MPI call
(completed by the progress thread) lets backward go on while the bytes travel; running it
blocking saves the hand-off to the progress thread. Which pays depends on what limits the
step, and two facts decide it: how many nodes the group spans
(:func:`mpidist.core.topology.node_count`, ``MPI_COMM_TYPE_SHARED``), and whether this node's
ranks and their torch threads want more cores than they have
(:func:`mpidist.start.threads.oversubscribed`).

* One node, a core for every thread: memory moves the bytes faster than backward produces
  them, so calls up to :data:`ONE_NODE` bytes block (benchmarks/torch_backend.py measured the
  blocking call faster at every size).
* One node whose ranks share cores: every asynchronous call overlaps. A blocking wait tests
  its request back to back for as long as its bytes take, and where the rank has no core of its
  own that spin takes the core from a peer still in backward; the progress thread sleeps
  between its tests instead (docs/benchmarks.md, "One path per call, measured").
* Across nodes: the network is the bottleneck, so every asynchronous call overlaps
  (:data:`ACROSS_NODES` is 0). Even small ones: a blocking call in the middle of backward
  makes each rank wait there for the slowest (benchmarks/network.py --ddp measured DDP
  steps slower with small buckets blocking than with every bucket overlapped).

``MPIDIST_TORCH_SYNC_BYTES`` overrides both for every group (``0``: every asynchronous call
overlaps).
"""

from __future__ import annotations

from mpi4py import MPI

from ..core import settings, topology
from ..start import threads

#: One node: asynchronous calls of at most this many bytes run the blocking MPI call.
ONE_NODE = 64 << 20
#: Across nodes: asynchronous calls of at most this many bytes run the blocking MPI call.
ACROSS_NODES = 0


def from_env() -> int | None:
    """``MPIDIST_TORCH_SYNC_BYTES`` as an int, ``None`` when unset (choose per group)."""
    return settings.integer("MPIDIST_TORCH_SYNC_BYTES")


def choose(nodes: int, shared_cores: bool = False) -> int:
    """The blocking limit in bytes for a group spanning ``nodes`` nodes (``shared_cores``: this
    node's ranks and threads want more cores than it has)."""
    return ONE_NODE if nodes <= 1 and not shared_cores else ACROSS_NODES


def shared_cores(torch_threads: int) -> bool:
    """Whether this node's ranks, each with ``torch_threads`` intra-op threads, want more cores
    than they have (the node's ranks and their CPU masks from ``MPI_COMM_TYPE_SHARED``, learnt
    at init)."""
    from ..core import groups

    return threads.oversubscribed(max(groups.registry.local_size, 1), torch_threads)


def sync_bytes(comm: MPI.Comm, override: int | None) -> int:
    """``override`` when set, else the limit for ``comm``'s node count and cores.

    Collective: call it where every rank of ``comm`` does (group creation). The thread count is
    the most any rank of ``comm`` runs (``MPI_Allreduce``), so every rank decides alike.
    """
    if override is not None:
        return override
    import torch

    most = comm.allreduce(torch.get_num_threads(), op=MPI.MAX)
    return choose(topology.node_count(comm), shared_cores(most))

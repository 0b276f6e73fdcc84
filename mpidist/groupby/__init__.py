"""Distributed group-by over MPI: every rank groups its own rows, then the partial results
are merged at a root, shuffled by key hash, gathered unmerged, or left where they are.

``import mpidist.groupby`` needs numpy and mpi4py only; the pandas front
(:func:`aggregate_frame`) imports pandas when it is called.

Example (``mpirun -n 4 python etl.py``)::

    import mpidist as dist
    import mpidist.groupby as gb

    dist.init_process_group("mpi")
    r = gb.aggregate(store, {"amount": amount}, ["sum", "mean"], merge="shuffle")
    print(dist.get_rank(), r.to_dict())

Modules: ``columns`` (argument parsing), ``schema`` (the up-front agreement check),
``factorize`` (group ids), ``states`` (partial states and their merge), ``hashing``
(deterministic key hashes), ``exchange`` (Gatherv/Alltoallv of columns), ``result``,
``api`` (the merge modes) and ``frame`` (pandas).

Imports: numpy (pandas for frames) and :mod:`mpidist.core`.
"""

from __future__ import annotations

from .api import aggregate, partition_by_key
from .columns import AGGS, MERGES
from .frame import aggregate_frame
from .result import GroupByResult

__all__ = ["AGGS", "MERGES", "GroupByResult", "aggregate", "aggregate_frame", "partition_by_key"]

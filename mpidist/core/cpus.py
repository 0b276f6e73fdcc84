"""The CPUs a process may run on: what tells whether a node's ranks share cores.

A launcher may bind each rank to cores of its own (Intel MPI does by default) or leave every
rank the whole machine (MPICH's and Open MPI's ``--bind-to none``), so no rank can tell the
others' CPUs from its own: the world gathers every rank's mask within the node at init
(:func:`mpidist.core.groups.learn_local_rank`).
"""

from __future__ import annotations

import os


def mask() -> frozenset[int]:
    """The CPUs this process may run on (``sched_getaffinity``; where that is unknown, all of the
    machine's)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset(range(os.cpu_count() or 1))

"""Ranks' threads against the node's cores: OpenMP's waiting policy where they are oversubscribed.

torch's CPU kernels run on an OpenMP thread pool, and GNU OpenMP's threads (torch's Linux
wheels) spin for a while after each parallel region before they sleep. Where a node's ranks
together run more threads than it has cores (2 ranks x 2 threads on 2 cores, the rule on
laptops and CI), those spins take the cores that the other ranks' threads and the ranks'
collectives need: a 7 k-parameter DDP step at 2 ranks x 2 threads on 2 cores took 9.7-11.5 ms on
gloo and 11.9-13.8 ms on mpidist, and 4.1-4.7 ms and 1.9-2.6 ms with ``OMP_WAIT_POLICY=PASSIVE``
(docs/benchmarks.md, "Where ranks share cores"). The policy is read once, when torch loads its
OpenMP library, so it must be in the environment before ``import torch``:
``python -m mpidist.run`` sets it there (:mod:`mpidist.start.torchrun_env`), and the torch
backend warns, once per node, where a job runs oversubscribed without it.

Whether the ranks share cores comes from every rank's real CPU mask (``sched_getaffinity``),
gathered over the node: launchers bind ranks in their own ways (Intel MPI pins 3 ranks on 2
cores as ``{0}, {1}, {0}``; MPICH and Open MPI's ``--bind-to none`` leave every rank the whole
machine), so no rank can tell from its own mask what the others have.
"""

from __future__ import annotations

import os
from fractions import Fraction
from typing import Collection, Mapping, Sequence

from mpi4py import MPI

from ..core import cpus, groups

#: Variables by which the user has chosen how OpenMP threads wait (GNU, LLVM/Intel OpenMP).
WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, else the machine's count)."""
    return len(cpus.mask())


def gather_masks(comm: MPI.Intracomm) -> list[frozenset[int]]:
    """The CPU mask of each of this node's ranks of ``comm``, in node-rank order.

    Collective over ``comm``: ``MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`` and an
    ``MPI_Allgather`` within the node; every rank of a node gets the same list.
    """
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        return node.allgather(cpus.mask())
    finally:
        node.Free()


def node_masks(local_ranks: int) -> list[frozenset[int]]:
    """The CPU masks of this node's ``local_ranks`` ranks: those gathered when the world was made
    (:func:`mpidist.core.groups.learn_local_rank`), else (before init, or for another count of
    ranks) this rank's own mask for each, as if every rank shared it."""
    known = groups.registry.local_masks
    if len(known) == local_ranks:
        return list(known)
    return [cpus.mask()] * local_ranks


def busiest_core(masks: Sequence[Collection[int]], threads: int | Sequence[int]) -> Fraction:
    """The load of the busiest core: each rank spreads its threads evenly over the CPUs of its
    mask, and a core carries the sum of the shares of the ranks whose mask holds it.

    ``threads``: every rank's thread count, or one count per rank (in the order of ``masks``).
    Exact fractions, so that every rank that computes it from the same masks gets the same answer.
    """
    counts = [threads] * len(masks) if isinstance(threads, int) else list(threads)
    load: dict[int, Fraction] = {}
    for mask, n in zip(masks, counts):
        for cpu in mask:
            load[cpu] = load.get(cpu, Fraction(0)) + Fraction(n, len(mask))
    return max(load.values(), default=Fraction(0))


def oversubscribed(local_ranks: int, threads: int, masks: Sequence[Collection[int]] | None = None) -> bool:
    """Whether this node's ``local_ranks`` ranks, ``threads`` threads each, load a core with more
    than one thread (:func:`busiest_core`).

    ``masks``: each rank's CPUs; by default :func:`node_masks`, the real masks gathered at init.
    Every rank of the node gets the same answer where they pass the same ``threads``.
    """
    masks = node_masks(local_ranks) if masks is None else masks
    return busiest_core(masks, threads) > 1


def threads_of(value: str | None) -> int | None:
    """The outermost thread count of an ``OMP_NUM_THREADS`` value (``"4"``, ``"4,2"``), or ``None``."""
    head = (value or "").split(",")[0].strip()
    return int(head) if head.isdigit() and int(head) > 0 else None


def chosen(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment already says how OpenMP threads wait."""
    environ = os.environ if environ is None else environ
    return any(environ.get(v, "").strip() for v in WAIT_VARIABLES)


def wait_policy(local_ranks: int, threads: int, environ: Mapping[str, str] | None = None,
                masks: Sequence[Collection[int]] | None = None) -> str | None:
    """``"PASSIVE"`` where the ranks are oversubscribed, run OpenMP threads (more than one each)
    and the user chose no policy, else ``None``."""
    if threads < 2 or chosen(environ) or not oversubscribed(local_ranks, threads, masks):
        return None
    return "PASSIVE"


def advice(local_ranks: int, threads: int, openmp: bool, environ: Mapping[str, str] | None = None,
           masks: Sequence[Collection[int]] | None = None) -> str | None:
    """The warning for a job whose ranks run oversubscribed on OpenMP's spinning default, or ``None``."""
    masks = node_masks(local_ranks) if masks is None else masks
    if not openmp or wait_policy(local_ranks, threads, environ, masks) is None:
        return None
    cores = len(frozenset().union(*masks))
    # how the loaded MPI's mpiexec exports a variable: Open MPI's -x, Hydra's (MPICH, Intel MPI) -genv
    flag = ("-x OMP_WAIT_POLICY=PASSIVE" if "Open MPI" in MPI.get_vendor()[0]
            else "-genv OMP_WAIT_POLICY PASSIVE")
    return (f"{local_ranks} ranks x {threads} torch threads on this node's {cores} cores: OpenMP's "
            "threads spin after each parallel region and take the cores other ranks need (a small "
            "DDP step measured 5x slower). Set OMP_WAIT_POLICY=PASSIVE in the job's environment, "
            f"before torch is imported (mpiexec {flag}; python -m mpidist.run sets it), or use "
            "fewer threads (OMP_NUM_THREADS).")

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
"""

from __future__ import annotations

import os
from typing import Mapping

#: Variables by which the user has chosen how OpenMP threads wait (GNU, LLVM/Intel OpenMP).
WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def oversubscribed(local_ranks: int, threads: int, cores: int | None = None,
                   machine_cores: int | None = None) -> bool:
    """Whether ``local_ranks`` ranks of ``threads`` threads each want more cores than they have.

    ``cores``: the cores this rank may use (:func:`usable_cores`); ``machine_cores``: the node's
    (``os.cpu_count()``). Where the launcher bound each rank to cores of its own (its cores times
    the ranks fit the node), the rank's threads are compared with its own cores; otherwise every
    rank shares the same cores and all the node's threads are.
    """
    cores = usable_cores() if cores is None else cores
    machine_cores = (os.cpu_count() or cores) if machine_cores is None else machine_cores
    if local_ranks > 1 and cores * local_ranks <= machine_cores:
        return threads > cores  # bound: each rank on cores of its own
    return local_ranks * threads > cores


def threads_of(value: str | None) -> int | None:
    """The outermost thread count of an ``OMP_NUM_THREADS`` value (``"4"``, ``"4,2"``), or ``None``."""
    head = (value or "").split(",")[0].strip()
    return int(head) if head.isdigit() and int(head) > 0 else None


def chosen(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment already says how OpenMP threads wait."""
    environ = os.environ if environ is None else environ
    return any(environ.get(v, "").strip() for v in WAIT_VARIABLES)


def wait_policy(local_ranks: int, threads: int, environ: Mapping[str, str] | None = None,
                cores: int | None = None) -> str | None:
    """``"PASSIVE"`` where the ranks are oversubscribed, run OpenMP threads (more than one each)
    and the user chose no policy, else ``None``."""
    if threads < 2 or chosen(environ) or not oversubscribed(local_ranks, threads, cores):
        return None
    return "PASSIVE"


def advice(local_ranks: int, threads: int, openmp: bool, environ: Mapping[str, str] | None = None,
           cores: int | None = None) -> str | None:
    """The warning for a job whose ranks run oversubscribed on OpenMP's spinning default, or ``None``."""
    if not openmp or wait_policy(local_ranks, threads, environ, cores) is None:
        return None
    cores = usable_cores() if cores is None else cores
    return (f"{local_ranks} ranks x {threads} torch threads on this node's {cores} cores: OpenMP's "
            "threads spin after each parallel region and take the cores other ranks need (a small "
            "DDP step measured 5x slower). Set OMP_WAIT_POLICY=PASSIVE in the job's environment, "
            "before torch is imported (mpiexec -genv OMP_WAIT_POLICY PASSIVE, or -x with Open "
            "MPI; python -m mpidist.run sets it), or use fewer threads (OMP_NUM_THREADS).")

"""Going on after a rank dies: find the failure behind an error, and resume an epoch's data.

The pattern (``examples/survive.py``, docs/survive.md), in a job started for ULFM::

    try:
        train_steps(...)
    except Exception as exc:
        err = process_failure(exc)               # None: not a failure, re-raise
        if err is None:
            raise
        dist.shrink_group(err.failed_ranks)      # the world of the survivors, ranks renumbered
        model = DDP(model.module)                # broadcasts the new rank 0's parameters
        sampler = resume_sampler(sampler, consumed)  # the epoch's rest, sharded anew

Every survivor raises, so every survivor runs the same recovery; the step that failed is
redone (its gradients were never applied: ``optimizer.step`` was not reached).
"""

from __future__ import annotations

from ..core import faults
from ..core.faults import ProcessFailureError
from ..start import world
from .sampler import DistributedSampler


def process_failure(exc: BaseException) -> ProcessFailureError | None:
    """The :class:`~mpidist.ProcessFailureError` behind ``exc``, else ``None``.

    ``exc`` itself, one in its ``__cause__``/``__context__`` chain, or, for an error torch
    raises from C++ with the text of ours (DDP's backward), the failure this rank raised last.
    """
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, ProcessFailureError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    last = faults.last
    if last is not None and faults.MARK in str(exc):
        return last
    return None


def resume_sampler(sampler: DistributedSampler, consumed: int) -> DistributedSampler:
    """``sampler``'s epoch from sample ``consumed`` on, sharded over the world as it is now.

    ``consumed`` counts the samples of the epoch's order that every rank together finished
    (steps done × batch size × ranks at the time); the rest is split over the current world.
    """
    out = DistributedSampler(sampler.dataset, world.get_world_size(), world.get_rank(), sampler.shuffle,
                             sampler.seed, sampler.drop_last, sampler.rng, start=sampler.start + consumed)
    out.set_epoch(sampler.epoch)
    return out

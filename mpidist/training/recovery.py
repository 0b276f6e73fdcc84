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

At full size, in a job started with spares (``MPIDIST_SPARES``): the survivors call
``mpidist.torch.heal()`` (or :func:`mpidist.heal_group`) instead of ``shrink_group``, then
:func:`catch_up` and DDP again; each spare called in runs the script from its
``init_process_group`` and calls :func:`catch_up` at the same point (``examples/survive.py``).
"""

from __future__ import annotations

from typing import Any

from ..calls.objects import broadcast_object_list
from ..core import faults, job
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


def catch_up(model: Any = None, optimizer: Any = None, **counters: Any) -> dict[str, Any]:
    """Bring the ranks a heal filled with spares to the survivors' state; every rank calls it.

    Survivors call it after :func:`mpidist.heal_group` (or :func:`mpidist.torch.heal`); each
    newcomer calls it at the same point of its own start, after building its model and optimizer.
    Both call it before wrapping the model in DDP again: DDP's construction broadcasts rank 0's
    parameters, and rank 0 may be a newcomer. The first survivor's ``model`` and ``optimizer`` state dicts (a
    ``DistributedDataParallel`` is read through to its module) and ``counters`` (step, epoch, the
    samples of the epoch done: whatever the loop needs to resume) go to every rank
    (``MPI_Bcast`` of their pickle, :func:`mpidist.broadcast_object_list`); newcomers load the
    state dicts. Returns the first survivor's ``counters`` on every rank.

    Example (the loop resumes where the survivors are)::

        state = catch_up(model, opt, step=step, epoch=epoch, done=done)
        step, epoch, done = state["step"], state["epoch"], state["done"]
    """
    module = getattr(model, "module", model)
    root = next(r for r in range(world.get_world_size()) if r not in job.newcomers)
    payload = [None]
    if world.get_rank() == root:
        payload = [{"model": module.state_dict() if module is not None else None,
                    "optimizer": optimizer.state_dict() if optimizer is not None else None,
                    "counters": counters}]
    broadcast_object_list(payload, src=root)
    state = payload[0]
    if job.is_newcomer():
        if module is not None:
            module.load_state_dict(state["model"])
        if optimizer is not None:
            optimizer.load_state_dict(state["optimizer"])
    return dict(state["counters"])

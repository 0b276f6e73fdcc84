"""DistributedSampler: each rank's share of a dataset's indices, as torch's sampler gives them.

The rules are torch's: every epoch the indices are shuffled with seed ``seed + epoch``
(when ``shuffle``), padded by repeating indices from the start until the total divides
by ``num_replicas`` (or cut to the largest multiple with ``drop_last``), then rank ``r``
takes every ``num_replicas``-th index starting at ``r``. No MPI call is made: the
ranks agree because they compute the same permutation.
"""

from __future__ import annotations

import math
from typing import Iterator, Sized

import numpy as np

from ..core import errors
from ..start import world

_CALL = "DistributedSampler"


class DistributedSampler:
    """Yield this rank's indices of ``dataset`` (anything with ``len``), torch-style.

    Call :meth:`set_epoch` at the start of every epoch, or every epoch repeats the
    same order. ``len(sampler)`` is the number of indices this rank gets.

    Parameters
    ----------
    dataset : Sized
        The dataset; only ``len(dataset)`` is used.
    num_replicas : int, optional
        Number of ranks sharing it (default: the world size).
    rank : int, optional
        This rank's share, ``0 <= rank < num_replicas`` (default: the world rank).
    shuffle : bool
        Shuffle the indices each epoch (seeded with ``seed + epoch``).
    seed : int
        Base seed; must be the same on every rank.
    drop_last : bool
        Drop the tail so every rank gets the same count instead of padding by repeating.
    rng : {"numpy", "torch"}
        Which permutation shuffles: ``"numpy"`` (``np.random.default_rng(seed + epoch)``,
        no torch needed) or ``"torch"`` (``torch.randperm`` with a generator seeded with
        ``seed + epoch``: the very indices torch's own sampler yields).
    start : int
        Samples of the epoch's order already consumed: they are skipped and the rest is sharded
        (resuming an epoch on fewer ranks after a failure, :mod:`mpidist.training.recovery`).
    """

    def __init__(self, dataset: Sized, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False, rng: str = "numpy",
                 start: int = 0) -> None:
        if num_replicas is None or rank is None:
            num_replicas = world.get_world_size() if num_replicas is None else num_replicas
            rank = world.get_rank() if rank is None else rank
        for name, value in (("num_replicas", num_replicas), ("rank", rank), ("seed", seed)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise errors.type_error(_CALL, f"{name} must be an int, got {value!r}")
        if num_replicas < 1:
            raise errors.value_error(_CALL, f"num_replicas must be at least 1, got {num_replicas}")
        if not 0 <= rank < num_replicas:
            raise errors.value_error(
                _CALL, f"invalid rank {rank}: it must lie in the interval [0, {num_replicas - 1}]"
            )
        if rng not in ("numpy", "torch"):
            raise errors.value_error(_CALL, f"rng must be 'numpy' or 'torch', got {rng!r}")
        try:
            n = len(dataset)
        except TypeError:
            raise errors.type_error(
                _CALL, f"dataset must have a length, got {errors.type_name(dataset)}"
            ) from None
        if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or not 0 <= start <= n:
            raise errors.value_error(_CALL, f"start must be an int in 0..{n} (samples of the epoch already "
                                            f"consumed), got {start!r}")
        self.start = int(start)
        n -= self.start
        self.dataset = dataset
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.rng = rng
        self.epoch = 0
        if self.drop_last and n % self.num_replicas != 0:
            self.num_samples = math.ceil((n - self.num_replicas) / self.num_replicas)
        else:
            self.num_samples = math.ceil(n / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def _order(self, n: int) -> list[int]:
        if not self.shuffle:
            return list(range(n))
        if self.rng == "torch":
            import torch

            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            return torch.randperm(n, generator=g).tolist()
        return np.random.default_rng((self.seed + self.epoch) % 2**64).permutation(n).tolist()

    def indices(self) -> list[int]:
        """This rank's indices for the current epoch, as a list."""
        whole = self._order(len(self.dataset))
        order = whole[self.start:]
        if self.drop_last:
            order = order[:self.total_size]
        else:  # padded from the epoch's first samples, as the epoch never resumed is
            pad = self.total_size - len(order)
            if pad > 0 and order:
                order += (whole * math.ceil(pad / len(whole)))[:pad]
        return order[self.rank:self.total_size:self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices())

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch; with ``shuffle`` it changes the order (same on every rank)."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)):
            raise errors.type_error("DistributedSampler.set_epoch", f"epoch must be an int, got {epoch!r}")
        self.epoch = int(epoch)

    def __repr__(self) -> str:
        return (f"DistributedSampler(len={len(self.dataset)}, num_replicas={self.num_replicas}, "
                f"rank={self.rank}, shuffle={self.shuffle}, seed={self.seed}, "
                f"drop_last={self.drop_last}, epoch={self.epoch})")

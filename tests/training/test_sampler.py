"""DistributedSampler against torch's own sampler, and its partition invariants."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from mpidist.training.sampler import DistributedSampler

torch_data = pytest.importorskip("torch.utils.data")

LENGTHS = (0, 1, 2, 5, 10, 17, 64)
REPLICAS = (1, 2, 3, 4, 7)


def _torch_indices(n, replicas, rank, shuffle, seed, drop_last, epoch):
    s = torch_data.DistributedSampler(range(n), num_replicas=replicas, rank=rank, shuffle=shuffle,
                                      seed=seed, drop_last=drop_last)
    s.set_epoch(epoch)
    return list(s), len(s)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_matches_torch_exactly_with_torch_rng(shuffle, drop_last):
    for n, replicas, seed, epoch in itertools.product(LENGTHS, REPLICAS, (0, 7), (0, 3)):
        for rank in range(replicas):
            ours = DistributedSampler(range(n), num_replicas=replicas, rank=rank, shuffle=shuffle,
                                      seed=seed, drop_last=drop_last, rng="torch")
            ours.set_epoch(epoch)
            want, want_len = _torch_indices(n, replicas, rank, shuffle, seed, drop_last, epoch)
            assert list(ours) == want, (n, replicas, rank, seed, epoch)
            assert len(ours) == want_len


@pytest.mark.parametrize("drop_last", [False, True])
def test_unshuffled_numpy_rng_matches_torch(drop_last):
    for n, replicas in itertools.product(LENGTHS, REPLICAS):
        for rank in range(replicas):
            ours = DistributedSampler(list(range(n)), num_replicas=replicas, rank=rank, shuffle=False,
                                      drop_last=drop_last)
            assert (list(ours), len(ours)) == _torch_indices(n, replicas, rank, False, 0, drop_last, 0)


@pytest.mark.parametrize("drop_last", [False, True])
def test_numpy_shuffle_partitions_like_torch(drop_last):
    """Same per-rank counts and padding rule as torch; ranks together cover a permutation."""
    for n, replicas, epoch in itertools.product(LENGTHS, REPLICAS, (0, 1)):
        shares = []
        for rank in range(replicas):
            s = DistributedSampler(range(n), num_replicas=replicas, rank=rank, seed=5, drop_last=drop_last)
            s.set_epoch(epoch)
            shares.append(list(s))
            assert len(s) == _torch_indices(n, replicas, rank, True, 5, drop_last, epoch)[1]
            assert len(shares[-1]) == len(s)
        # interleave back into the global order the ranks were dealt from
        merged = [shares[r][i] for i in range(len(shares[0])) for r in range(replicas)]
        perm = np.random.default_rng(5 + epoch).permutation(n).tolist()
        if drop_last:
            assert merged == perm[:len(merged)]
        else:
            assert merged[:n] == perm
            assert all(i in perm for i in merged[n:])  # padding repeats real indices
            assert len(merged) - n < replicas or n == 0


def test_epoch_changes_order_and_ranks_agree():
    a = DistributedSampler(range(100), num_replicas=4, rank=1, seed=3)
    b = DistributedSampler(range(100), num_replicas=4, rank=1, seed=3)
    first = list(a)
    a.set_epoch(1)
    b.set_epoch(1)
    assert list(a) == list(b)
    assert list(a) != first
    assert sorted(first) != first  # shuffled


def test_padding_by_repetition_when_dataset_smaller_than_replicas():
    # 2 items over 5 ranks: torch repeats the list until it covers 5 slots
    got = [list(DistributedSampler(range(2), num_replicas=5, rank=r, shuffle=False)) for r in range(5)]
    want = [_torch_indices(2, 5, r, False, 0, False, 0)[0] for r in range(5)]
    assert got == want
    assert sorted(i for share in got for i in share) == sorted([0, 1, 0, 1, 0])


@pytest.mark.parametrize("kwargs, exc, text", [
    ({"num_replicas": 2, "rank": 2}, ValueError, "invalid rank 2"),
    ({"num_replicas": 2, "rank": -1}, ValueError, "invalid rank -1"),
    ({"num_replicas": 0, "rank": 0}, ValueError, "num_replicas must be at least 1"),
    ({"num_replicas": 2.0, "rank": 0}, TypeError, "num_replicas must be an int"),
    ({"num_replicas": 2, "rank": 0, "rng": "mt"}, ValueError, "rng must be"),
])
def test_bad_arguments(kwargs, exc, text):
    with pytest.raises(exc, match=text) as info:
        DistributedSampler(range(4), **kwargs)
    assert str(info.value).startswith("DistributedSampler: rank ")


def test_dataset_without_length_and_bad_epoch():
    with pytest.raises(TypeError, match="dataset must have a length"):
        DistributedSampler(iter(range(3)), num_replicas=1, rank=0)
    s = DistributedSampler(range(3), num_replicas=1, rank=0)
    with pytest.raises(TypeError, match="epoch must be an int"):
        s.set_epoch("1")


@pytest.mark.mpi
def test_defaults_come_from_the_world(dist, rank, size):
    from helpers import gathered

    s = dist.DistributedSampler(range(23), shuffle=True, seed=11)
    assert (s.num_replicas, s.rank) == (size, rank)
    shares = gathered(dist, list(s))
    assert {len(x) for x in shares} == {-(-23 // size)}
    assert set().union(*map(set, shares)) == set(range(23))

"""Topology helpers on one node at 1-4 ranks (tests/cluster/test_cluster.py covers several nodes).

On one node every rank shares memory: one node group holding every rank, local rank
groups of one rank each, a one-row mesh. Also on a subgroup as the parent, where only
its members call.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI


@pytest.mark.mpi
def test_one_node(dist, rank, size):
    assert dist.node_ranks() == [list(range(size))]
    assert dist.get_process_group_ranks(dist.new_node_group()) == list(range(size))
    assert dist.get_process_group_ranks(dist.new_local_rank_group()) == [rank]
    cur, groups = dist.new_subgroups_by_local_rank()
    assert len(groups) == size and groups[rank] is cur
    assert all(g is dist.GroupMember.NON_GROUP_MEMBER for i, g in enumerate(groups) if i != rank)
    cur, groups = dist.new_subgroups_by_node()
    assert groups == [cur]
    assert dist.node_mesh() == [list(range(size))]
    t = np.full(2, float(rank))
    dist.all_reduce(t, group=cur)
    np.testing.assert_array_equal(t, np.full(2, float(sum(range(size)))))


@pytest.mark.mpi
def test_on_a_subgroup(dist, rank, size):
    odd = [r for r in range(size) if r % 2]
    if not odd:
        pytest.skip("needs a rank 1")
    g = dist.new_group(odd)
    if rank in odd:  # only the members take part, as with any call on a group
        assert dist.node_ranks(g) == [odd]
        node_g = dist.new_node_group(g)
        assert dist.get_process_group_ranks(node_g) == odd
        t = np.array([float(rank)])
        dist.all_reduce(t, group=node_g)
        assert t[0] == sum(odd)
    MPI.COMM_WORLD.Barrier()


@pytest.mark.mpi
def test_bad_group_is_refused(dist):
    with pytest.raises(TypeError):
        dist.node_ranks(group="not a group")

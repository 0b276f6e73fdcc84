"""shrink_group with every member alive (any MPI): torch's checks, and the group without a rank.

The excluded rank takes no part (torch's rule): the others make the group among themselves.
"""

from __future__ import annotations

import numpy as np
import pytest

import mpidist as dist


@pytest.fixture
def world():
    if not dist.is_initialized():
        dist.init_process_group("mpi")
    return dist.group.WORLD


@pytest.mark.mpi(min_size=1)
def test_bad_arguments_raise_on_the_rank_that_passes_them(world):
    n, me = world.size(), world.rank()
    # torch's order: the list itself and the flags, then the group's size, then each rank
    cases = [((3,), TypeError, "must be a list"), (([],), ValueError, "empty"),
             (([0], None, 7), ValueError, "shrink_flags")]
    if n > 1:
        other = (me + 1) % n
        cases += [(([n],), ValueError, "outside"), ((["0"],), TypeError, "ints"),
                  (([other, other],), ValueError, "twice"), ((list(range(n)),), ValueError, "leaves none"),
                  (([me],), RuntimeError, "only the ranks that stay")]
    else:
        cases += [(([0],), ValueError, "nothing to shrink")]
    for args, kind, words in cases:
        with pytest.raises(kind, match=words):
            dist.shrink_group(*args)
    dist.all_reduce(np.ones(1))  # nothing was started: the world still works


@pytest.mark.mpi(min_size=2)
def test_subgroup_without_a_live_rank(world):
    n, me = world.size(), world.rank()
    g = dist.new_group(list(range(n)))
    out = n - 1
    if me != out:
        g2 = dist.shrink_group([out], group=g)
        x = np.full(3, me + 1.0)
        dist.all_reduce(x, group=g2)
        np.testing.assert_array_equal(x, np.full(3, np.sum(np.arange(1.0, n))))  # 1 + ... + (n - 1)
        assert (g2.rank(), g2.size(), dist.get_process_group_ranks(g2)) == (me, n - 1, list(range(n - 1)))
        with pytest.raises(RuntimeError, match="destroyed"):
            dist.all_reduce(np.ones(1), group=g)  # torch's rule: the shrunk group is destroyed
        dist.destroy_process_group(g2)
    dist.barrier()  # the world goes on

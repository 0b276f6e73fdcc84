"""The default cross-rank check through torch.distributed on the ``mpidist`` backend.

The twins of ``tests/checks/test_agreement.py``: on a fresh group (whose first calls are checked),
one rank passes another count, dtype, op, root or split sizes; every rank raises the same
``ValueError`` and the group works afterwards, with results compared against numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import raised_everywhere, rank_data

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'mpidist[torch]')")


def _cases(tw, g, me, n):
    last = n - 1
    bad = me == last
    root_bad = me == 0
    k = 3 if bad else 2
    dst = 1 if bad else 0
    ones = torch.ones
    return {
        "all_reduce count": (lambda: tw.all_reduce(ones(5 if bad else 4), group=g), ["'count'"]),
        "all_reduce dtype": (lambda: tw.all_reduce(ones(4, dtype=torch.float64 if bad else torch.float32),
                                                   group=g), ["'dtype'", f"rank {last} passed float64"]),
        "all_reduce op": (lambda: tw.all_reduce(ones(2), op=tw.ReduceOp.MAX if bad else tw.ReduceOp.SUM,
                                                group=g), ["'op'", f"rank {last} passed MAX"]),
        "broadcast count, root differs": (lambda: tw.broadcast(ones(3 if root_bad else 4), src=0, group=g),
                                          ["broadcast #", "rank 0 passed 3"]),
        "broadcast src": (lambda: tw.broadcast(ones(3), src=dst, group=g), ["'src'"]),
        "reduce dst": (lambda: tw.reduce(ones(3), dst=dst, group=g), ["reduce #", "'dst'"]),
        "all_gather_into_tensor count": (
            lambda: tw.all_gather_into_tensor(ones(k * n), ones(k), group=g), ["all_gather_into_tensor #"]),
        "reduce_scatter_tensor count": (
            lambda: tw.reduce_scatter_tensor(ones(k), ones(k * n), group=g), ["reduce_scatter_tensor #"]),
        "all_to_all_single split sizes": (
            lambda: tw.all_to_all_single(ones(n), ones(n), input_split_sizes=[0, 2] + [1] * (n - 2)
                                         if root_bad else None, group=g),
            ["rank 0 sends 2 elements to rank 1, which expects 1"]),
        "broadcast_object_list length": (
            # torch broadcasts the list's sizes first: a tensor of one entry per object
            lambda: tw.broadcast_object_list([me] * (3 if bad else 2), src=0, group=g),
            ["broadcast #", "'count'", f"rank {last} passed 3"]),
    }


CASES = list(_cases(None, None, 0, 2))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("case", CASES)
def test_disagreeing_rank_raises_on_every_rank_through_torch(tw, case):
    me, n = tw.get_rank(), tw.get_world_size()
    g = tw.new_group(list(range(n)))
    fn, wants = _cases(tw, g, me, n)[case]
    text = raised_everywhere(tw, fn)
    for want in wants:
        assert want in text, (want, text)
    every = [rank_data(r, (3,), np.float32, seed=3) for r in range(n)]
    t = torch.from_numpy(every[me].copy())
    tw.all_reduce(t, group=g)  # the group still works
    np.testing.assert_allclose(t.numpy(), np.sum(every, axis=0), rtol=1e-6)
    tw.destroy_process_group(g)

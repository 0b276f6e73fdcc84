"""Ranks that take different paths to one all_reduce: some through the node's shared segment
(arrays of ``nodereduce.MIN_BYTES`` or more), some through MPI (a smaller array, an async call,
another call). Without the bell's marks each side waited for the other until the group's timeout,
and a first large call hung past it; now every rank raises the same ``ValueError`` at once.

The group's timeout is long (``LONG``): a rank that raised ``GroupTimeoutError``, or the runner's
timeout, is what a regression looks like; the sampled cross-rank check is kept from the bad call
(it would find a count mismatch first, see ``checks/signature.py``).
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from helpers import gathered

from mpidist.calls import nodereduce
from mpidist.core import bell

AT = nodereduce.MIN_BYTES // 4  # float32 elements at the threshold
LONG = timedelta(seconds=300)

pytestmark = pytest.mark.skipif(not nodereduce.ON, reason="MPIDIST_NODE_REDUCE=0: no shared segment")


def _group(dist, warm: bool):
    """A fresh group whose next call is not sampled by the cross-rank check; ``warm``: its
    segment already made (by a large sum that every rank makes alike)."""
    g = dist.new_group(timeout=LONG)
    dist.all_reduce(np.ones(1), group=g)  # the group's record of calls exists
    if warm:
        x = np.ones(AT, np.float32)
        dist.all_reduce(x, group=g)
        assert (x == g.size()).all()
    g.signatures.due = g.signatures.n + 10
    return g


def _entries(text: str) -> dict[int, str]:
    """Rank -> what the error says of it."""
    listed = text.split("through MPI): ", 1)[1].split("; the group is now broken", 1)[0]
    return {int(e.split(": ", 1)[0][5:]): e.split(": ", 1)[1] for e in listed.split("; rank ")
            for e in [e if e.startswith("rank ") else "rank " + e]}


def _expect_the_same_report(dist, g, outcome, sizes):
    """Every rank that sums through the segment raised one ValueError that names the call and each
    such rank's array. A rank on MPI's path raised the same, or (where MPI matched its call with a
    segment rank's own) returned and raises it at its next call on the group, told by a notice.
    Then every call on the group raises at once, and the world is whole."""
    bad = g.seq
    try:
        dist.all_reduce(np.ones(1), group=g)
        after = ("returned", "")
    except Exception as exc:  # noqa: BLE001 - the type is what the test checks
        after = (type(exc).__name__, str(exc))
    everyone = gathered(dist, (outcome, after))
    for r, ((kind, text), (kind_after, text_after)) in enumerate(everyone):
        if sizes[r] >= AT or kind != "returned":
            assert kind == "ValueError", everyone
            assert "broken" in text_after, everyone
        else:  # its MPI call completed: the next one raises what a peer found
            kind, text = kind_after, text_after
            assert kind == "ValueError", everyone
        assert f"#{bad} on group" in text and "different paths" in text, text
        said = _entries(text)
        assert sorted(said) == list(range(len(sizes))), text
        # each rank's own part as it was; a peer's as far as its mark was there to read
        assert ("summed in the node's shared memory" if sizes[r] >= AT else "through MPI") in said[r], text
        for k, n in enumerate(sizes):
            if n >= AT:
                assert said[k] in (f"{n} x float32 in all_reduce, summed in the node's shared memory",
                                   "not seen at this call yet (another call, or an array of another size, "
                                   "dtype or op)"), text
    y = np.full(3, dist.get_rank() + 1.0)
    dist.all_reduce(y)
    n = dist.get_world_size()
    assert (y == n * (n + 1) / 2).all()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("warm", [False, True], ids=["first-large-call", "segment-made"])
@pytest.mark.parametrize("large", ["rank-0", "all-but-last"])
def test_arrays_on_either_side_of_the_threshold_raise_on_every_rank(dist, rank, size, warm, large):
    if not bell.on():
        pytest.skip(f"no bell on this node ({bell.why_not}): no shared segment either")
    g = _group(dist, warm)
    sizes = [AT if (r == 0 if large == "rank-0" else r < size - 1) else AT - 1 for r in range(size)]
    try:
        dist.all_reduce(np.ones(sizes[rank], np.float32), group=g)
        outcome = ("returned", "")
    except Exception as exc:  # noqa: BLE001 - the type is what the test checks
        outcome = (type(exc).__name__, str(exc))
    _expect_the_same_report(dist, g, outcome, sizes)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("other", ["async_op", "broadcast"])
def test_a_large_sum_against_another_path_to_the_same_call_raises(dist, rank, size, other):
    """Rank 0 sums through the segment; the others come to the same call number through MPI: an
    async all_reduce of the same array (mpidist's async calls never take the segment), or another
    collective."""
    if not bell.on():
        pytest.skip(f"no bell on this node ({bell.why_not}): no shared segment either")
    g = _group(dist, True)
    x = np.ones(AT, np.float32)
    try:
        if rank == 0:
            dist.all_reduce(x, group=g)
        elif other == "async_op":
            dist.all_reduce(x, group=g, async_op=True).wait()
        else:
            dist.broadcast(np.ones(4), group_src=1, group=g)
        outcome = ("returned", "")
    except Exception as exc:  # noqa: BLE001 - the type is what the test checks
        outcome = (type(exc).__name__, str(exc))
    _expect_the_same_report(dist, g, outcome, [AT] + [0] * (size - 1))

"""A give-up's notices: straight to every peer in small groups; in large ones to ceil(log2 n)
neighbours a message, news passed on, silent ranks asked.

The rank graph is checked against a breadth-first search here; the exchange itself runs under
MPI, in both modes (the neighbours' forced on small groups by ``DIRECT_UP_TO = 0``), with ranks
that never enter the call, and every report is checked against the set of ranks that did.
"""

from __future__ import annotations

import math
import time
from datetime import timedelta

import numpy as np
import pytest
from helpers import assert_all_ranks_ok, still_works

from mpidist.core import groups, notices, ranklists, timeouts

LIMIT = 1.0
END_BY = LIMIT + 15.0  # the deadline plus the grace period, with room for an oversubscribed machine


def _hops(n: int, source: int, gone: frozenset[int] = frozenset()) -> dict[int, int]:
    """Breadth-first search from ``source`` over r -> r + 2**j (mod n), avoiding ``gone``."""
    seen, edge = {source: 0}, [source]
    while edge:
        nxt = []
        for r in edge:
            for j in range(n.bit_length()):
                d = (r + 2 ** j) % n
                if 2 ** j < n and d not in seen and d not in gone:
                    seen[d] = seen[r] + 1
                    nxt.append(d)
        edge = nxt
    return seen


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31, 32, 33, 64, 100])
def test_the_neighbours_reach_every_rank_within_log2_n_hops(n):
    hops = math.ceil(math.log2(n)) if n > 1 else 0
    for me in range(n):
        to = notices.neighbours(me, n)
        assert len(to) == len(set(to)) == hops and me not in to and all(0 <= r < n for r in to)
        reach = _hops(n, me)
        assert sorted(reach) == list(range(n)) and max(reach.values()) <= hops


@pytest.mark.parametrize("n", [3, 4, 5, 8, 9, 16, 33])
def test_one_silent_rank_cuts_no_other_rank_off(n):
    """A rank that never listens passes nothing on; every other pair still has a path."""
    for silent in range(n):
        for me in range(n):
            if me != silent:
                assert set(_hops(n, me, frozenset({silent}))) == set(range(n)) - {silent}


def test_two_silent_ranks_can_cut_a_rank_off_which_is_why_ranks_ask():
    """At 4 ranks with 2 and 3 silent, rank 1's news reaches rank 0 only by the direct ask."""
    assert 0 not in _hops(4, 1, frozenset({2, 3}))


@pytest.fixture(params=["direct", "neighbours"])
def mode(request, monkeypatch):
    """How notices travel; every rank runs the same parameter, so all agree on it."""
    if request.param == "neighbours":
        monkeypatch.setattr(notices, "DIRECT_UP_TO", 0)
    return request.param


def _silent_call(dist, rank, silent):
    """Every rank but ``silent`` waits in an all_reduce on a short-timeout group: the report."""
    g = dist.new_group(timeout=timedelta(seconds=LIMIT))
    report, took, sent = None, 0.0, None
    if rank not in silent:
        t0 = time.monotonic()
        with pytest.raises(dist.GroupTimeoutError) as info:
            dist.all_reduce(np.ones(2), group=g)
        took, report = time.monotonic() - t0, str(info.value)
        sent = dict(notices.LAST_GIVE_UP)
    return g, report, took, sent


def _gives_up(dist, g, silent: int, bad: list[str]) -> tuple[float, str] | None:
    """An all_reduce on ``g`` that must time out: (seconds it took, its report), the silent
    rank checked to be named; ``None`` (and a complaint in ``bad``) if it returned."""
    t0 = time.monotonic()
    try:
        dist.all_reduce(np.ones(2), group=g)
    except dist.GroupTimeoutError as exc:
        report = str(exc)
        if f"not heard from rank {silent} (" not in report:
            bad.append(f"silent rank misnamed: {report}")
        return time.monotonic() - t0, report
    bad.append("all_reduce returned")
    return None


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("count", [1, 2, "half"])
def test_every_waiting_rank_hears_of_exactly_the_ranks_that_waited(dist, rank, size, count, mode):
    """The report names as not heard from exactly the silent ranks, and every other one as
    heard from, in its call; each rank sends n - 1 messages when direct, and within the stated
    bound through neighbours."""
    k = max(1, size // 2) if count == "half" else count
    if k >= size:
        pytest.skip(f"{k} silent ranks need more than {size}")
    silent = set(range(size - k, size))
    g, report, took, sent = _silent_call(dist, rank, silent)
    bad = []
    if report is not None:
        hosts = groups.registry.hosts
        waited = sorted(set(range(size)) - silent - {rank})
        if f"not heard from {'ranks' if k > 1 else 'rank'} {ranklists.by_host(silent, hosts)}:" \
                not in report:
            bad.append(f"silent ranks misnamed: {report}")
        if waited and f"heard from {ranklists.plural(waited)} (all_reduce #1)" not in report:
            bad.append(f"waiting ranks misnamed: {report}")
        if not waited and "; heard from" in report:
            bad.append(f"heard from a silent rank: {report}")
        if not LIMIT - 0.1 <= took < END_BY:
            bad.append(f"gave up after {took:.2f} s")
        n, hops = size, math.ceil(math.log2(size))
        bound = hops * min(n, hops + 12) + (n - 1 - len(waited)) + len(waited)
        if mode == "direct" and sent["messages"] != n - 1:
            bad.append(f"sent {sent} directly, not {n - 1}")
        if mode == "neighbours" and not 1 <= sent["messages"] <= bound:
            bad.append(f"sent {sent}, bound {bound}")
    else:
        bad += [] if rank in silent else ["no report"]
    assert_all_ranks_ok(dist, bad)  # every rank fails together: none is left in a collective
    still_works(dist, size)


@pytest.mark.mpi(min_size=3)
def test_news_of_one_give_up_ends_every_waiting_rank(dist, rank, size, mode):
    """Only rank 0's deadline comes soon; the others' is far off, and rank 1 never enters the
    call. Through neighbours, from 4 ranks on, some waiting rank is not one of rank 0's (and
    rank 1, the one that would pass it on first, is silent), so it can only learn of the give-up
    from news another waiting rank passes on; every waiting rank gives up at once, long before
    its own deadline."""
    g = dist.new_group(timeout=timedelta(seconds=LIMIT))
    silent, far = 1, 60.0
    waiting = set(range(size)) - {0, silent}
    if size >= 4 and mode == "neighbours":
        assert waiting - set(notices.neighbours(0, size)), "the test would not need the news passed on"
    if rank in waiting:
        g.timeout = timedelta(seconds=far)  # this rank's own: the group agreed on LIMIT
    bad: list[str] = []
    if rank != silent and (got := _gives_up(dist, g, silent, bad)):
        took, report = got
        if rank > 0 and not ("gave up on all_reduce #1" in report and took < END_BY < far):
                bad.append(f"no news after {took:.2f} s: {report}")
    assert_all_ranks_ok(dist, bad)
    still_works(dist, size)


@pytest.mark.mpi(min_size=4)
def test_ranks_that_give_up_one_after_another_are_all_heard_of(dist, rank, size, mode, monkeypatch):
    """Ranks slow to be scheduled give up one after another, each within a grace period of
    the one before, the last more than a grace period after rank 0: rank 0 keeps listening
    while news comes, so every report names only the rank that never entered the call."""
    g_s = 1.0
    monkeypatch.setattr(timeouts, "grace", lambda limit: g_s)
    silent = size - 1
    step = 1.2 * g_s / (size - 2)  # the last waiting rank: 1.2 grace periods after rank 0
    assert step < g_s
    g = dist.new_group(timeout=timedelta(seconds=LIMIT))
    dist.barrier()
    bad: list[str] = []
    if rank != silent:
        time.sleep(0 if rank == 0 else LIMIT + rank * step)
    if rank != silent and (got := _gives_up(dist, g, silent, bad)):
        took, report = got
        waited = sorted(set(range(size)) - {silent, rank})
        if f"heard from {ranklists.plural(waited)} (all_reduce #1)" not in report:
            bad.append(f"a rank that waited is missing: {report}")
        if rank == 0 and not took < LIMIT + notices.MOST_GRACES * g_s + 1.0:
            bad.append(f"listened until {took:.2f} s")
    assert_all_ranks_ok(dist, bad)
    still_works(dist, size)

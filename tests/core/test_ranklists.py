"""Rank lists in reports stay short at any size: ranges, ranks by host, cut off past a few."""

from __future__ import annotations

from mpidist.core.ranklists import by_host, plural, ranges


def test_runs_become_ranges():
    assert ranges([5, 1, 2, 3, 7, 8, 9]) == "1–3, 5, 7–9"
    assert ranges([1, *range(2, 15), *range(16, 1024)]) == "1–14, 16–1023"
    assert ranges([]) == ""
    assert plural([4]) == "rank 4" and plural([1, 2]) == "ranks 1–2"


def test_past_a_few_runs_the_rest_is_a_count():
    assert ranges(range(0, 40, 2), most=3) == "0, 2, 4, … (17 more)"


def test_ranks_grouped_by_host_in_order_of_their_lowest_rank():
    hosts = ["b"] * 4 + ["a"] * 4
    assert by_host([6, 1, 7, 2], hosts) == "1–2 (b), 6–7 (a)"
    assert by_host([99], hosts) == "99 (?)"
    many = [f"n{r // 10}" for r in range(100)]
    assert by_host(range(100), many, most=2) == "0–9 (n0), 10–19 (n1), … (80 more on 8 more hosts)"


def test_a_report_at_1024_ranks_stays_short():
    hosts = [f"node{r // 64}" for r in range(1024)]
    silent = [15, 700]
    assert len(by_host(silent, hosts)) < 40
    assert len(ranges([r for r in range(1, 1024) if r not in silent])) < 40

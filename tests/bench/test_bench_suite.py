"""The benchmark suite (benchmarks/): its checks and its statistics.

The short real runs of ``benchmarks/run.py`` are in ``test_bench_suite_jobs.py``.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from launcher import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

from suite import cases, report, timing  # noqa: E402


@pytest.mark.mpi
@pytest.mark.parametrize("call", cases.CALLS)
@pytest.mark.parametrize("impl", ["mpidist", "mpi4py"])
def test_every_body_passes_its_check(dist, rank, size, call, impl):
    """Each implementation's operation produces what check() expects, at every world size."""
    from mpi4py.util import pkl5

    pg = dist.group.WORLD
    x = cases.Ctx(rank, size, dist, pg.comm, pkl5.Intracomm(pg.comm))
    if cases.supports(impl, call, x):
        pytest.skip(cases.supports(impl, call, x))
    b = cases.alloc(call, 24, rank, size)
    cases.fill(call, b, rank, size)
    body = cases.mpidist_body if impl == "mpidist" else cases.mpi4py_body
    fn_args = body(call, x, b)
    result = fn_args[0](*fn_args[1])
    assert cases.check(call, b, rank, size, cases.returned(call, fn_args, result, b))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("call", ["all_reduce", "all_gather_into_tensor", "all_to_all_single", "scatter"])
def test_check_catches_an_operation_that_did_not_run(dist, rank, size, call):
    b = cases.alloc(call, 16, rank, size)
    cases.fill(call, b, rank, size)
    assert not cases.check(call, b, rank, size, None)


def test_parse_size():
    import run

    assert [run.parse_size(s) for s in ("8", "64K", "64KiB", "1M", "16MiB", "1G")] == [
        8, 65536, 65536, 1 << 20, 16 << 20, 1 << 30]
    with pytest.raises(Exception, match="not a size"):
        run.parse_size("12 parsecs")


def test_paired_ratio_and_summary():
    a = [2.0, 4.0, 3.0, 100.0]
    b = [1.0, 2.0, 1.0, 50.0]
    assert timing.paired_ratio(a, b) == float(np.median(np.array(a) / np.array(b)))
    s = timing.summary([5.0, 1.0, 3.0])
    assert (s["median"], s["min"]) == (3.0, 1.0)


def test_goals_report_misses_and_passes():
    ratios = [
        {"call": "all_reduce", "bytes": 8, "mpidist/mpi4py": 1.5, "mpidist/c": 4.0, "gloo/mpidist": 50.0},
        {"call": "broadcast", "bytes": 8, "mpidist/mpi4py": 1.05, "mpidist/c": 6.0, "gloo/mpidist": 9.0},
        {"call": "all_gather_object", "bytes": 1 << 20, "gloo/mpidist": 0.8},
    ]
    gs = {g["goal"]: g for g in report.goals(ratios)}
    small = gs["mpidist/mpi4py <= 1.10 at 8 B"]
    assert small["measured"] == 2 and [m["call"] for m in small["missed"]] == ["all_reduce"]
    assert [m["call"] for m in gs["mpidist/C <= 5 at 8 B"]["missed"]] == ["broadcast"]
    assert [m["call"] for m in gs["gloo/mpidist >= 10 at <= 64 KiB (arrays)"]["missed"]] == ["broadcast"]
    objects = gs["objects faster than gloo's *_object at every size"]
    assert objects["measured"] == 1 and objects["missed"]
    assert gs["mpidist/mpi4py <= 1.02 at >= 1 MiB"]["measured"] == 0
    assert "MISSED" in report.goal_text(report.goals(ratios))

"""torch.profiler sees the mpidist backend: one ``mpidist:<call>`` record per call, as gloo's.

Every call runs under one profiler on a gloo group and on the mpidist default group in the
same job; the mpidist records must carry gloo's names and input shapes, the dtype, and the
group. Run under ``mpiexec -n {1,2,3,4} python -m pytest --only-mpi``.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'mpidist[torch]')")
tdist = pytest.importorskip("torch.distributed", reason="torch.distributed is not available")
if not tdist.is_gloo_available():
    pytest.skip("this torch has no gloo backend to compare with", allow_module_level=True)

from torch.profiler import ProfilerActivity, profile  # noqa: E402

_GLOO: list = []


@pytest.fixture
def gloo(tw):
    if not _GLOO:
        _GLOO.append(tw.new_group(backend="gloo"))
    return _GLOO[0]


def _cases(dist, n, r):
    """(label, call on group g): every collective torch.distributed has, one call each."""
    t = torch.ones(4)
    zeros = lambda k: [torch.zeros(4) for _ in range(k)]  # noqa: E731
    return [
        ("all_reduce", lambda g, a: dist.all_reduce(t, group=g, async_op=a)),
        ("all_reduce_coalesced", lambda g, a: dist.all_reduce_coalesced([t, torch.ones(2)], group=g,
                                                                        async_op=a)),
        ("broadcast", lambda g, a: dist.broadcast(t, 0, group=g, async_op=a)),
        ("reduce", lambda g, a: dist.reduce(t, 0, group=g, async_op=a)),
        ("all_gather", lambda g, a: dist.all_gather(zeros(n), t, group=g, async_op=a)),
        ("all_gather_coalesced", lambda g, a: dist.all_gather_coalesced(
            [[torch.zeros(3)] for _ in range(n)], [torch.ones(3)], group=g, async_op=a)),
        ("all_gather_into_tensor", lambda g, a: dist.all_gather_into_tensor(
            torch.zeros(5 * n), torch.ones(5), group=g, async_op=a)),
        ("reduce_scatter", lambda g, a: dist.reduce_scatter(
            torch.zeros(4), [torch.ones(4) for _ in range(n)], group=g, async_op=a)),
        ("reduce_scatter_tensor", lambda g, a: dist.reduce_scatter_tensor(
            torch.zeros(2), torch.ones(2 * n), group=g, async_op=a)),
        ("gather", lambda g, a: dist.gather(t, zeros(n) if r == 0 else None, 0, group=g, async_op=a)),
        ("scatter", lambda g, a: dist.scatter(t, zeros(n) if r == 0 else None, 0, group=g, async_op=a)),
        ("all_to_all", lambda g, a: dist.all_to_all(zeros(n), [torch.ones(4) for _ in range(n)], group=g,
                                                    async_op=a)),
        ("all_to_all_single", lambda g, a: dist.all_to_all_single(
            torch.zeros(3 * n), torch.ones(3 * n), group=g, async_op=a)),
        ("barrier", lambda g, a: dist.barrier(group=g, async_op=a)),
    ]


def _records(prof, prefix):
    return [(e.name[len(prefix):], e.input_shapes) for e in prof.events() if e.name.startswith(prefix)]


def _profiled(fn, g, async_op):
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        work = fn(g, async_op)
        if async_op and work is not None:
            work.wait()
    return prof


@pytest.mark.mpi
@pytest.mark.parametrize("async_op", [False, True])
def test_each_call_is_one_record_with_gloos_name_and_shapes(tw, gloo, async_op):
    n, r = tw.get_world_size(), tw.get_rank()
    for label, fn in _cases(tw, n, r):
        theirs = _records(_profiled(fn, gloo, async_op), "gloo:")
        mine = _records(_profiled(fn, None, async_op), "mpidist:")
        if label.startswith("reduce_scatter"):
            # gloo records the all_reduce it builds reduce_scatter on; mpidist the call and its input
            want = [("reduce_scatter", [[4]] * n if label == "reduce_scatter" else [[2 * n]])]
            assert mine == want, (label, mine)
        else:
            assert mine == theirs, (label, mine, theirs)


@pytest.mark.mpi(min_size=2)
def test_send_and_recv_are_recorded_as_gloo_records_them(tw, gloo):
    r = tw.get_rank()
    got = {}
    for g, prefix in ((gloo, "gloo:"), (None, "mpidist:")):
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            if r == 0:
                tw.send(torch.ones(6, dtype=torch.float64), 1, group=g)
                tw.send(torch.ones(2), 1, group=g)
            elif r == 1:
                tw.recv(torch.zeros(6, dtype=torch.float64), 0, group=g)
                tw.recv(torch.zeros(2), group=g)
        got[prefix] = _records(prof, prefix)
    want = {0: [("send", [[6]]), ("send", [[2]])], 1: [("recv", [[6]]), ("recvAnySource", [[2]])]}.get(r, [])
    assert got["mpidist:"] == got["gloo:"] == want, got


@pytest.mark.mpi
def test_record_names_the_dtype_and_the_group(tw, tmp_path):
    me, n = tw.get_rank(), tw.get_world_size()
    sub = tw.new_group([0]) if n == 1 else tw.new_group(list(range(1, n)))
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        tw.all_reduce(torch.ones(3, 2, dtype=torch.float64))
        if me >= min(1, n - 1):
            tw.broadcast(torch.ones(7, dtype=torch.int32), src=min(1, n - 1), group=sub)
    path = tmp_path / f"trace{me}.json"
    prof.export_chrome_trace(str(path))
    events = [e for e in json.loads(path.read_text())["traceEvents"]
              if e.get("name", "").startswith("mpidist:")]
    ar = [e["args"] for e in events if e["name"] == "mpidist:all_reduce"]
    assert len(ar) == 1
    world = tw.group.WORLD
    assert ar[0]["Input Dims"] == [[3, 2]] and ar[0]["Input type"] == ["double"]
    assert (ar[0]["group_name"], ar[0]["group_size"]) == (world.group_name, n)
    assert ar[0]["group_desc"] == "default_pg"
    assert ar[0]["group_ranks"] == str(list(range(n)))
    bc = [e["args"] for e in events if e["name"] == "mpidist:broadcast"]
    if me >= min(1, n - 1):
        assert len(bc) == 1
        assert bc[0]["Input Dims"] == [[7]] and bc[0]["Input type"] == ["int"]
        assert bc[0]["group_name"] == sub.group_name and bc[0]["group_size"] == sub.size()
    else:
        assert bc == []


@pytest.mark.mpi
def test_no_record_without_the_profiler_and_nested_calls_record_once(tw):
    t = torch.ones(2)
    tw.all_reduce(t)  # profiler off: nothing to see, and the call still works
    assert t[0] == tw.get_world_size()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        tw.all_reduce_coalesced([torch.ones(2), torch.ones(3)])  # coalesced calls allreduce inside
    assert [e.name for e in prof.events() if e.name.startswith("mpidist:")] == ["mpidist:all_reduce"]

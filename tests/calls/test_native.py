"""The C calls (mpidist/calls/_native.c): on where they can be, and the same results, errors
and timeouts as mpi4py's path, which they replace for blocking all_reduce, broadcast and barrier."""

from __future__ import annotations

import time
from datetime import timedelta

import numpy as np
import pytest
from helpers import gathered, rank_data, still_works
from mpi4py import MPI

from mpidist.calls import native
from mpidist.checks import signature
from mpidist.core import timeouts
from mpidist.core.buffers import AS_IS

try:
    from mpidist.calls import _native
except ImportError:
    _native = None

built = pytest.mark.skipif(_native is None,
                           reason="the C calls are not built (no compiler at install)")


def taken(result, g, t) -> bool:
    """Whether the C path took the call: ``None`` (done there) or a pending request's handle,
    which the bounded wait then completes (a rank that came before its peers does not spin for
    them where the node's bell serves the group, :mod:`mpidist.core.bell`)."""
    if isinstance(result, int):
        timeouts.wait_pending(result, g, "all_reduce", t)
        return True
    return result is None


PATHS = ("all_reduce", "allreduce", "bcast", "barrier")


@pytest.fixture(params=["C", "C call", "mpi4py"])
def path(request):
    """Each test through the C calls (where built): the whole all_reduce in C ("C"), or only its
    MPI call and spin with the checks in Python ("C call"); and through mpi4py's."""
    kept = {name: getattr(native, name) for name in PATHS}
    if request.param != "mpi4py" and kept["allreduce"] is None:
        pytest.skip(f"the C calls are off: {native.why_not}")
    if request.param == "C" and kept["all_reduce"] is None:
        pytest.skip(f"all_reduce's checks are not in C: {native.why_not}")
    if request.param == "C call":
        native.all_reduce = None
    if request.param == "mpi4py":
        for name in PATHS:
            setattr(native, name, None)
    yield request.param
    for name, fn in kept.items():
        setattr(native, name, fn)


def only_all_reduce(path):
    """"C" and "C call" differ for all_reduce alone."""
    if path == "C call":
        pytest.skip("the same path as 'C' for this call")


@built
def test_on_for_the_mpis_the_project_runs_on():
    """The project's MPIs (the mpich wheel, Open MPI) have a known handle ABI: the C path runs."""
    abi = native.handle_abi(__import__("ctypes").CDLL(MPI.__file__))
    assert abi in ("mpich", "openmpi"), abi
    if native.ALLOWED:
        assert native.allreduce is not None, native.why_not


def test_turned_off_and_on_again():
    kept = {name: getattr(native, name) for name in PATHS}
    check = signature.IN_C
    try:
        assert native.enable(False) == "turned off (MPIDIST_NATIVE=0)"
        assert all(getattr(native, name) is None for name in PATHS) and signature.IN_C is None
        assert native.enable(True) == native.why_not
        off = _native is None or bool(native.why_not)
        assert all((getattr(native, name) is None) == off for name in PATHS)
        assert (signature.IN_C is None) == off
    finally:
        for name, fn in kept.items():
            setattr(native, name, fn)
        signature.IN_C = check


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "int32", "int64", "float32", "float64",
                                   "complex128"])
@pytest.mark.parametrize("op", ["SUM", "MAX", "AVG", "BOR"])
@pytest.mark.parametrize("n", [1, 3, 1000])
def test_results_match_numpy_on_the_gathered_inputs(dist, rank, size, path, dtype, op, n):
    kind = np.dtype(dtype).kind
    if ((op == "AVG" and kind not in "fc") or (op == "BOR" and kind not in "biu")
            or (op == "MAX" and kind == "c")):
        pytest.skip("not a valid pairing (tests/calls/test_reduce_ops.py checks those raise)")
    t = rank_data(rank, n, dtype, seed=n)
    inputs = [rank_data(r, n, dtype, seed=n) for r in range(size)]
    ident = id(t)
    assert dist.all_reduce(t, getattr(dist.ReduceOp, op)) is None
    if op == "SUM":
        want = np.logical_or.reduce(inputs) if kind == "b" else np.sum(inputs, axis=0, dtype=dtype)
    elif op == "MAX":
        want = np.max(inputs, axis=0)
    elif op == "AVG":
        want = np.sum(inputs, axis=0, dtype=dtype) / size
    else:
        want = np.bitwise_or.reduce(inputs)
    assert id(t) == ident and t.dtype == np.dtype(dtype) and t.shape == (n,)
    if kind in "fc":
        np.testing.assert_allclose(t, want, rtol=1e-6 if dtype != "float32" else 1e-5)
    else:
        np.testing.assert_array_equal(t, want)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("shape", [(), (2, 3), (4, 1, 2)])
def test_any_c_contiguous_shape_and_views_in_place(dist, rank, size, path, shape):
    t = np.full(shape, rank + 1.0)
    dist.all_reduce(t)
    assert t.shape == shape and np.all(t == size * (size + 1) / 2)
    whole = np.zeros(10)
    part = whole[2:5]  # a contiguous view: the parent sees the result
    part[:] = rank
    dist.all_reduce(part, dist.ReduceOp.MAX)
    assert list(whole) == [0, 0] + [size - 1] * 3 + [0] * 5


@pytest.mark.mpi(min_size=1)
def test_strided_and_read_only_arrays_go_the_checked_way(dist, rank, size, path):
    strided = np.arange(8.0)[::2]
    with pytest.raises((ValueError, TypeError), match="contiguous"):
        dist.all_reduce(strided)
    ro = np.ones(3)
    ro.flags.writeable = False
    with pytest.raises((ValueError, TypeError), match="writ"):
        dist.all_reduce(ro)
    still_works(dist, size)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", ["bool", "int16", "float32", "complex64"])
@pytest.mark.parametrize("n", [1, 5, 4096])
def test_broadcast_gives_every_rank_the_roots_array(dist, rank, size, path, dtype, n):
    only_all_reduce(path)
    for root in sorted({0, size - 1}):
        t = rank_data(rank, n, dtype, seed=root)
        if rank == root:
            t.flags.writeable = False  # the root only sends: a read-only array is fine there
        else:
            t = np.zeros(n, dtype)
        dist.broadcast(t, src=root)
        np.testing.assert_array_equal(t, rank_data(root, n, dtype, seed=root))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("how", ["all_reduce", "broadcast", "barrier"])
def test_a_late_rank_leaves_the_others_waiting_in_python_after_the_spin(dist, rank, size, path, how):
    """Past the C spin (at most 10 ms) the request goes back to the bounded wait in Python."""
    if how != "all_reduce":
        only_all_reduce(path)
    for late in (0, size - 1):
        t = np.array([float(rank)])
        if rank == late:
            time.sleep(0.2)
        t0 = time.monotonic()
        if how == "all_reduce":
            dist.all_reduce(t)
            assert t[0] == size * (size - 1) / 2
        elif how == "broadcast":
            dist.broadcast(t, src=late)
            assert t[0] == late
        else:
            dist.barrier()
        took = time.monotonic() - t0
        if rank != late:  # the late rank is the broadcast's root: the receivers wait for it
            assert took > 0.05, took
    still_works(dist, size)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("how", ["all_reduce", "broadcast", "barrier"])
def test_a_missing_rank_still_raises_at_the_group_timeout(dist, rank, size, path, how):
    if how != "all_reduce":
        only_all_reduce(path)
    g = dist.new_group(timeout=timedelta(seconds=1.0))
    late = size - 1
    text = None
    if rank != late:
        t0 = time.monotonic()
        with pytest.raises(dist.GroupTimeoutError) as info:
            if how == "all_reduce":
                dist.all_reduce(np.ones(2), group=g)
            elif how == "broadcast":
                dist.broadcast(np.ones(2), src=late, group=g)
            else:
                dist.barrier(group=g)
        took = time.monotonic() - t0
        text = str(info.value)
        assert 0.9 <= took < 16.0, took
        assert f"not heard from rank {late} (" in text and f"{how} #1 on group {g.group_name!r}" in text
    texts = gathered(dist, text)
    assert all(tx is not None for tx in texts[:late])
    still_works(dist, size)


@built
@pytest.mark.mpi(min_size=1)
def test_an_mpi_error_raises_mpi_exception_on_every_rank(dist, rank, size):
    """A bitwise op on float64 is refused by MPI where the call starts, on every rank alike."""
    if native.allreduce is None:
        pytest.skip(f"the C calls are off: {native.why_not}")
    d = AS_IS[np.dtype(np.float64)]
    comm = dist.group.WORLD.comm.Dup()
    try:
        with pytest.raises(MPI.Exception) as info:
            native.allreduce(np.ones(2), d.handle, d.extent, MPI._handleof(MPI.BAND), MPI._handleof(comm))
        assert info.value.Get_error_class() == MPI.ERR_OP
    finally:
        comm.Free()
    still_works(dist, size)


@built
@pytest.mark.mpi(min_size=1)
def test_bad_arguments_to_the_module_raise_and_call_nothing(dist, size):
    if native.allreduce is None:
        pytest.skip(f"the C calls are off: {native.why_not}")
    d = AS_IS[np.dtype(np.float64)]
    h, op = dist.group.WORLD.handle, MPI._handleof(MPI.SUM)
    with pytest.raises(TypeError, match=r"allreduce\(buf, datatype, extent, op, comm\)"):
        native.allreduce(np.ones(1), d.handle, d.extent, op)
    ro = np.ones(1)
    ro.flags.writeable = False
    with pytest.raises((BufferError, ValueError)):
        native.allreduce(ro, d.handle, d.extent, op, h)
    with pytest.raises((BufferError, ValueError)):
        native.allreduce(np.arange(8.0)[::2], d.handle, d.extent, op, h)
    with pytest.raises(ValueError, match="whole number of elements"):
        native.allreduce(np.ones(3, np.uint8), d.handle, d.extent, op, h)
    with pytest.raises(ValueError, match="extent must be positive"):
        native.allreduce(np.ones(1), d.handle, 0, op, h)
    with pytest.raises(TypeError, match=r"bcast\(buf, datatype, extent, root, comm, writable\) takes 6"):
        native.bcast(np.ones(1), d.handle, d.extent, 0, h)
    with pytest.raises(ValueError, match="root must be a rank"):
        native.bcast(np.ones(1), d.handle, d.extent, -1, h, True)
    with pytest.raises((BufferError, ValueError)):  # a receiver's buffer must be writable
        native.bcast(ro, d.handle, d.extent, 0, h, True)
    with pytest.raises(TypeError, match=r"barrier\(comm\) takes 1"):
        native.barrier()
    still_works(dist, size)


@built
def test_the_module_links_no_mpi_and_only_the_c_library_of_2014():
    """Built without an MPI header and linked to no MPI: one wheel serves MPICH's and Open MPI's
    ABIs, and the routines come from the library mpi4py loaded."""
    import re
    import shutil
    import subprocess

    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf is not installed (binutils)")
    dynamic = subprocess.run([readelf, "-d", "-W", "--dyn-syms", _native.__file__], check=True,
                             capture_output=True, text=True).stdout
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic))
    assert needed <= {"libc.so.6", "libpthread.so.0"}, needed
    assert "MPI_" not in dynamic, "the module must not refer to MPI symbols by name"
    versions = {tuple(map(int, v.split("."))) for v in re.findall(r"@GLIBC_([\d.]+)", dynamic)}
    assert all(v <= (2, 17) for v in versions), versions


def whole_in_c():
    if native.all_reduce is None:
        pytest.skip(f"all_reduce's checks are not in C: {native.why_not or 'the C calls are off'}")


def past_first_checks(dist, g, n=2):
    """Calls on ``g`` until its next cross-rank check is some calls away (the C path then takes them)."""
    for _ in range(signature.FIRST + 1):
        dist.all_reduce(np.ones(n), group=g)


def state(g):
    rec = g.signatures
    return g.seq, rec.n, rec.due, list(rec.sigs), set(rec.seen)


@pytest.mark.mpi(min_size=2)
def test_the_whole_call_in_c_counts_and_records_as_python_does(dist, rank, size):
    """The same calls on two groups, one through the C path and one through Python's, leave the
    same call count and cross-rank record; the C path took them (it returns None, not
    NotImplemented), and the periodic check between them passed."""
    whole_in_c()
    kept = native.all_reduce
    groups = {}
    for how in ("C", "Python"):
        g = groups[how] = dist.new_group()
        native.all_reduce = kept if how == "C" else None
        try:
            past_first_checks(dist, g)
            for k in range(signature.EVERY + 5):
                t = rank_data(rank, 1 + k % 3, np.float64, seed=k)
                dist.all_reduce(t, dist.ReduceOp.MAX if k % 2 else dist.ReduceOp.SUM, group=g)
                want = [rank_data(r, 1 + k % 3, np.float64, seed=k) for r in range(size)]
                np.testing.assert_allclose(t, np.max(want, 0) if k % 2 else np.sum(want, 0))
        finally:
            native.all_reduce = kept
    assert state(groups["C"]) == state(groups["Python"])
    g = groups["C"]
    seq, n = g.seq, g.signatures.n
    t = np.full(4, float(rank))
    assert taken(native.all_reduce(t, dist.ReduceOp.SUM, g, True), g, t)
    assert list(t) == [size * (size - 1) / 2] * 4
    assert (g.seq, g.signatures.n) == (seq + 1, n + 1)
    assert g.signatures.sigs[-1] == ("all_reduce", 4, "float64", "SUM")
    assert taken(native.all_reduce(t, dist.ReduceOp.SUM, g, False), g, t)  # the check off: counted only
    assert (g.seq, g.signatures.n) == (seq + 2, n + 1)
    for g in groups.values():
        dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_off_the_common_case_the_c_path_does_nothing(dist, rank, size):
    """Whatever is not the common case comes back NotImplemented with nothing counted, recorded or
    sent: the Python path then takes the call, and converts, refuses or stages it."""
    whole_in_c()
    g = dist.new_group()
    past_first_checks(dist, g)
    add = dist.ReduceOp.SUM

    class Sub(np.ndarray):
        pass

    ro = np.ones(2)
    ro.flags.writeable = False
    cases = {
        "a list": ([1.0, 2.0], add, g),
        "an ndarray subclass": (np.ones(2).view(Sub), add, g),
        "read-only": (ro, add, g),
        "strided": (np.ones(4)[::2], add, g),
        "float16 (reduced by mpidist)": (np.ones(2, np.float16), add, g),
        "a dtype MPI does not move": (np.array(["a"]), add, g),
        "AVG (a divide after)": (np.ones(2), dist.ReduceOp.AVG, g),
        "PREMUL_SUM": (np.ones(2), dist.make_premul_sum(2.0), g),
        "an op that is not a ReduceOp": (np.ones(2), "SUM", g),
        "not a group": (np.ones(2), add, None),
    }
    before = state(g)
    for what, (t, op, grp) in cases.items():
        for sign in (True, False):
            assert native.all_reduce(t, op, grp, sign) is NotImplemented, what
            assert state(g) == before, what
    g.signatures.due = g.signatures.n + 1  # the check is due: C calls it, then the routine
    t = np.full(2, float(rank))
    assert taken(native.all_reduce(t, add, g, True), g, t)
    assert list(t) == [size * (size - 1) / 2] * 2
    assert (g.signatures.due, g.signatures.sigs) == (g.signatures.n + signature.EVERY, [])
    one = np.ones(2)
    assert taken(native.all_reduce(one, add, g, False), g, one)  # without the check, it runs
    before = state(g)
    keep = g.persistent
    g.persistent = {"a request": None}  # a group with persistent requests: persistent.py's path
    try:
        assert native.all_reduce(np.ones(2), add, g, True) is NotImplemented
    finally:
        g.persistent = keep
    fresh = dist.new_group()  # no record yet: its first calls are checked in Python
    assert native.all_reduce(np.ones(2), add, fresh, True) is NotImplemented
    dist.destroy_process_group(fresh)  # a destroyed group: Python raises
    assert native.all_reduce(np.ones(2), add, fresh, False) is NotImplemented
    with pytest.raises(TypeError, match="takes 4 arguments"):
        native.all_reduce(np.ones(2), add, g)
    dist.destroy_process_group(g)
    still_works(dist, size)


@pytest.mark.mpi(min_size=2)
def test_ranks_on_different_paths_agree_and_a_mismatch_is_still_named(dist, rank, size):
    """Each rank may choose its path alone: rank 0 in Python, the others in C make the same MPI
    calls and the same records. An op one rank gets wrong in an unchecked call (recorded in C) is
    named at the next check, on every rank. (An op, not a count: MPI completes a reduction whose
    ranks disagree on the op, while one whose counts differ may hang under Open MPI.)"""
    whole_in_c()
    kept = native.all_reduce
    if rank == 0:
        native.all_reduce = None
    try:
        g = dist.new_group()
        past_first_checks(dist, g)
        for _ in range(2 * signature.EVERY):
            t = np.full(3, 1.0)
            dist.all_reduce(t, group=g)
            assert list(t) == [float(size)] * 3
        bad_seq = g.seq + 1
        got = None
        try:
            dist.all_reduce(np.ones(2), dist.ReduceOp.MAX if rank == size - 1 else dist.ReduceOp.SUM,
                            group=g)
            for _ in range(signature.EVERY + 1):
                dist.all_reduce(np.ones(2), group=g)
        except ValueError as exc:
            got = str(exc)
    finally:
        native.all_reduce = kept
    texts = gathered(dist, got)
    assert None not in texts and len(set(texts)) == 1, texts
    assert f"all_reduce #{bad_seq} on group" in texts[0] and "'op'" in texts[0], texts[0]
    assert f"rank {size - 1} passed MAX" in texts[0], texts[0]
    dist.destroy_process_group(g)
    still_works(dist, size)


@built
def test_bind_refuses_a_class_whose_fields_are_not_slots():
    from mpidist.calls.ops import Plan, ReduceOp
    from mpidist.checks.signature import Record
    from mpidist.core.buffers import AS_IS, DType

    class Loose:  # no __slots__: its fields live in a dict, with no offset
        name = factor = plans = None

    with pytest.raises(TypeError, match=r"Loose\.name is not a __slots__ member"):
        _native.bind(np.ndarray, Loose, object, Record, DType, Plan, AS_IS, "all_reduce",
                     (0, 2, 4, 5), (1, 2, 3, 4))
    t = np.ones(1)
    assert _native.all_reduce(t, ReduceOp.SUM, object(), False) is NotImplemented  # off until bound
    native.bind(_native)  # and binds again to the real classes
    t = np.ones(1)
    assert _native.all_reduce(t, ReduceOp.SUM, None, False) is NotImplemented


def python_frames(run):
    """The names of mpidist's Python functions that ``run()`` calls (``sys.setprofile``): an Entry
    that takes the call in C runs none, or only ``_waited``, the bounded wait of a request the C
    call left pending (whose own frames are not listed): a rank that comes first sleeps there
    instead of spinning in C (the node's bell), and a loaded machine can outlast the C spin."""
    import os
    import sys

    import mpidist
    home = os.path.dirname(mpidist.__file__)
    names = []

    def profile(frame, event, arg):
        where = frame.f_code.co_filename
        if event == "call" and (where.startswith(home) or where.startswith("<mpidist")) \
                and "_waited" not in names:
            names.append(frame.f_code.co_name)
    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return names


@built
def test_all_reduce_is_an_entry_with_the_python_functions_face():
    """mpidist.all_reduce is the C Entry; inspect, help and Sphinx see the Python function."""
    import inspect

    import mpidist
    from mpidist.calls import collectives
    e = mpidist.all_reduce
    assert type(e).__name__ == "Entry" and e is collectives.all_reduce
    fn = e.__wrapped__
    assert inspect.signature(e) == inspect.signature(fn)
    assert list(inspect.signature(e).parameters) == ["tensor", "op", "group", "async_op"]
    assert (e.__name__, e.__qualname__, e.__module__) == ("all_reduce", "all_reduce", fn.__module__)
    assert e.__doc__ == fn.__doc__ and "MPI_Allreduce" in e.__doc__ and e.call is fn.call
    assert inspect.isroutine(e) and "all_reduce" in repr(e)


@built
@pytest.mark.mpi(min_size=2)
def test_the_entry_takes_torchs_arguments_every_way_in_c(dist, rank, size):
    """Every spelling of a blocking call in the common case is taken in C (no Python frame), and
    counted and recorded as one call; the result is numpy's on the gathered inputs."""
    whole_in_c()
    g = dist.new_group()
    past_first_checks(dist, g)
    world = dist.group.WORLD
    past_first_checks(dist, world)
    add, most = dist.ReduceOp.SUM, dist.ReduceOp.MAX
    forms = {
        "(t)": (lambda t: dist.all_reduce(t), add, world),
        "(t, op)": (lambda t: dist.all_reduce(t, most), most, world),
        "(t, op, None)": (lambda t: dist.all_reduce(t, add, None), add, world),
        "(t, op, g, False)": (lambda t: dist.all_reduce(t, most, g, False), most, g),
        "(t, op=, group=)": (lambda t: dist.all_reduce(t, op=most, group=g), most, g),
        "(tensor=)": (lambda t: dist.all_reduce(tensor=t), add, world),
        "(t, group=, async_op=False)": (lambda t: dist.all_reduce(t, group=g, async_op=False), add, g),
        "(group=, tensor=, op=)": (lambda t: dist.all_reduce(group=g, tensor=t, op=add), add, g),
    }
    for k, (what, (run, op, grp)) in enumerate(forms.items()):
        grp.signatures.due = grp.signatures.n + 3  # never due here: the count below is exact
        t = rank_data(rank, 3, np.float64, seed=k)
        seq, n = grp.seq, grp.signatures.n
        assert python_frames(lambda run=run, t=t: run(t)) in ([], ["_waited"]), what
        want = np.stack([rank_data(r, 3, np.float64, seed=k) for r in range(size)])
        np.testing.assert_allclose(t, want.max(0) if op is most else want.sum(0), err_msg=what)
        assert (grp.seq, grp.signatures.n) == (seq + 1, n + 1), what
    g.signatures.due = g.signatures.n + 1  # a due check runs in C too
    t = np.full(2, float(rank))
    frames = python_frames(lambda: dist.all_reduce(t, group=g))
    assert "check" in frames and "all_reduce" not in frames, frames
    assert list(t) == [size * (size - 1) / 2] * 2 and g.signatures.sigs == []
    dist.destroy_process_group(g)
    still_works(dist, size)


@built
@pytest.mark.mpi(min_size=2)
def test_the_entry_hands_everything_else_to_the_python_function(dist, rank, size, monkeypatch):
    """async_op, a debug hook, persistent requests, the C path off, and bad arguments go to the
    Python function with the arguments as given: the same result, Work or TypeError."""
    from mpidist.calls import collectives, persistent
    from mpidist.core import registry
    whole_in_c()
    fn = collectives.all_reduce.__wrapped__
    g = dist.new_group()
    past_first_checks(dist, g)
    want = [size * (size - 1) / 2] * 2

    t = np.full(2, float(rank))
    work = []
    assert "all_reduce" in python_frames(lambda: work.append(dist.all_reduce(t, group=g, async_op=True)))
    work[0].wait()
    assert list(t) == want
    seen = []
    registry.set_hook("test", lambda call, body, a: (seen.append(call.name), body(**a))[1])
    try:
        t = np.full(2, float(rank))
        dist.all_reduce(t, group=g)
    finally:
        registry.set_hook("test", None)
    assert seen == ["all_reduce"] and list(t) == want
    kept = native.all_reduce
    native.all_reduce = None
    try:
        t = np.full(2, float(rank))
        assert "all_reduce" in python_frames(lambda: dist.all_reduce(t, group=g))
    finally:
        native.all_reduce = kept
    assert list(t) == want
    monkeypatch.setattr(persistent, "ON", True)
    t = np.full(2, float(rank))
    assert "all_reduce" in python_frames(lambda: dist.all_reduce(t, group=g))
    assert list(t) == want
    monkeypatch.setattr(persistent, "ON", False)
    t = np.full(2, float(rank))
    bad = {
        "no tensor": ((), {}),
        "an unknown keyword": ((t,), {"grp": g}),
        "a tensor given twice": ((t,), {"tensor": t}),
        "five arguments": ((t, None, g, False, 1), {}),
    }
    for what, (args, kwargs) in bad.items():
        with pytest.raises(TypeError) as python:
            fn(*args, **kwargs)
        with pytest.raises(TypeError) as entry:
            dist.all_reduce(*args, **kwargs)
        assert str(entry.value) == str(python.value), what
    dist.destroy_process_group(g)
    still_works(dist, size)


@built
@pytest.mark.mpi(min_size=2)
def test_an_mpi_error_in_the_entry_raises_mpidists_error(dist, rank, size):
    """The routine's MPI error, on the C path, becomes mpidist's error naming the call, and the
    group goes on working. (MPICH: a null communicator's error returns; Open MPI's may abort.)"""
    whole_in_c()
    if native.handle_abi(__import__("ctypes").CDLL(MPI.__file__)) != "mpich":
        pytest.skip("Open MPI's null-communicator error is fatal, not returned")
    from mpidist.core.errors import MPICallError
    g = dist.new_group()
    past_first_checks(dist, g)
    kept = g.handle
    g.handle = MPI._handleof(MPI.COMM_NULL)
    try:
        with pytest.raises(MPICallError, match=r"all_reduce #\d+ on group .*Invalid communicator"):
            dist.all_reduce(np.ones(2), group=g)
    finally:
        g.handle = kept
    t = np.full(2, float(rank))
    dist.all_reduce(t, group=g)
    assert list(t) == [size * (size - 1) / 2] * 2
    dist.destroy_process_group(g)
    still_works(dist, size)


@built
def test_the_wait_after_the_entry_counts_as_all_reduce_for_the_watchers(monkeypatch):
    """What the Entry hands back to Python (a pending request's wait) is named all_reduce, with its
    group, on a sampled stack (the stall watch, the exit watch), as the Python function's frames."""
    import sys

    from mpidist.calls import collectives
    from mpidist.core import registry, timeouts
    frames = []
    monkeypatch.setattr(timeouts, "wait_pending", lambda *a: frames.append(sys._getframe(1)))
    group = object()
    collectives._waited(0, group, None)
    call, frame = registry.outermost_call(frames[0])
    assert call is collectives.all_reduce.call and frame.f_locals[call.group_arg] is group

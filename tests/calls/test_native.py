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
from mpidist.core.buffers import AS_IS

try:
    from mpidist.calls import _native
except ImportError:
    _native = None

built = pytest.mark.skipif(_native is None,
                           reason="the C calls are not built (no compiler at install)")


@pytest.fixture(params=["C", "mpi4py"])
def path(request):
    """Each test twice: through the C calls (where built) and through mpi4py's."""
    kept = native.allreduce, native.bcast, native.barrier
    if request.param == "C" and kept[0] is None:
        pytest.skip(f"the C calls are off: {native.why_not}")
    if request.param == "mpi4py":
        native.allreduce = native.bcast = native.barrier = None
    yield request.param
    native.allreduce, native.bcast, native.barrier = kept


@built
def test_on_for_the_mpis_the_project_runs_on():
    """The project's MPIs (the mpich wheel, Open MPI) have a known handle ABI: the C path runs."""
    abi = native.handle_abi(__import__("ctypes").CDLL(MPI.__file__))
    assert abi in ("mpich", "openmpi"), abi
    if native.ALLOWED:
        assert native.allreduce is not None, native.why_not


def test_turned_off_and_on_again():
    kept = native.allreduce, native.bcast, native.barrier
    try:
        assert native.enable(False) == "turned off (MPIDIST_NATIVE=0)"
        assert native.allreduce is native.bcast is native.barrier is None
        assert native.enable(True) == native.why_not
        off = _native is None or bool(native.why_not)
        assert all((f is None) == off for f in (native.allreduce, native.bcast, native.barrier))
    finally:
        native.allreduce, native.bcast, native.barrier = kept


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

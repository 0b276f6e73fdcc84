"""Buffers: every numpy dtype moves bit-exactly, results land in the caller's memory, bad inputs raise."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from helpers import rank_data, still_works

ALL_DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
              np.float16, np.float32, np.float64, np.longdouble, np.complex64, np.complex128,
              ml_dtypes.bfloat16]


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_moves_bit_exactly(dist, rank, size, dtype):
    src = size - 1
    t = rank_data(rank, (2, 3), dtype, seed=5)
    dist.broadcast(t, src=src)
    assert t.dtype == np.dtype(dtype) and t.shape == (2, 3)
    out = np.zeros((size, 2, 3), dtype)
    dist.all_gather_into_tensor(out, rank_data(rank, (2, 3), dtype, seed=6))
    want = np.stack([rank_data(r, (2, 3), dtype, seed=6) for r in range(size)])
    if np.dtype(dtype) == np.longdouble:  # x87 80-bit values in 16 bytes: only the value bytes move
        np.testing.assert_array_equal(t, rank_data(src, (2, 3), dtype, seed=5))
        np.testing.assert_array_equal(out, want)
    else:
        assert t.tobytes() == rank_data(src, (2, 3), dtype, seed=5).tobytes()
        assert out.tobytes() == want.tobytes()


@pytest.mark.mpi
def test_results_land_in_the_callers_memory(dist, rank, size):
    base = np.zeros(10)
    view = base[2:6]  # a contiguous view with an offset into a larger array
    view[:] = rank + 1
    dist.all_reduce(view)
    total = sum(range(1, size + 1))
    np.testing.assert_array_equal(base, np.r_[np.zeros(2), np.full(4, total), np.zeros(4)])
    fortran_1d = np.asfortranarray(np.full(3, 1.0))  # 1-D: C- and F-contiguous alike
    dist.all_reduce(fortran_1d)
    np.testing.assert_array_equal(fortran_1d, np.full(3, float(size)))


@pytest.mark.mpi
def test_numpy_subclass_is_accepted(dist, rank, size):
    m = np.ma.MaskedArray(np.full(3, rank + 1.0))
    dist.all_reduce(m)
    np.testing.assert_array_equal(np.asarray(m), np.full(3, float(sum(range(1, size + 1)))))


NOT_CONTIGUOUS = {
    "strided": lambda: np.zeros(8)[::2],
    "transposed": lambda: np.zeros((3, 2)).T,
    "fortran 2d": lambda: np.asfortranarray(np.zeros((3, 2))),
}


@pytest.mark.mpi
@pytest.mark.parametrize("case", sorted(NOT_CONTIGUOUS))
def test_non_contiguous_is_value_error(dist, rank, size, case):
    arr = NOT_CONTIGUOUS[case]()
    with pytest.raises(ValueError, match=rf"^all_reduce: rank {rank}: argument 'tensor' .*not contiguous"):
        dist.all_reduce(arr)
    with pytest.raises(ValueError, match=rf"^all_gather_into_tensor: rank {rank}: argument 'input_tensor'"):
        dist.all_gather_into_tensor(np.zeros(arr.size * size), arr)
    with pytest.raises(ValueError, match=rf"^all_gather: rank {rank}: argument 'tensor_list\[0\]'"):
        dist.all_gather([arr] * size, np.zeros(arr.size))
    still_works(dist, size)


def ro_of(n: int) -> np.ndarray:
    a = np.zeros(n)
    a.setflags(write=False)
    return a


@pytest.mark.mpi
def test_read_only_output_is_value_error(dist, rank, size):
    ro = np.ones(3)
    ro.setflags(write=False)
    for fn, call, arg in (
        (lambda: dist.all_reduce(ro), "all_reduce", "tensor"),
        (lambda: dist.all_gather_into_tensor(ro_of(3 * size), np.ones(3)),
         "all_gather_into_tensor", "output_tensor"),
        (lambda: dist.reduce_scatter_tensor(ro, np.ones(3 * size)), "reduce_scatter_tensor", "output"),
        (lambda: dist.scatter(ro, [np.ones(3)] * size if rank == 0 else None, src=0), "scatter", "tensor"),
    ):
        with pytest.raises(ValueError, match=rf"^{call}: rank {rank}: argument '{arg}' is read-only"):
            fn()
    # read-only *inputs* are fine
    t = np.zeros(3 * size)
    dist.all_gather_into_tensor(t, ro)
    np.testing.assert_array_equal(t, np.ones(3 * size))
    still_works(dist, size)


NOT_ARRAYS = {
    "list": ([1.0, 2.0], "list"),
    "float": (3.0, "float"),
    "int": (3, "int"),
    "numpy scalar": (np.float64(1.0), "numpy.float64"),
    "None": (None, "NoneType"),
    "bytes": (b"ab", "bytes"),
}


@pytest.mark.mpi
@pytest.mark.parametrize("case", sorted(NOT_ARRAYS))
def test_non_arrays_are_type_errors_naming_the_type(dist, rank, size, case):
    value, name = NOT_ARRAYS[case]
    with pytest.raises(TypeError, match=rf"^all_reduce: rank {rank}: argument 'tensor' must be a numpy "
                                        rf"array.* torch tensor.*, got {name}$"):
        dist.all_reduce(value)
    with pytest.raises(TypeError, match=rf"got {name}"):
        dist.broadcast(value, src=0)
    still_works(dist, size)


UNSUPPORTED = {
    "str": np.array(["a", "b"]),
    "object": np.array([1, None], dtype=object),
    "datetime": np.array(["2024-01-01"], dtype="datetime64[D]"),
    "structured": np.zeros(2, dtype=[("a", "i4"), ("b", "f8")]),
    "float8": np.zeros(2, dtype=ml_dtypes.float8_e4m3fn),
}


@pytest.mark.mpi
@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_unsupported_dtype_is_type_error_naming_it(dist, rank, size, case):
    arr = UNSUPPORTED[case]
    with pytest.raises(TypeError, match=rf"^all_reduce: rank {rank}: argument 'tensor' has unsupported "
                                        rf"dtype .*supported: .*bfloat16"):
        dist.all_reduce(arr)
    assert str(arr.dtype) in str(pytest.raises(TypeError, dist.all_gather_into_tensor, arr, arr).value)
    still_works(dist, size)


def test_as_buffer_is_a_view():
    from mpidist.core.buffers import as_buffer

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    arr, d = as_buffer(x, "t", "x", True)
    assert np.shares_memory(arr, x) and d.name == "float32"
    h = np.ones(4, np.float16)
    arr, d = as_buffer(h, "t", "x", True)
    assert np.shares_memory(arr, h) and d.name == "float16" and arr.dtype == np.uint16
    b = np.ones(4, ml_dtypes.bfloat16)
    arr, d = as_buffer(b, "t", "x", True)
    assert d.name == "bfloat16" and arr.dtype == np.uint16
    arr[0] = 0  # writing the raw words writes the caller's array
    assert float(b[0]) == 0.0

"""Every ReduceOp × every dtype, against numpy; the invalid pairs raise TypeError on every rank."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest
from helpers import rank_data

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128", "bfloat16"]
OPS = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG", "PREMUL_SUM"]
FACTOR = 0.5  # exact in every float format, so premultiplying adds no rounding of its own


def np_dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def family(name: str) -> str:
    if name == "bool":
        return "b"
    if name in ("float16", "float32", "float64", "bfloat16"):
        return "f"
    return np.dtype(name).kind  # i, u, c


def valid(op: str, name: str) -> bool:
    fam = family(name)
    if op in ("BAND", "BOR", "BXOR"):
        return fam in "biu"
    if op in ("MIN", "MAX"):
        return fam != "c"
    if op in ("AVG", "PREMUL_SUM"):
        return fam in "fc"
    return True


def expected(op: str, name: str, inputs: list[np.ndarray]) -> np.ndarray:
    """The reduction computed by numpy (in float64/complex128 for floating types)."""
    fam = family(name)
    if fam == "b":
        fold = {"SUM": np.logical_or, "MAX": np.logical_or, "BOR": np.logical_or,
                "PRODUCT": np.logical_and, "MIN": np.logical_and, "BAND": np.logical_and,
                "BXOR": np.logical_xor}[op]
        return functools.reduce(fold, inputs)
    if fam in "fc":
        inputs = [x.astype(np.complex128 if fam == "c" else np.float64) for x in inputs]
    if op == "PREMUL_SUM":
        inputs = [FACTOR * x for x in inputs]
    fold = {"SUM": np.add, "AVG": np.add, "PREMUL_SUM": np.add, "PRODUCT": np.multiply,
            "MIN": np.minimum, "MAX": np.maximum, "BAND": np.bitwise_and, "BOR": np.bitwise_or,
            "BXOR": np.bitwise_xor}[op]
    out = functools.reduce(fold, inputs)  # integer types wrap exactly as MPI's do
    return out / len(inputs) if op == "AVG" else out


def tolerance(name: str) -> float:
    return {"float16": 4e-3, "bfloat16": 3e-2, "float32": 1e-5, "complex64": 1e-5}.get(name, 1e-12)


def check(got: np.ndarray, want: np.ndarray, name: str) -> None:
    assert got.dtype == np_dtype(name)
    if family(name) in "fc":
        widened = got.astype(np.complex128 if family(name) == "c" else np.float64)
        np.testing.assert_allclose(widened, want, rtol=tolerance(name))
    else:
        np.testing.assert_array_equal(got, want)


def the_op(dist, op: str):
    return dist.make_premul_sum(FACTOR) if op == "PREMUL_SUM" else getattr(dist.ReduceOp, op)


PAIRS = [(op, dt) for op in OPS for dt in DTYPES]


@pytest.mark.mpi
@pytest.mark.parametrize("op,name", [p for p in PAIRS if valid(*p)])
def test_all_reduce_op_dtype(dist, rank, size, op, name):
    shape = (2, 3)
    t = rank_data(rank, shape, np_dtype(name), seed=1)
    dist.all_reduce(t, op=the_op(dist, op))
    check(t, expected(op, name, [rank_data(r, shape, np_dtype(name), seed=1) for r in range(size)]), name)


@pytest.mark.mpi
@pytest.mark.parametrize("op,name", [p for p in PAIRS if not valid(*p)])
def test_invalid_op_dtype_raises_type_error(dist, rank, size, op, name):
    t = rank_data(rank, (3,), np_dtype(name))
    before = t.copy()
    with pytest.raises(TypeError, match=rf"^all_reduce: rank {rank}: ReduceOp\.{op}"):
        dist.all_reduce(t, op=the_op(dist, op))
    assert t.tobytes() == before.tobytes()  # nothing was premultiplied or touched
    with pytest.raises(TypeError, match=rf"^reduce: rank {rank}: ReduceOp\.{op}"):
        dist.reduce(t, dst=0, op=the_op(dist, op))
    ok = np.ones(2, np.int32)
    dist.all_reduce(ok)
    np.testing.assert_array_equal(ok, np.full(2, size, np.int32))


# Rooted and scattered reductions: one dtype per family for every valid op, async too.
SOME = ["bool", "int32", "uint8", "float16", "float64", "complex64", "bfloat16"]


@pytest.mark.mpi
@pytest.mark.parametrize("op,name", [(op, dt) for op in OPS for dt in SOME if valid(op, dt)])
def test_reduce_op_dtype_async(dist, rank, size, op, name):
    shape = (4,)
    dst = size - 1
    inputs = [rank_data(r, shape, np_dtype(name), seed=2) for r in range(size)]
    t = inputs[rank].copy()
    w = dist.reduce(t, dst=dst, op=the_op(dist, op), async_op=True)
    w.wait()
    if rank == dst:
        check(t, expected(op, name, inputs), name)
    else:
        assert t.tobytes() == inputs[rank].tobytes()  # non-roots keep their input


@pytest.mark.mpi
@pytest.mark.parametrize("op,name", [(op, dt) for op in OPS for dt in SOME if valid(op, dt)])
def test_reduce_scatter_tensor_op_dtype(dist, rank, size, op, name):
    k = 3
    inputs = [rank_data(r, (size * k,), np_dtype(name), seed=3) for r in range(size)]
    out = np.zeros(k, np_dtype(name))
    dist.reduce_scatter_tensor(out, inputs[rank].copy(), op=the_op(dist, op))
    check(out, expected(op, name, [x[rank * k:(rank + 1) * k] for x in inputs]), name)


@pytest.mark.mpi
@pytest.mark.parametrize("op,name", [("SUM", "float32"), ("AVG", "bfloat16"), ("AVG", "float16"),
                                     ("PREMUL_SUM", "float64"), ("MAX", "int64")])
def test_all_reduce_async_op_dtype(dist, rank, size, op, name):
    inputs = [rank_data(r, (5,), np_dtype(name), seed=4) for r in range(size)]
    t = inputs[rank].copy()
    dist.all_reduce(t, op=the_op(dist, op), async_op=True).wait()
    check(t, expected(op, name, inputs), name)


@pytest.mark.mpi
def test_low_precision_sum_rounds_to_nearest(dist, rank, size):
    # every rank adds 1.0 to a value with no spare mantissa bits: the result is the exactly
    # rounded float32 sum, not a truncation
    for name in ("float16", "bfloat16"):
        dt = np_dtype(name)
        t = np.array([1.0, 256.0, -3.5], dtype=dt)
        dist.all_reduce(t)
        want = (np.array([1.0, 256.0, -3.5]) * size).astype(dt)
        assert t.tobytes() == want.tobytes(), (name, t, want)


@pytest.mark.mpi
def test_premul_sum_factor_forms(dist, rank, size):
    for factor in (2, np.array([0.25]), np.float32(3.0)):
        t = np.full(3, rank + 1.0)
        dist.all_reduce(t, op=dist.make_premul_sum(factor))
        np.testing.assert_allclose(t, np.full(3, float(np.asarray(factor).item()) * sum(range(1, size + 1))))
    assert dist._make_nccl_premul_sum is dist.make_premul_sum


@pytest.mark.mpi
def test_premul_sum_bad_factor_and_missing_factor(dist, rank, size):
    with pytest.raises(ValueError, match=rf"^all_reduce: rank {rank}: PREMUL_SUM factor must be a scalar"):
        dist.all_reduce(np.ones(2), op=dist.make_premul_sum(np.ones(2)))
    with pytest.raises(ValueError, match=rf"^all_reduce: rank {rank}: .*make_premul_sum"):
        dist.all_reduce(np.ones(2), op=dist.ReduceOp.PREMUL_SUM)
    t = np.ones(2)
    dist.all_reduce(t)
    np.testing.assert_array_equal(t, np.full(2, float(size)))


def test_reduce_op_names_and_aliases():
    import mpidist

    assert mpidist.reduce_op is mpidist.ReduceOp
    assert mpidist.ReduceOp.RedOpType.SUM == mpidist.ReduceOp.SUM
    assert mpidist.ReduceOp.SUM != mpidist.ReduceOp.MAX
    assert {mpidist.ReduceOp.SUM, mpidist.ReduceOp.SUM} == {mpidist.ReduceOp.SUM}
    assert "SUM" in repr(mpidist.ReduceOp.SUM)
    assert "0.5" in repr(mpidist.make_premul_sum(0.5))

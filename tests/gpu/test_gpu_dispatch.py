"""GPU dispatch without a GPU: fake device arrays over host memory.

``FakeCAI`` exposes ``__cuda_array_interface__`` and ``FakeDL`` a CUDA ``__dlpack_device__``,
both over numpy memory; a fake backend (registered for their module) records stream
synchronisations and copies with memmove. So the tests see which path a buffer takes, which
stream is synchronised, which pool buffer is used, and -- because the "device" memory is
really host memory -- every collective end to end on both paths (MPICH accepts the pointers).
"""

from __future__ import annotations

import ctypes
import warnings

import numpy as np
import pytest
from helpers import gathered, rank_data

import mpidist  # noqa: F401  (declares every call)
from mpidist import gpu
from mpidist.calls import ops
from mpidist.core import buffers, registry

FAKE = "fakegpu"


class FakeCAI:
    """A 'device' array: CUDA Array Interface v3 over a numpy array, with a stream."""

    __module__ = f"{FAKE}.array"

    def __init__(self, host: np.ndarray, stream: int | None = 7, strides=None):
        self.host = host
        self.stream = stream
        self.strides = strides

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.host.shape, "typestr": self.host.dtype.str, "version": 3,
                "data": (self.host.__array_interface__["data"][0], False),
                "strides": self.strides, "stream": self.stream}


class FakeDL:
    """A 'device' array known only through DLPack (numpy's capsule, a CUDA device tuple)."""

    __module__ = f"{FAKE}.dl"

    def __init__(self, host: np.ndarray):
        self.host = host
        self.streams: list = []

    def __dlpack_device__(self):
        return (gpu.DL_CUDA, 0)

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        return self.host.__dlpack__()


class Recorder:
    def __init__(self):
        self.syncs: list = []
        self.to_host: list = []
        self.to_device: list = []
        self.allocs: list = []

    def library(self) -> gpu.Library:
        def sync(dev):
            self.syncs.append(dev.stream)

        def to_host(dev, host):
            self.to_host.append(dev.ptr)
            ctypes.memmove(host.ctypes.data, dev.ptr, dev.nbytes)

        def to_device(host, dev):
            self.to_device.append(dev.ptr)
            ctypes.memmove(dev.ptr, host.ctypes.data, dev.nbytes)

        def alloc(n):
            self.allocs.append(n)
            return np.empty(n, np.uint8)
        return gpu.Library(sync, to_host, to_device, alloc)


@pytest.fixture
def rec(monkeypatch):
    r = Recorder()
    monkeypatch.setitem(gpu.LIBRARIES, FAKE, r.library())
    monkeypatch.setattr(gpu.staging._warned, "staging", True)  # the warning has its own test
    return r


@pytest.fixture(params=["0", "1"], ids=["staged", "direct"])
def mode(request, monkeypatch):
    monkeypatch.setenv(gpu.ENV_CUDA_AWARE, request.param)
    return "direct" if request.param == "1" else "staged"


def addr(a) -> int:
    return a.__array_interface__["data"][0]


# ------------------------------------------------------------ detection and the query

def test_inspect_host_objects_are_not_devices():
    torch = pytest.importorskip("torch")
    assert gpu.inspect(np.zeros(3)) is None
    assert gpu.inspect(torch.zeros(3)) is None
    assert gpu.inspect([1, 2]) is None


def test_inspect_cai_and_dlpack():
    h = np.arange(6, dtype=np.float32).reshape(2, 3)
    d = gpu.inspect(FakeCAI(h, stream=9))
    assert (d.lib, d.ptr, d.nbytes, d.shape, d.dtype, d.stream, d.contiguous) == \
        (FAKE, addr(h), 24, (2, 3), "float32", 9, True)
    fdl = FakeDL(np.arange(4, dtype=np.int16))
    d = gpu.inspect(fdl)
    assert (d.ptr, d.nbytes, d.shape, d.dtype, d.stream) == (addr(fdl.host), 8, (4,), "int16", 1)
    assert fdl.streams == [1]  # asked the producer to order its work before the default stream


def test_non_contiguous_and_unsupported_device_arrays_are_refused():
    h = np.zeros((4, 4), np.float32)
    with pytest.raises(ValueError, match=r"all_reduce: rank \d+: .*not contiguous"):
        buffers.as_buffer(FakeCAI(h, strides=(4, 16)), "all_reduce", "tensor", True)
    with pytest.raises(TypeError, match="unsupported dtype"):
        buffers.as_buffer(FakeCAI(np.zeros(2, "datetime64[s]")), "all_reduce", "tensor", True)
    with pytest.raises(TypeError, match="GPU array"):
        buffers.as_buffer(object(), "all_reduce", "tensor", True)


def test_cuda_aware_override_and_query(monkeypatch):
    monkeypatch.setenv(gpu.ENV_CUDA_AWARE, "1")
    assert gpu.cuda_aware() == "yes"
    monkeypatch.setenv(gpu.ENV_CUDA_AWARE, "0")
    assert gpu.cuda_aware() == "no"
    assert "CUDA-aware MPI: no" in gpu.describe()
    monkeypatch.setenv(gpu.ENV_CUDA_AWARE, "maybe")
    with pytest.raises(ValueError, match="MPIDIST_CUDA_AWARE"):
        gpu.cuda_aware()
    monkeypatch.delenv(gpu.ENV_CUDA_AWARE)
    monkeypatch.setattr(gpu.aware, "_aware", None)
    answer = gpu.query_cuda_support()
    assert answer in (0, 1, None)  # the mpich and Debian builds here answer 0
    assert gpu.cuda_aware() == {0: "no", 1: "yes", None: "unknown"}[answer]
    monkeypatch.setattr(gpu.aware, "_aware", None)
    monkeypatch.setenv("MPIR_CVAR_ENABLE_GPU", "0")
    assert gpu.cuda_aware() == "no"


@pytest.mark.parametrize("aware,call,kind,path", [
    ("no", "all_reduce", "f", "staged"),
    ("unknown", "broadcast", "f", "staged"),
    ("yes", "broadcast", "f", "direct"),
    ("yes", "all_reduce", "f", "direct"),
    ("yes", "all_reduce", "bf16", "staged"),
    ("yes", "reduce_scatter_tensor", "f16", "staged"),
    ("yes", "all_gather_into_tensor", "f16", "direct"),
    ("yes", "all_gather", "f", "staged"),
    ("yes", "all_to_all", "i", "staged"),
    ("yes", "send", "bf16", "direct"),
])
def test_choose_path(aware, call, kind, path):
    assert gpu.choose_path(registry.of(call), kind, aware) == path


# ------------------------------------------------------------ staging, pool, sync

def test_staged_copy_sync_copy_back_and_pool_reuse(rec, monkeypatch):
    monkeypatch.setenv(gpu.ENV_CUDA_AWARE, "0")
    st: list = []
    h = np.arange(10, dtype=np.float32)
    x = FakeCAI(h, stream=42)
    arr, d = buffers.as_buffer(x, registry.of("all_reduce"), "tensor", True, st)
    assert d.name == "float32" and not isinstance(arr, gpu.DeviceView)
    assert addr(arr) != addr(h) and np.array_equal(arr, h)
    assert rec.syncs == [42] and rec.to_host == [addr(h)]
    first = addr(arr)
    allocations = gpu.POOL.allocations
    arr *= 3  # what MPI would write
    finish = gpu.completion(st, None, x)
    np.testing.assert_array_equal(h, np.arange(10))  # nothing copied back before completion
    finish()
    np.testing.assert_array_equal(h, np.arange(10) * 3)
    assert rec.to_device == [addr(h)]
    arr2, _ = buffers.as_buffer(FakeCAI(h.copy()), registry.of("all_reduce"), "tensor", True, st)
    assert addr(arr2) == first and gpu.POOL.allocations == allocations  # same pool buffer
    gpu.release(st)


def test_read_only_arguments_are_not_copied_back(rec, monkeypatch):
    monkeypatch.setenv(gpu.ENV_CUDA_AWARE, "0")
    st: list = []
    h = np.ones(4, np.int32)
    x = FakeCAI(h)
    arr, _ = buffers.as_buffer(x, registry.of("broadcast"), "tensor", False, st)
    arr[:] = 5
    gpu.completion(st, None, x)()
    assert rec.to_device == [] and (h == 1).all()


def test_post_step_runs_before_copy_back(rec, monkeypatch):
    monkeypatch.setenv(gpu.ENV_CUDA_AWARE, "0")
    st: list = []
    h = np.full(3, 6.0, np.float64)
    x = FakeCAI(h)
    arr, d = buffers.as_buffer(x, registry.of("all_reduce"), "tensor", True, st)
    gpu.completion(st, lambda: ops.divide(arr, d, 3), x)()
    np.testing.assert_array_equal(h, np.full(3, 2.0))


def test_staging_warns_once(rec, monkeypatch):
    monkeypatch.setenv(gpu.ENV_CUDA_AWARE, "0")
    st: list = []
    monkeypatch.setattr(gpu.staging._warned, "staging", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            buffers.as_buffer(FakeCAI(np.zeros(2)), registry.of("all_reduce"), "tensor", True, st)
            gpu.release(st)
    assert [str(w.message).count("staged") for w in caught] == [1]


def test_direct_path_hands_mpi_the_device_pointer(rec, monkeypatch):
    monkeypatch.setenv(gpu.ENV_CUDA_AWARE, "1")
    st: list = []
    h = np.arange(8, dtype=np.float32)
    arr, d = buffers.as_buffer(FakeCAI(h, stream=3), registry.of("all_reduce"), "tensor", True, st)
    assert isinstance(arr, gpu.DeviceView) and addr(arr) == addr(h) and arr.shape == h.shape
    assert rec.syncs == [3] and rec.to_host == [] and rec.allocs == []
    ops.divide(arr, d, 4)  # AVG on device memory: through a staged copy
    np.testing.assert_array_equal(h, np.arange(8) / 4)
    assert rec.to_host == [addr(h)] and rec.to_device == [addr(h)]
    gpu.release(st)


def test_direct_path_stages_an_argument_that_overlaps_another(rec, monkeypatch):
    monkeypatch.setenv(gpu.ENV_CUDA_AWARE, "1")
    st: list = []
    h = np.arange(8, dtype=np.float32)
    out, _ = buffers.as_buffer(FakeCAI(h[:4]), registry.of("all_to_all_single"), "output", True, st)
    inp, _ = buffers.as_buffer(FakeCAI(h[2:6]), registry.of("all_to_all_single"), "input", False, st)
    assert isinstance(out, gpu.DeviceView) and not isinstance(inp, gpu.DeviceView)
    gpu.release(st)


def test_bfloat16_device_array_from_dlpack(rec, monkeypatch):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    monkeypatch.setenv(gpu.ENV_CUDA_AWARE, "0")
    st: list = []

    class BF16DL(FakeDL):
        __module__ = FAKE

        def __dlpack__(self, stream=None):  # numpy cannot export bfloat16: patch the dtype code
            cap = self.host.view(np.uint16).__dlpack__()
            t = gpu.detect._DLTensor.from_address(gpu.detect._capsule_pointer(cap, b"dltensor"))
            t.dtype.code = 4
            return cap

    h = np.array([1.5, -2.25], ml_dtypes.bfloat16)
    arr, d = buffers.as_buffer(BF16DL(h), registry.of("all_reduce"), "tensor", True, st)
    assert d is buffers.BFLOAT16 and np.array_equal(arr, h.view(np.uint16))
    gpu.release(st)


# ------------------------------------------------------------ collectives end to end

def _dev(kind, host):
    return FakeCAI(host) if kind == "cai" else FakeDL(host)


@pytest.mark.mpi
@pytest.mark.parametrize("kind", ["cai", "dl"])
def test_collectives_end_to_end(dist, rank, size, rec, mode, kind):
    x = rank_data(rank, (5,), np.float32)
    inputs = [rank_data(r, (5,), np.float32) for r in range(size)]

    t = x.copy()
    dist.all_reduce(_dev(kind, t))
    np.testing.assert_allclose(t, np.sum(inputs, axis=0), rtol=1e-6)

    t = x.copy()
    dist.all_reduce(_dev(kind, t), op=dist.ReduceOp.AVG)
    np.testing.assert_allclose(t, np.mean(inputs, axis=0), rtol=1e-6)

    t = x.copy()
    w = dist.all_reduce(_dev(kind, t), op=dist.ReduceOp.MAX, async_op=True)
    w.wait()
    np.testing.assert_array_equal(t, np.max(inputs, axis=0))

    t = x.copy()
    dist.broadcast(_dev(kind, t), src=size - 1)
    np.testing.assert_array_equal(t, inputs[-1])

    t = x.copy()
    dist.reduce(_dev(kind, t), dst=0)
    np.testing.assert_allclose(t, np.sum(inputs, axis=0) if rank == 0 else x, rtol=1e-6)

    outs = [np.zeros(5, np.float32) for _ in range(size)]
    dist.all_gather([_dev(kind, o) for o in outs], _dev(kind, x.copy()))
    np.testing.assert_array_equal(np.stack(outs), np.stack(inputs))

    big = np.zeros(5 * size, np.float32)
    dist.all_gather_into_tensor(_dev(kind, big), _dev(kind, x.copy()))
    np.testing.assert_array_equal(big, np.concatenate(inputs))

    outs = [np.zeros(5, np.float32) for _ in range(size)]
    dist.gather(_dev(kind, x.copy()), [_dev(kind, o) for o in outs] if rank == 0 else None, dst=0)
    if rank == 0:
        np.testing.assert_array_equal(np.stack(outs), np.stack(inputs))

    t = np.zeros(5, np.float32)
    src = [np.full(5, i, np.float32) for i in range(size)]
    dist.scatter(_dev(kind, t), [_dev(kind, s) for s in src] if rank == 0 else None, src=0)
    np.testing.assert_array_equal(t, np.full(5, rank))

    blocks = [rank_data(r, (size, 3), np.float32, seed=1) for r in range(size)]
    out = np.zeros(3, np.float32)
    dist.reduce_scatter_tensor(_dev(kind, out), _dev(kind, blocks[rank].copy()))
    np.testing.assert_allclose(out, np.sum(blocks, axis=0)[rank], rtol=1e-6)

    send = np.arange(size * 2, dtype=np.int64) + 100 * rank
    recv = np.zeros(size * 2, np.int64)
    dist.all_to_all_single(_dev(kind, recv), _dev(kind, send))
    np.testing.assert_array_equal(recv, np.concatenate([np.arange(2 * rank, 2 * rank + 2) + 100 * r
                                                        for r in range(size)]))
    if size > 1:
        t = np.zeros(4, np.float32)
        if rank == 0:
            dist.send(_dev(kind, np.arange(4, dtype=np.float32)), dst=1)
        elif rank == 1:
            dist.recv(_dev(kind, t), src=0)
            np.testing.assert_array_equal(t, np.arange(4))
    staged_syncs = rec.syncs
    if kind == "cai":
        assert set(staged_syncs) == {7}  # FakeCAI's stream, before MPI or a copy touched memory
    else:
        assert set(staged_syncs) == {1}  # DLPack: the legacy default stream
    assert gpu.POOL.in_use == 0  # every staged buffer went back to the pool
    if mode == "direct":
        # list arguments are staged; single tensors went to MPI as device pointers
        assert len(rec.to_host) < len(staged_syncs)


@pytest.mark.mpi
def test_float16_device_reduction_is_staged_and_correct(dist, rank, size, rec, mode):
    x = rank_data(rank, (9,), np.float16)
    inputs = np.stack([rank_data(r, (9,), np.float16) for r in range(size)]).astype(np.float64)
    t = x.copy()
    dist.all_reduce(_dev("cai", t))
    ref = inputs.sum(axis=0)
    assert np.all(np.abs(t.astype(np.float64) - ref) <= 2.0**-11 * np.abs(ref) + size * 2.0**-24 * ref)
    assert rec.to_device  # staged even on a CUDA-aware MPI: the arithmetic is on the host
    assert gathered(dist, len(rec.to_device)) == [1] * size

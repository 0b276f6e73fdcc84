"""Host staging of device buffers: the reused pool, and the path each device buffer takes.

Two paths (:func:`choose_path`):

* **direct** -- MPI is CUDA-aware and the call never touches the payload on the host (its
  :class:`~mpidist.core.registry.Call` says ``gpu_direct``): MPI gets the device pointer, wrapped in a
  :class:`~mpidist.gpu.detect.DeviceView`.
* **staged** -- otherwise: the data is copied into a buffer of the one :data:`POOL`, MPI
  works on that, and the call's completion copies results back and returns the buffer.

The device buffers of one call are recorded in a list that the call owns (``staging``, made
by the call and passed to :func:`to_mpi`); :func:`completion` turns it into the completion step.
Nothing per call is kept in this module, so threads calling at once never share a record.
"""

from __future__ import annotations

import collections
import warnings
from typing import Any, Callable, NamedTuple

import numpy as np
from mpi4py import MPI

from .aware import cuda_aware
from .copy import host_address, library, synchronize
from .detect import Device, DeviceView


class StagingPool:
    """Host buffers reused across calls, in power-of-two size classes (one pool per process).

    Pinned through the producing library when it can allocate page-locked memory; plain
    numpy memory otherwise.
    """

    MIN = 4096

    def __init__(self) -> None:
        self._free: dict[int, list[np.ndarray]] = collections.defaultdict(list)
        self._whole: dict[int, np.ndarray] = {}  # start address -> the allocated buffer
        self.allocations = 0
        self.pinned = 0
        self.bytes = 0
        self.in_use = 0

    def acquire(self, nbytes: int, alloc: Callable[[int], np.ndarray] | None = None) -> np.ndarray:
        """A uint8 host array of exactly ``nbytes``, carved from a reused buffer."""
        size = max(self.MIN, 1 << max(0, nbytes - 1).bit_length())
        free = self._free[size]
        if free:
            buf = free.pop()
        else:
            buf = None
            if alloc is not None:
                try:
                    buf = alloc(size)
                    self.pinned += 1
                except Exception:  # no pinned memory here (e.g. a CPU-only torch): plain memory
                    buf = None
            if buf is None:
                buf = np.empty(size, np.uint8)
            self.allocations += 1
            self.bytes += size
            self._whole[host_address(buf)] = buf
        self.in_use += 1
        return buf[:nbytes]

    def release(self, buf: np.ndarray) -> None:
        """Return a buffer from :meth:`acquire` to the pool."""
        whole = self._whole[host_address(buf)]
        self._free[whole.size].append(whole)
        self.in_use -= 1

    def describe(self) -> str:
        held = sum(len(v) for v in self._free.values())
        return (f"{self.allocations} buffers ({self.bytes / 2**20:.1f} MiB, {self.pinned} pinned), "
                f"{held} free")


#: The process-wide staging pool.
POOL = StagingPool()


class Staged(NamedTuple):
    """One device buffer of a call: its host copy (``None`` when MPI got the pointer itself)."""

    device: Device
    host: np.ndarray | None
    writable: bool


class _Warned:
    staging = False


_warned = _Warned()


def choose_path(call: Any, kind: str, aware: str | None = None) -> str:
    """``"direct"`` or ``"staged"`` for a device buffer of dtype kind ``kind`` in ``call``."""
    if (aware or cuda_aware()) != "yes" or not call.gpu_direct:
        return "staged"
    if call.reducing and kind in ("f16", "bf16"):
        return "staged"  # mpidist reduces 16-bit words itself, on the host
    return "direct"


def _warn_staging(call: Any) -> None:
    if not _warned.staging:
        _warned.staging = True
        warnings.warn(f"mpidist: {call}: MPI is not CUDA-aware (cuda_aware()={cuda_aware()!r}); device "
                      "buffers are staged through host memory (set MPIDIST_CUDA_AWARE=1 to override)",
                      RuntimeWarning, stacklevel=5)


def _overlaps_direct(staging: list[Staged], lo: int, hi: int) -> bool:
    return any(s.host is None and lo < s.device.ptr + s.device.nbytes and s.device.ptr < hi
               for s in staging)


def to_mpi(dev: Device, raw: np.dtype, kind: str, call: Any, writable: bool,
           staging: list[Staged]) -> np.ndarray:
    """The array MPI gets for device buffer ``dev``: a :class:`DeviceView` or a pool copy.

    Records the buffer in the call's ``staging`` list for :func:`completion`.
    """
    path = choose_path(call, kind)
    if path == "direct" and _overlaps_direct(staging, dev.ptr, dev.ptr + dev.nbytes):
        path = "staged"  # overlaps another argument of this call: give MPI a separate copy
    if path == "staged":
        if cuda_aware() != "yes":
            _warn_staging(call)
        lib = library(dev)
        host = POOL.acquire(dev.nbytes, lib.alloc_pinned)
        staging.append(Staged(dev, host, writable))
        if dev.nbytes:
            lib.sync(dev)
            lib.to_host(dev, host)
        return host.view(raw).reshape(dev.shape)
    if dev.nbytes == 0:
        return np.empty(dev.shape, raw)
    synchronize(dev)
    staging.append(Staged(dev, None, writable))
    buf = MPI.buffer.fromaddress(dev.ptr, dev.nbytes, readonly=not writable)
    view = np.frombuffer(buf, raw).reshape(dev.shape).view(DeviceView)
    view.gpu_device = dev
    return view


def release(staging: list[Staged]) -> None:
    """Return the call's pool buffers without copying anything back (the call failed)."""
    for s in staging:
        if s.host is not None:
            POOL.release(s.host)
    staging.clear()


def completion(staging: list[Staged], post: Callable[[], None] | None,
           output: Any) -> Callable[[], None] | None:
    """The call's completion: ``post``, then copy-back of its staged outputs and their release.

    The staged buffers that belong to ``output`` (an array or a list of arrays) and were
    writable are copied back to the device; all go back to :data:`POOL`. Returns ``post``
    unchanged when nothing was staged.
    """
    staged = [s for s in staging if s.host is not None]
    staging.clear()
    if not staged:
        return post
    outs = output if isinstance(output, (list, tuple)) else (output,)
    ids = {id(o) for o in outs if o is not None}
    last: dict[int, Staged] = {}
    for s in staged:
        if s.writable and id(s.device.obj) in ids:
            last[id(s.device.obj)] = s  # the newest staging of an object is the one MPI wrote

    def copy_back() -> None:
        try:
            if post is not None:
                post()
            for s in last.values():
                if s.device.nbytes:
                    library(s.device).to_device(s.host, s.device)
        finally:
            for s in staged:
                POOL.release(s.host)
    return copy_back


def through_host(view: DeviceView, fn: Callable[[np.ndarray], Any], write_back: bool) -> Any:
    """Run host arithmetic ``fn`` on a pool copy of device memory ``view``.

    With ``write_back`` the (modified) copy goes back to the device and ``None`` is
    returned; otherwise ``fn``'s result, which must not be the pool copy itself.
    """
    dev = view.gpu_device
    lib = library(dev)
    host = POOL.acquire(dev.nbytes, lib.alloc_pinned)
    try:
        lib.sync(dev)
        lib.to_host(dev, host)
        result = fn(host.view(view.dtype).reshape(view.shape))
        if write_back:
            lib.to_device(host, dev)
            return None
        return result
    finally:
        POOL.release(host)

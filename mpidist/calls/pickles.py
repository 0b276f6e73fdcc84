"""Python objects as MPI messages: pickle protocol 5, with its buffers out of band.

An object becomes a *head*: an index (``int64``: the number of out-of-band buffers, the
size of the pickle stream, a channel tag, the size of each buffer), the pickle stream, then
each buffer (numpy arrays, ``bytearray``...), every part starting on an :data:`ALIGN`-byte
boundary so that arrays come back aligned. Buffers of at least ``apart`` bytes are left out
of the head and travel as messages of their own, straight from the caller's memory into an
array of their own on the receiver: one copy fewer each way, and contiguous messages, which
MPI moves fastest (a hindexed datatype over the parts was measured 6x slower in ``MPI_Bcast``
of 16 MiB). The calls that concatenate every rank's message (all-gather, gather, scatter)
keep everything in the head. The receiver unpickles with the head's buffers as views of it.

MPI counts are C ints: heads of more than :data:`INT_MAX` bytes in all travel as
:data:`UNIT`-byte units (a contiguous datatype), each padded to whole units; a buffer sent
apart travels in pieces of at most :data:`PIECE` bytes.
"""

from __future__ import annotations

import pickle
import struct
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
from mpi4py import MPI

#: Every part of a head, and every head, starts on a multiple of this many bytes.
ALIGN = 64
#: Buffers from this size on travel apart, where the call allows it (broadcast, send).
APART = 64 * 1024
#: The largest count an MPI call takes (a C int); past it heads travel in :data:`UNIT`s.
INT_MAX = 2**31 - 1
UNIT = 1 << 20
#: A buffer sent apart goes in messages of at most this many bytes.
PIECE = 1 << 30
#: Never apart: everything in the head.
INLINE = 1 << 62


def _up(n: int, to: int) -> int:
    return -(-n // to) * to


class Head:
    """Where the parts of a head lie: ``index`` as sent, the offset of the stream and of each
    buffer kept in the head (``None`` for a buffer sent apart), and the head's size."""

    __slots__ = ("index", "stream", "offsets", "nbytes")

    def __init__(self, index: list[int], apart: int) -> None:
        self.index = index
        at = _up(8 * len(index), ALIGN)
        self.stream = at
        at = _up(at + index[1], ALIGN)
        self.offsets: list[int | None] = []
        for n in index[3:]:
            if n >= apart:
                self.offsets.append(None)
            else:
                self.offsets.append(at)
                at = _up(at + n, ALIGN)
        self.nbytes = at

    def apart(self) -> list[int]:
        """The sizes of the buffers that travel apart, in order."""
        return [n for n, o in zip(self.index[3:], self.offsets) if o is None]


def read_head(buf: np.ndarray, offset: int, apart: int) -> Head:
    (k,) = struct.unpack_from("<q", buf, offset)
    return Head(list(struct.unpack_from(f"<{k + 3}q", buf, offset)), apart)


class Pickled:
    """``obj`` pickled for MPI: its head (:meth:`head`, :attr:`nbytes`), its buffers apart (:attr:`apart`)."""

    __slots__ = ("layout", "inline", "apart", "nbytes")

    def __init__(self, obj: Any, apart: int = INLINE, channel: int = 0) -> None:
        bufs: list[memoryview] = []

        def out_of_band(b: pickle.PickleBuffer) -> bool:
            try:
                bufs.append(b.raw())
            except BufferError:  # not contiguous: the pickler copies it into the stream
                return True
            return False

        stream = pickle.dumps(obj, protocol=5, buffer_callback=out_of_band)
        index = [len(bufs), len(stream), channel, *(m.nbytes for m in bufs)]
        self.layout = Head(index, apart)
        self.inline = [(struct.pack(f"<{len(index)}q", *index), 0), (stream, self.layout.stream)]
        self.inline += [(m, o) for m, o in zip(bufs, self.layout.offsets) if o is not None]
        self.apart = [m for m, o in zip(bufs, self.layout.offsets) if o is None]
        self.nbytes = self.layout.nbytes

    def copy_into(self, out: np.ndarray) -> None:
        """Write the head to the start of ``out`` (``uint8``; the padding is left as it was)."""
        view = memoryview(out)
        for part, at in self.inline:
            view[at:at + len(part) if isinstance(part, bytes) else at + part.nbytes] = part

    def head(self, unit: int = 1) -> np.ndarray:
        """The head in one buffer of whole ``unit``s."""
        out = np.empty(_up(self.nbytes, unit), np.uint8)
        self.copy_into(out)
        return out


def load(buf: np.ndarray, offset: int = 0, apart: list[np.ndarray] | None = None,
         head: Head | None = None) -> Any:
    """The object whose head is at ``buf[offset:]``, with ``apart`` the buffers received apart.

    Buffers in the head come back as views of ``buf``.
    """
    h = head or read_head(buf, offset, INLINE)
    view = memoryview(buf)
    s = offset + h.stream
    if not h.offsets:  # no buffer out of band
        return pickle.loads(view[s:s + h.index[1]])
    rest = iter(apart or ())
    buffers = [memoryview(next(rest)) if o is None else view[offset + o:offset + o + n]
               for n, o in zip(h.index[3:], h.offsets)]
    return pickle.loads(view[s:s + h.index[1]], buffers=buffers)


def pieces(buf: Any) -> list[memoryview]:
    """``buf``'s bytes as messages of at most :data:`PIECE` bytes."""
    m = memoryview(buf).cast("B")
    return [m[i:i + PIECE] for i in range(0, max(m.nbytes, 1), PIECE)]


def unit_for(total: int) -> int:
    """Bytes per count for heads of ``total`` bytes in all: 1, or :data:`UNIT` past int counts."""
    return 1 if total <= INT_MAX else UNIT


def units(nbytes: int, unit: int) -> int:
    return -(-nbytes // unit)


@contextmanager
def datatype(unit: int) -> Iterator[MPI.Datatype]:
    """The datatype of counts of ``unit`` bytes: ``MPI_BYTE``, or a contiguous type freed on exit."""
    if unit == 1:
        yield MPI.BYTE
        return
    dt = MPI.BYTE.Create_contiguous(unit).Commit()
    try:
        yield dt
    finally:
        dt.Free()  # MPI lets pending operations that use it finish

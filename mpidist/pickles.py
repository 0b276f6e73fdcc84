"""Python objects as MPI messages: pickle protocol 5, its buffers sent where they lie.

A message holds an index (``int64``: the number of out-of-band buffers, the size of the
pickle stream, the size of each buffer), the pickle stream, then each buffer (numpy arrays,
``bytes`` and other contiguous buffers the pickler hands out), every part starting on a
:data:`ALIGN`-byte boundary so that arrays come back aligned. The sender describes its parts
with one ``MPI_Type_create_hindexed`` over their addresses (``MPI_BOTTOM``), so a large array
is sent without being copied; a message under :data:`COPY_BELOW` bytes is copied into one
buffer instead, which costs less than building a datatype. The receiver takes the message
into one buffer and unpickles with its buffers as views of it: arrays alias the received
bytes, so what arrives is not copied either.

MPI counts are C ints: payloads of more than :data:`INT_MAX` bytes in all travel as
:data:`UNIT`-byte units (a contiguous datatype), each message padded to whole units.
"""

from __future__ import annotations

import pickle
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
from mpi4py import MPI

#: Every part of a message, and every message, starts on a multiple of this many bytes.
ALIGN = 64
#: Messages smaller than this are copied into one buffer rather than described by a datatype.
COPY_BELOW = 64 * 1024
#: The largest count an MPI call takes (a C int); past it payloads travel in :data:`UNIT`s.
INT_MAX = 2**31 - 1
UNIT = 1 << 20
#: The largest block of an ``MPI_Type_create_hindexed`` (its lengths are C ints too).
_BLOCK = 1 << 30


def _up(n: int, to: int) -> int:
    return -(-n // to) * to


def _offsets(index: np.ndarray) -> list[int]:
    """Where the pickle stream and each buffer start, after the index."""
    out, at = [], _up(index.nbytes, ALIGN)
    for n in index[1:].tolist():
        out.append(at)
        at = _up(at + n, ALIGN)
    return out


class Pickled:
    """``obj`` pickled for MPI: its parts, where they go, and the message size (:attr:`nbytes`)."""

    __slots__ = ("parts", "nbytes")

    def __init__(self, obj: Any) -> None:
        bufs: list[memoryview] = []

        def out_of_band(b: pickle.PickleBuffer) -> bool:
            try:
                bufs.append(b.raw())
            except BufferError:  # not contiguous: the pickler copies it into the stream
                return True
            return False

        stream = pickle.dumps(obj, protocol=5, buffer_callback=out_of_band)
        index = np.array([len(bufs), len(stream), *(m.nbytes for m in bufs)], np.int64)
        self.parts = [memoryview(index).cast("B"), memoryview(stream), *bufs]
        self.nbytes = _up(_offsets(index)[-1] + int(index[-1]), ALIGN)

    def _starts(self) -> list[int]:
        return [0, *_offsets(np.frombuffer(self.parts[0], np.int64))]

    def copy_into(self, out: np.ndarray) -> None:
        """Write the message to the start of ``out`` (``uint8``; the padding is left as it was)."""
        for part, at in zip(self.parts, self._starts()):
            out[at:at + part.nbytes] = part

    def message(self, unit: int, keep: list) -> list:
        """This message as a send buffer of whole ``unit``s (``[buffer, count, datatype]``).

        ``keep`` receives what must outlive the send (a datatype it makes is freed by
        :func:`datatypes`' caller through it).
        """
        total = _up(self.nbytes, unit)
        if total < COPY_BELOW or len(self.parts) == 2:  # no buffer out of band: copy the stream
            whole = np.empty(total, np.uint8)
            self.copy_into(whole)
            keep.append(whole)
            return [whole, total // unit, _byte(unit, keep)]
        starts = self._starts()
        lengths: list[int] = []
        places: list[int] = []
        at = 0
        for part, start in zip(self.parts, starts):
            _pad(lengths, places, start - at)
            address, n = MPI.Get_address(part), part.nbytes
            for off in range(0, n, _BLOCK):
                lengths.append(min(_BLOCK, n - off))
                places.append(address + off)
            at = start + n
        _pad(lengths, places, total - at)
        dt = MPI.BYTE.Create_hindexed(lengths, places).Commit()
        keep.extend((self.parts, dt))
        return [MPI.BOTTOM, 1, dt]


_ZEROS = np.zeros(64 * 1024, np.uint8)


def _pad(lengths: list[int], places: list[int], n: int) -> None:
    """``n`` zero bytes, as blocks that all read :data:`_ZEROS`."""
    for off in range(0, n, _ZEROS.nbytes):
        lengths.append(min(_ZEROS.nbytes, n - off))
        places.append(MPI.Get_address(_ZEROS))


def _byte(unit: int, keep: list) -> MPI.Datatype:
    if unit == 1:
        return MPI.BYTE
    dt = MPI.BYTE.Create_contiguous(unit).Commit()
    keep.append(dt)
    return dt


def unit_for(total: int) -> int:
    """Bytes per count for messages of ``total`` bytes in all: 1, or :data:`UNIT` past int counts."""
    return 1 if total <= INT_MAX else UNIT


def units(nbytes: int, unit: int) -> int:
    return -(-nbytes // unit)


@contextmanager
def datatypes() -> Iterator[list]:
    """A list for :meth:`Pickled.message` and :func:`receive_type`; its datatypes are freed on exit."""
    keep: list = []
    try:
        yield keep
    finally:
        for x in keep:
            if isinstance(x, MPI.Datatype):
                x.Free()


def receive_type(unit: int, keep: list) -> MPI.Datatype:
    """The datatype a receive of ``unit``-byte counts uses."""
    return _byte(unit, keep)


def load(buf: np.ndarray, offset: int = 0) -> Any:
    """The object of the message at ``buf[offset:]``; its arrays are views of ``buf``."""
    k = int(buf[offset:offset + 8].view(np.int64)[0])
    index = buf[offset:offset + 8 * (k + 2)].view(np.int64)
    at = [offset + o for o in _offsets(index)]
    sizes = index[1:].tolist()
    view = memoryview(buf)
    return pickle.loads(view[at[0]:at[0] + sizes[0]],
                        buffers=[view[a:a + n] for a, n in zip(at[1:], sizes[1:])])

"""Shared memory among the ranks of one node: a ``/dev/shm`` file each maps, gone once all have.

The node's bell (:mod:`mpidist.core.bell`) and the large all_reduce within a node
(:mod:`mpidist.calls.nodereduce`) each need memory that every rank of a group on one node reads
and writes. The group's first rank creates a file in ``/dev/shm``, every rank maps it, and once
all have (an allreduce says so) the first rank unlinks it: the mapping lives on and nothing is left
in ``/dev/shm``, even where a rank is killed later.
"""

from __future__ import annotations

import mmap
import os
import uuid

from mpi4py import MPI


def map_on_node(node: MPI.Intracomm, size: int, prefix: str) -> tuple[mmap.mmap | None, str | None, str]:
    """Map ``size`` bytes shared by every rank of ``node`` (whose ranks all run on one node).

    Collective over ``node``: a broadcast of the file's name and an allreduce. Returns the map,
    the file's name (the same on every rank: it tells nodes apart) and ``""``; or ``None``, the
    name and why not, on every rank, where one could not create or map it.
    """
    name, why = None, ""
    if node.Get_rank() == 0:
        name = f"/dev/shm/{prefix}-{uuid.uuid4().hex}"
        try:
            fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                os.ftruncate(fd, size)
            finally:
                os.close(fd)
        except OSError as exc:
            why, name = f"cannot create its segment in /dev/shm ({exc})", None
    name = node.bcast(name, root=0)
    seg = None
    if name is not None:
        try:
            fd = os.open(name, os.O_RDWR)
            try:
                seg = mmap.mmap(fd, size)
            finally:
                os.close(fd)
        except OSError as exc:
            why = f"cannot map its segment ({exc})"
    ok = node.allreduce(seg is not None, op=MPI.LAND)  # every rank uses it, or none
    if node.Get_rank() == 0 and name is not None:
        os.unlink(name)  # every rank that maps it has: nothing stays in /dev/shm
    if not ok:
        if seg is not None:
            seg.close()
        return None, name, why or "a peer could not map the segment"
    return seg, name, ""

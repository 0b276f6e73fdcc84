"""The node's bell: waits that sleep in the kernel until a peer arrives, instead of spinning.

MPI moves a message between ranks of one node only while they test for it, so a rank that waits
spins (:func:`mpidist.core.waiting.spin_on`). That is right while its peers are in the call too,
and wrong while one of them is still computing or loading data: the spin takes the core that
peer, its torch threads or its data-loader workers need (gloo's waits block in the kernel and
take none). The bell tells the two cases apart and wakes sleepers when the case changes:

* A page of shared memory per node (``/dev/shm``, unlinked as soon as every local rank has
  mapped it) holds a futex word, a count of its sleepers, and one cache line per local rank
  counting the waits that rank is in.
* A wait on a group whose members all run on this node (its :attr:`ProcessGroup.bell
  <mpidist.core.groups.ProcessGroup>` mask, a bit per member's local rank) counts itself in and
  rings the futex (only where a rank sleeps on it: one atomic load otherwise). It spins only
  while every member is in a wait; otherwise it sleeps on the futex until a ring or the end of
  its backoff pause, and a ring starts its spin again.
* A rank that starts a collective publishes its ticket in its line: the group and the call's
  number there (:func:`ticket`). A member out of its wait whose ticket is behind has not reached
  the call (it computes; a wait sleeps until it rings); one whose ticket has reached it did its
  part, and a wait spins on while what is left of a large message moves (:func:`look`). Seen in
  a wait alone, the two cases look alike: a member in its previous call's wait had "arrived",
  and one done before the look never had.
* The rest of the line says which path a rank took at a group's call, where paths can differ
  (:func:`mark`, :func:`marks`): a rank that sums a large array through the group's shared
  segment, and one that waits in MPI for the same call (:mod:`mpidist.calls.nodereduce`).

Groups that span nodes, more than 64 local ranks, no C module, no ``/dev/shm`` or
``MPIDIST_BELL=0``: the mask is 0 and the waits spin and back off as before. Every ring is a
hint: a lost one costs a pause, never a result. The C side is in ``mpidist/calls/_native.c``,
handed over by :mod:`mpidist.calls.native` (:func:`use`), since this layer imports nothing above it.
"""

from __future__ import annotations

import mmap
import os
import sys
from typing import Any, Callable, Sequence

from mpi4py import MPI

from . import segments

#: Bytes per local rank (and for the futex words): one cache line each.
LINE = 64
#: Groups with members at local ranks past this use no bell (the mask is one 64-bit word).
MOST_LOCAL = 64
#: How long a wait spins while a member of its group is not in a wait yet, before it sleeps until
#: that member's arrival rings, per rank sharing a core (:data:`alone` is this times the node's
#: ranks per core): in a loop of calls, ranks that share cores arrive within a round of the
#: scheduler of each other; a rank that computes or loads data arrives much later.
ALONE_PER_RANK = 2e-4
#: Once every member has reached the call (its ticket), this much longer per byte the call moves (as the
#: wait's whole spin, :data:`mpidist.core.waiting.SPIN_PER_BYTE`: 16 MiB, 65 ms), counted from
#: the start or from when every member was last in one at once: a member out of its wait then
#: has done its part of the call, while this rank's part (copying a large message out of shared
#: memory, or on to the next rank of a tree) moves only while it tests. Gather and broadcast of
#: 1-16 MiB at 2 ranks were 4-8 % slower than mpi4py's without it; a gather of 16 MiB from each
#: of 4 ranks on 2 cores took 3-4 s (mpi4py: 27 ms): the ranks that had sent went on, and the
#: two still moving 32 MiB between them slept. Before tickets, a member counted as arrived once
#: seen in a wait: one whose part was done before the look looked late, and back-to-back gathers
#: of 1 MiB at 4 ranks took 38 ms each (mpi4py: 1.4 ms).
ALONE_PER_BYTE = 1 / 256e6
#: ``MPIDIST_BELL=0`` turns the bell off (every wait spins and backs off as before).
ALLOWED = os.environ.get("MPIDIST_BELL", "1").strip().lower() not in ("0", "off", "false", "no")

_impl: Any = None  # the C module's bell functions, from calls/native (use())
_page: mmap.mmap | None = None  # mapped for the life of the process: a sleeper may still use it
_words: memoryview | None = None  # the page as int64 words, for mark() and marks()
_slots: list[int] = []  # local rank of each global rank of the world, -1 on another node
why_not = "not opened"
alone = ALONE_PER_RANK  # this node's: see ALONE_PER_RANK


def use(module: Any) -> None:
    """Take the C functions (``bell_attach``, ``bell_enter``, ...) from ``module``; ``None``: none."""
    global _impl
    _impl = module


def on() -> bool:
    """Whether this process rings and sleeps on a bell."""
    return _page is not None


def open_for(comm: MPI.Intracomm) -> None:
    """Map the node's bell (first time only) and learn the local rank of each rank of ``comm``,
    the world. Collective over ``comm``: ``MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)``, a
    broadcast of the page's name on each node, a barrier, and one allgather."""
    global _slots, local_rank, local_size
    usable = _impl is not None and ALLOWED and sys.platform.startswith("linux") and os.path.isdir("/dev/shm")
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        local = local_rank = node.Get_rank()
        local_size = node.Get_size()
        # the node's ranks map it together or not at all (MPIDIST_BELL may differ between them)
        if node.allreduce(usable and _page is None, op=MPI.LAND):
            _map(node)
        key = _key if _page is not None else None
        places = comm.allgather((key, local))
    finally:
        node.Free()
    mine = places[comm.Get_rank()][0]
    _slots = [r if k is not None and k == mine else -1 for k, r in places]


_key: str | None = None
#: This process's rank on its node (``MPI_COMM_TYPE_SHARED``), learnt at init; ``-1`` before.
local_rank = -1
#: How many of the world's ranks run on this node, learnt at init; ``0`` before.
local_size = 0


def _map(node: MPI.Intracomm) -> None:
    """The node's page: its first rank creates it, every rank maps it, then the name goes."""
    global _page, _key, why_not, alone, _words
    page, name, why = segments.map_on_node(node, (node.Get_size() + 1) * LINE, "mpidist-bell")
    if page is None:
        why_not = why
        return
    import ctypes  # the page's address, for the C side

    alone = ALONE_PER_RANK * ranks_per_core(node.Get_size())
    _impl.bell_attach(ctypes.addressof(ctypes.c_char.from_buffer(page)), node.Get_rank(), alone,
                      ALONE_PER_BYTE)
    _page, _key, why_not = page, name, ""
    _words = memoryview(page).cast("q")


def alone_for(nbytes: int) -> float:
    """How long a wait for a call moving ``nbytes`` spins while a member is out of a wait, once
    every member has reached the call; before, a member out has not arrived: :data:`alone`."""
    return alone + nbytes * ALONE_PER_BYTE


def ranks_per_core(local: int) -> int:
    """How many of the node's ``local`` ranks share each core this rank may run on: 1 where the
    launcher bound the ranks to cores of their own (their cores times the ranks fit the node)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    machine = os.cpu_count() or cores
    if cores * local <= machine:
        return 1
    return -(-local // max(1, min(cores, machine)))


def state(local: int) -> str:
    """What the bell does for a job of ``local`` ranks on this node, as ``python -m mpidist info``
    says it: ``"on: ..."`` (opened at ``init_process_group``) or ``"off: ..."``, and why."""
    if _impl is None:
        return "off: the C module is not built (no C compiler at install)"
    if not ALLOWED:
        return "off: turned off (MPIDIST_BELL=0)"
    if not sys.platform.startswith("linux") or not os.path.isdir("/dev/shm"):
        return "off: it needs Linux's futex and /dev/shm"
    if _page is None and why_not != "not opened":
        return f"off: {why_not}"
    share = ranks_per_core(local)
    return (f"on: waits on one node sleep while a peer is away, after a spin of "
            f"{ALONE_PER_RANK * share * 1e3:.1f} ms ({share} rank(s) per core)")


def mask(ranks: Sequence[int]) -> int:
    """The bell mask of a group of these global ranks: a bit per member's local rank where all
    run on this node (and there are two or more), else 0 (no bell: spin and back off)."""
    if _page is None or len(ranks) < 2:
        return 0
    bits = 0
    for r in ranks:
        s = _slots[r] if 0 <= r < len(_slots) else -1
        if not 0 <= s < MOST_LOCAL:
            return 0
        bits |= 1 << s
    return bits


def renumber(old_ranks: Sequence[int]) -> None:
    """The world was shrunk: its rank ``i`` is the old world's ``old_ranks[i]``."""
    global _slots
    _slots = [_slots[r] if 0 <= r < len(_slots) else -1 for r in old_ranks]


def enter(ticket: int = 0) -> None:
    """This thread starts a wait (and rings the bell), for the group's call of ``ticket``
    (:func:`ticket`; 0: no call of a group, as a point-to-point wait)."""
    _impl.bell_enter(1, ticket)


def leave() -> None:
    """This thread's wait is over."""
    _impl.bell_enter(-1)


def ring() -> None:
    """Wake whoever sleeps on the bell, counting no wait (one atomic load where nobody sleeps)."""
    _impl.bell_ring()


def ticket(bits: int, seq: int) -> int:
    """The ticket of call number ``seq`` of the group of mask ``bits``: a wait for it publishes
    it, so that a member's wait tells a member that has not reached the call (it will ring when
    it does: sleep) from one that did its part of it and went on (spin while the others move
    the rest)."""
    return _impl.bell_ticket(bits, seq)


def arrive(bits: int, seq: int) -> int:
    """This rank has reached call number ``seq`` of the group of mask ``bits``: its
    :func:`ticket`, published (0 for ``seq`` 0: no call, as a point-to-point wait's)."""
    return _impl.bell_arrive(bits, seq)


def in_now(bits: int) -> int:
    """The bits of the mask ``bits`` whose members are in a wait now."""
    return _impl.bell_in(bits)


def all_in(bits: int) -> bool:
    """Every member of the mask ``bits`` is in a wait."""
    return _impl.bell_all_in(bits)


#: What :func:`look` says, as bits: stop spinning; a member has not reached the call yet.
STOP, LATE = 1, 2


def watch() -> bytearray:
    """A spinning wait's record of its group (for :func:`look`), started now."""
    return _impl.bell_watch()


def look(state: bytearray, bits: int, ticket: int, gone: float) -> int:
    """Whether a wait for the call of ``ticket`` on the group of mask ``bits`` spins on
    (:data:`STOP` clear), and whether a member has not reached the call (:data:`LATE`). It spins
    while every member is in a wait, and otherwise for a while since they last were (or since
    ``state`` began): :data:`alone` seconds while a member has not reached the call (it rings
    when it arrives), ``gone`` seconds once every member has (those out did their part, and a
    large message still moves only while this rank tests). Without a ticket, a member counts as
    arrived once ``state`` has seen it in a wait."""
    return _impl.bell_look(state, bits, ticket, alone, gone)


#: What :func:`nap` saw: a ring, a group it may spin for (see :func:`look`), or only its time passing.
RANG, SPIN, SLEPT = 1, 2, 3


def nap(done: Callable[[], bool], seconds: float, bits: int, spin: bool, state: bytearray,
        ticket: int = 0, gone: float = 0.0) -> int | None:
    """Sleep on the bell for up to ``seconds``: ``None`` if ``done()`` became true first,
    :data:`SPIN` at once where the caller may ``spin`` and :func:`look` (with ``state``,
    ``ticket`` and ``gone``) says to spin on with no member late, else :data:`RANG` or
    :data:`SLEPT` (a member not in the call yet rings when it arrives: the spin it is owed
    follows that ring).

    Both are looked at after arming: a member that enters after the look rings a sleeper it
    sees, and one that entered before it is seen, so no arrival falls between the two."""
    seen = _impl.bell_arm()
    if done():
        _impl.bell_disarm()
        return None
    if spin and not _impl.bell_look(state, bits, ticket, alone, gone):  # nobody late, and no stop
        _impl.bell_disarm()
        return SPIN
    return RANG if _impl.bell_sleep(seen, seconds) else SLEPT


#: Where a rank's line (as int64 words; word 0 counts its waits, word 1 holds its ticket) says
#: which path it took at a call: each a key (:func:`mpidist.core.timeouts.call_key`), then the
#: count and the dtype and call of what it passed. ``SEG``: it sums that call through the group's
#: shared segment; ``CROSSED``: it waits in MPI for that call and saw a member at ``SEG``.
SEG, CROSSED = 2, 5


def mark(word: int, key: int, count: int, info: int) -> None:
    """Publish in this rank's line, at ``word`` (:data:`SEG` or :data:`CROSSED`), that it is at
    the call of ``key`` with ``count`` elements (``info``: dtype number and call id). The key goes
    last: a peer that reads it reads this call's count (one aligned 8-byte store each)."""
    if _words is not None:
        at = (local_rank + 1) * (LINE // 8) + word
        _words[at + 1], _words[at + 2] = count, info
        _words[at] = key


def marks(bits: int, token: int) -> list[tuple[int, int, int, int, int]]:
    """``(local rank, word, key, count, info)`` for each :data:`SEG` or :data:`CROSSED` word of
    the members of the mask ``bits`` that holds a key of the group ``token`` (the key's high half)."""
    found: list[tuple[int, int, int, int, int]] = []
    if _words is None:
        return found
    for i in range(min(bits.bit_length(), MOST_LOCAL)):
        if bits >> i & 1:
            line = (i + 1) * (LINE // 8)
            for word in (SEG, CROSSED):
                key = _words[line + word]
                if key >> 32 == token:
                    found.append((i, word, key, _words[line + word + 1], _words[line + word + 2]))
    return found


def all_marked(bits: int, key: int) -> bool:
    """Every member of the mask ``bits`` holds ``key`` at :data:`SEG`."""
    if _words is None:
        return False
    per = LINE // 8
    return all(_words[(i + 1) * per + SEG] == key for i in range(min(bits.bit_length(), MOST_LOCAL))
               if bits >> i & 1)


def global_ranks(ranks: Sequence[int]) -> dict[int, int]:
    """Local rank -> global rank, for the members ``ranks`` (global) that run on this node."""
    return {_slots[r]: r for r in ranks if 0 <= r < len(_slots) and _slots[r] >= 0}

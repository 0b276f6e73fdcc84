"""Debug mode: ``MPIDIST_DEBUG=OFF|INFO|DETAIL`` — log every collective, or check it on all ranks first.

MPI trusts every rank to call the same collective with matching arguments; when one rank
passes another shape, dtype, op or root the job deadlocks or silently corrupts data.

* ``INFO`` logs each collective (logger ``"mpidist"``) with its per-group sequence number
  and the time it took to return.
* ``DETAIL`` adds a check before the real MPI call: each rank hashes a fingerprint of
  its call (name, sequence number, group, op, root, dtype and shape of every array) and
  one ``MPI_Allreduce`` of two integers (MAX of ``h`` and ``-h``) tells every rank whether
  all hashes agree. Only on a mismatch do the ranks ``MPI_Allgather`` the fingerprints
  themselves, and then every rank raises the *same* ``ValueError`` naming the call, its
  sequence number and each rank's differing value, e.g.
  ``all_reduce #57: 'tensor': rank 0 passed float32 (4,), rank 1 passed float32 (5,)``.
  No MPI collective has started at that point, so the runtime stays usable.

A rank whose own argument checks fail (a wrong-typed tensor, a missing ``gather_list``)
takes part in the exchange with its error instead of raising alone, so its peers raise
too instead of waiting in the collective forever. Collectives whose counts legitimately
differ per rank (``all_to_all``, ``all_to_all_single``) always exchange the counts and
check that what rank i sends to rank j is what rank j expects from rank i.

Every rank must use the same level (an exchange on some ranks only would not match).
"""

from __future__ import annotations

import enum
import hashlib
import logging
import os
import sys
import threading
import time
import weakref
from typing import Any, Callable, NamedTuple

import numpy as np
from mpi4py import MPI

from . import calls, errors
from .calls import Call
from .groups import ProcessGroup, resolve


class DebugLevel(enum.IntEnum):
    """torch.distributed's debug levels."""

    OFF = 0
    INFO = 1
    DETAIL = 2


#: The current level as a plain int: the one global the collectives test on their fast path.
LEVEL: int = 0

log = logging.getLogger("mpidist")
_tls = threading.local()
_seq: weakref.WeakKeyDictionary[ProcessGroup, int] = weakref.WeakKeyDictionary()


def _parse(level: Any) -> DebugLevel:
    if isinstance(level, DebugLevel):
        return level
    if isinstance(level, str):
        name = level.strip().upper() or "OFF"
        if name in DebugLevel.__members__:
            return DebugLevel[name]
    elif isinstance(level, int) and not isinstance(level, bool) and level in (0, 1, 2):
        return DebugLevel(level)
    raise errors.value_error("set_debug_level", f"level must be OFF, INFO or DETAIL, got {level!r}")


def set_debug_level(level: DebugLevel | str | int) -> None:
    """Set the debug level on this rank (every rank of a job must set the same level).

    ``level`` is a :class:`DebugLevel`, its name (``"DETAIL"``) or its value. ``INFO``
    and ``DETAIL`` also send the ``"mpidist"`` logger's records to stderr when no
    handler is configured for it.
    """
    global LEVEL
    lv = _parse(level)
    if lv and not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
        log.addHandler(handler)
    if lv and log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)
    LEVEL = int(lv)
    calls.set_hook("debug", run if LEVEL else None)


def get_debug_level() -> DebugLevel:
    """The current :class:`DebugLevel`."""
    return DebugLevel(LEVEL)


def set_debug_level_from_env() -> None:
    """Read ``MPIDIST_DEBUG`` (``OFF``, ``INFO`` or ``DETAIL``; unset means ``OFF``)."""
    value = os.environ.get("MPIDIST_DEBUG", "OFF")
    try:
        set_debug_level(value)
    except ValueError:
        raise errors.value_error(
            "set_debug_level_from_env", f"MPIDIST_DEBUG={value!r} is not one of OFF, INFO, DETAIL"
        ) from None


def last_seq(pg: ProcessGroup) -> int | None:
    """The sequence number of the last checked or logged call on ``pg`` (``None`` before any)."""
    return _seq.get(pg)


class _Pending(NamedTuple):
    pg: ProcessGroup
    call: str
    seq: int
    fields: dict[str, str]
    pair: Any


class _Info(NamedTuple):
    """One rank's side of the exchange, sent only when something differs."""

    rank: int
    call: str
    seq: int
    fields: dict[str, str]
    pair: Any
    error: str | None
    error_type: str | None


# ---------------------------------------------------------------- the call path

def _next_seq(pg: ProcessGroup) -> int:
    n = _seq.get(pg, 0) + 1
    _seq[pg] = n
    return n


def run(call: Call, body: Callable[..., Any], args: dict[str, Any]) -> Any:
    """Run ``body(**args)`` logged (INFO) and, for collectives, checked across the group (DETAIL).

    The hook of every declared call while the level is not ``OFF``. A call made inside
    another (mpidist calling itself) runs unhooked: only the outermost call is checked.
    """
    if getattr(_tls, "inside", False) or call.fingerprint is None:
        return body(**args)
    try:
        pg = resolve(args.get(call.group_arg), call.name)
    except Exception:
        pg = None  # body raises the same error itself; a non-member takes part in nothing
    pending = None
    if pg is not None:
        seq = _next_seq(pg)
        if LEVEL >= DebugLevel.DETAIL:
            try:
                fields, pair = call.fingerprint(pg, args, call.name)
            except Exception as exc:  # arguments so wrong they cannot be described
                fields, pair = {"group": pg.group_name, "arguments": f"unreadable ({exc!r})"}, None
            pending = _Pending(pg, call.name, seq, fields, pair)
    _tls.inside, _tls.pending = True, pending
    t0 = time.perf_counter()
    try:
        out = body(**args)
    except Exception as exc:
        left = _tls.pending
        _tls.pending = None
        if left is not None:  # failed its own checks before the exchange: tell the peers
            _exchange(left, exc)
        raise
    finally:
        _tls.inside = False
    left, _tls.pending = _tls.pending, None
    if left is not None:  # returned without an MPI call (nothing to send): still agree
        _exchange(left, None)
    if pg is not None:
        log.info("rank %d: %s #%d on group %s%s: %.1f us", errors.WORLD_RANK, call.name, seq,
                 pg.group_name, " (async)" if args.get("async_op") else "",
                 (time.perf_counter() - t0) * 1e6)
    return out


def check(pg: ProcessGroup) -> None:
    """The exchange itself, called right before the MPI call; a no-op outside DETAIL's :func:`run`."""
    p = getattr(_tls, "pending", None)
    if p is not None and p.pg is pg:
        _tls.pending = None
        _exchange(p, None)


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 2


def _exchange(p: _Pending, exc: BaseException | None) -> None:
    """Agree with the group on the call; raise the group's error on every rank on a mismatch."""
    comm = p.pg.comm
    if p.pair is None:
        text = "|".join([p.call, str(p.seq), *(f"{k}={v}" for k, v in p.fields.items())])
        if exc is not None:
            text += f"|!{type(exc).__name__}"
        h = _hash(text)
        both = np.array([h, -h], np.int64)
        comm.Allreduce(MPI.IN_PLACE, [both, MPI.INT64_T], MPI.MAX)
        if both[0] == -both[1]:
            return  # every rank agrees (an error shared by all is raised by each, as without DETAIL)
    me = _Info(errors.WORLD_RANK, p.call, p.seq, p.fields, p.pair,
               None if exc is None else str(exc), None if exc is None else type(exc).__name__)
    found = compare(comm.allgather(me), p.pg)
    if found is not None:
        kind, msg = found
        raise kind(msg) from exc


def _ranks(rs: list[int]) -> str:
    return f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(map(str, rs))


def _by_value(pairs: list[tuple[int, str]], verb: str) -> str:
    groups: dict[str, list[int]] = {}
    for r, v in pairs:
        groups.setdefault(v, []).append(r)
    return ", ".join(f"{_ranks(rs)} {verb} {v}" for v, rs in groups.items())


_ERROR_TYPES = {"TypeError": TypeError, "ValueError": ValueError, "RuntimeError": RuntimeError}


def compare(infos: list[_Info], pg: ProcessGroup) -> tuple[type[Exception], str] | None:
    """The error every rank raises for these fingerprints (the same on every rank), or ``None``."""
    head = f"{infos[0].call} #{infos[0].seq}"
    if len({i.call for i in infos}) > 1 or len({i.seq for i in infos}) > 1:
        calls = _by_value([(i.rank, f"{i.call} #{i.seq}") for i in infos], "called")
        return ValueError, f"{head}: the ranks called different collectives on group " \
                           f"{pg.group_name}: {calls}"
    parts = []
    for key in infos[0].fields:
        vals = [(i.rank, i.fields.get(key, "-")) for i in infos]
        if len({v for _, v in vals}) > 1:
            parts.append(f"'{key}': {_by_value(vals, 'passed')}")
    if infos[0].pair is not None and not parts:
        for i, src in enumerate(infos):
            for j, dst in enumerate(infos):
                sends, wants = src.pair[0], dst.pair[1]
                if j < len(sends) and i < len(wants) and sends[j] != wants[i]:
                    parts.append(f"rank {src.rank} sends {sends[j]} elements to rank {dst.rank}, "
                                 f"which expects {wants[i]}")
    failed = [i for i in infos if i.error is not None]
    for i in failed:
        parts.append(f"rank {i.rank} raised {i.error_type}: {i.error}")
    if not parts:
        return None
    kind = _ERROR_TYPES.get(failed[0].error_type, RuntimeError) if failed else ValueError
    return kind, f"{head}: " + "; ".join(parts)


set_debug_level_from_env()

"""Debug mode: ``MPIDIST_DEBUG=OFF|INFO|DETAIL`` — log every collective, or check it on all ranks first.

MPI trusts every rank to call the same collective with matching arguments; when one rank
passes another shape, dtype, op or root the job deadlocks or silently corrupts data.

* ``INFO`` logs each collective (logger ``"mpidist"``) with its per-group sequence number
  and the time it took to return.
* ``DETAIL`` checks every collective before its MPI routine starts: each rank hashes the
  call's signature (what the default check of :mod:`.signature` records: the call, count,
  dtype, op, root) with its sequence number, and one ``MPI_Iallreduce`` of two integers (MAX
  of ``h`` and ``-h``) tells every rank whether all hashes agree. Only on a mismatch do the
  ranks describe their arguments (:mod:`.fingerprint`) and ``MPI_Allgather`` those, and then
  every rank raises the *same* ``ValueError`` naming the call, its sequence number and each
  rank's differing value, e.g.
  ``all_reduce #57: 'tensor': rank 0 passed float32 (4,), rank 1 passed float32 (5,)``.
  No MPI collective has started at that point, so the runtime stays usable.

A rank whose own argument checks fail (a wrong-typed tensor, a missing ``gather_list``)
takes part in the exchange with its error instead of raising alone, so its peers raise
too instead of waiting in the collective forever. Collectives whose counts legitimately
differ per rank (``all_to_all``, ``all_to_all_single``) always exchange the counts and
check that what rank i sends to rank j is what rank j expects from rank i.

Every rank must use the same level (an exchange on some ranks only would not match). Unset,
``MPIDIST_DEBUG`` leaves the level ``OFF`` with the sampled default check of :mod:`.signature`
on; ``MPIDIST_DEBUG=OFF`` turns that off too.
"""

from __future__ import annotations

import enum
import logging
import os
import sys
import threading
import time
from typing import Any, Callable, NamedTuple

from ..core import errors, registry, settings
from ..core.groups import ProcessGroup, resolve
from ..core.registry import Call
from . import signature
from .signature import by_value


class DebugLevel(enum.IntEnum):
    """torch.distributed's debug levels."""

    OFF = 0
    INFO = 1
    DETAIL = 2


#: The current level as a plain int: the one global the collectives test on their fast path.
LEVEL: int = 0

log = logging.getLogger("mpidist")
_tls = threading.local()


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
    registry.set_hook("debug", run if LEVEL else None)


def get_debug_level() -> DebugLevel:
    """The current :class:`DebugLevel`."""
    return DebugLevel(LEVEL)


def set_debug_level_from_env() -> None:
    """Read ``MPIDIST_DEBUG`` (``OFF``, ``INFO`` or ``DETAIL``; unset: the default cross-rank check).

    Unset or empty leaves the level ``OFF`` with the default check of
    :mod:`mpidist.checks.signature` on; ``OFF`` itself turns that check off too.
    """
    try:
        value = settings.choice("MPIDIST_DEBUG")
    except ValueError as exc:
        raise errors.value_error("set_debug_level_from_env", str(exc)) from None
    set_debug_level(value or "OFF")
    signature.enable(value != "OFF")


def set_debug_level_from_torch_env() -> None:
    """For the torch backend: ``TORCH_DISTRIBUTED_DEBUG=INFO``/``DETAIL`` (torch's name for the
    switch) set the same level here, unless ``MPIDIST_DEBUG`` is set; anything else changes nothing."""
    value = os.environ.get("TORCH_DISTRIBUTED_DEBUG", "").strip().upper()
    if value in ("INFO", "DETAIL") and not settings.is_set("MPIDIST_DEBUG"):
        set_debug_level(value)


def last_seq(pg: ProcessGroup) -> int | None:
    """The number of the last collective checked or recorded on ``pg`` (``None`` before any)."""
    return pg.signatures.n if pg.signatures is not None and pg.signatures.n else None


class _Pending(NamedTuple):
    """An outermost call under DETAIL whose check has not run yet."""

    call: Call
    args: dict[str, Any]


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

def _group(call: Call, args: dict[str, Any]) -> ProcessGroup | None:
    try:
        return resolve(args.get(call.group_arg), call.name)
    except Exception:
        return None  # the body raises the same error itself; a non-member takes part in nothing


def run(call: Call, body: Callable[..., Any], args: dict[str, Any]) -> Any:
    """Run ``body(**args)`` logged (INFO) and, for collectives, checked across the group (DETAIL).

    The hook of every declared call while the level is not ``OFF``. A call made inside
    another (mpidist calling itself) runs unhooked: only the outermost call is checked.
    Under DETAIL the check itself runs from the call path (:func:`check`), with the call's
    signature; here only a call that fails its own checks, or returns without an MPI call,
    still takes part in it.
    """
    if getattr(_tls, "inside", False) or call.fingerprint is None:
        return body(**args)
    _tls.inside = True
    _tls.pending = _Pending(call, args) if LEVEL >= DebugLevel.DETAIL else None
    t0 = time.perf_counter()
    try:
        out = body(**args)
    except Exception as exc:
        left, _tls.pending = _tls.pending, None
        if left is not None:  # failed its own checks before the exchange: tell the peers
            _settle(left, None, None, None, exc)
        raise
    finally:
        _tls.inside = False
    left, _tls.pending = _tls.pending, None
    if left is not None:  # returned without an MPI call (nothing to send): still agree
        _settle(left, None, None, None, None)
    if log.isEnabledFor(logging.INFO):
        pg = _group(call, args)
        if pg is not None:
            log.info("rank %d: %s #%d on group %s%s: %.1f us", errors.WORLD_RANK, call.name, pg.seq,
                     pg.group_name, " (async)" if args.get("async_op") else "",
                     (time.perf_counter() - t0) * 1e6)
    return out


def check(pg: ProcessGroup, sig: tuple | None = None, pairs: Any = None) -> None:
    """DETAIL's exchange, right before the call's first MPI routine; a no-op outside :func:`run`.

    ``sig`` is what the call records for the default check (:mod:`.signature`), ``pairs`` an
    all-to-all's counts sent to and expected from each peer.
    """
    p = getattr(_tls, "pending", None)
    if p is not None:
        _tls.pending = None
        _settle(p, pg, sig, pairs, None)


def _settle(p: _Pending, pg: ProcessGroup | None, sig: tuple | None, pairs: Any,
            exc: BaseException | None) -> None:
    """Agree with the group on the call; raise the group's error on every rank on a mismatch.

    One ``MPI_Iallreduce`` of the signature's hash (:func:`.signature.agreed`); the fingerprints
    (:mod:`.fingerprint`) are made and ``MPI_Allgather``-ed only when the hashes differ, or
    always for an all-to-all, whose counts differ per rank by design.
    """
    pg = pg or _group(p.call, p.args)
    if pg is None:
        return
    rec = signature.record_of(pg)
    seq = rec.n + 1  # collectives that agreed: the same on every rank
    passing = exc is None and sig is not None  # the call path's check: on agreement, the call is counted
    pairwise = getattr(p.call.fingerprint, "pairwise", False)
    if not pairwise:
        mark = f"!{type(exc).__name__}" if exc is not None else sig[1:] if sig else "no MPI call"
        if signature.agreed(pg, p.call, signature.digest((p.call.name, seq, mark))):
            rec.n += passing  # every rank agrees (an error shared by all is raised by each)
            return
    try:
        fields, pair = p.call.fingerprint(pg, p.args, p.call.name)
    except Exception as err:  # arguments so wrong they cannot be described
        fields, pair = {"group": pg.group_name, "arguments": f"unreadable ({err!r})"}, None
    me = _Info(errors.WORLD_RANK, p.call.name, seq, fields, pairs or pair,
               None if exc is None else str(exc), None if exc is None else type(exc).__name__)
    found = compare(pg.comm.allgather(me), pg)
    if found is not None:
        kind, msg = found
        raise kind(msg) from exc
    rec.n += passing


_ERROR_TYPES = {"TypeError": TypeError, "ValueError": ValueError, "RuntimeError": RuntimeError}


def compare(infos: list[_Info], pg: ProcessGroup) -> tuple[type[Exception], str] | None:
    """The error every rank raises for these fingerprints (the same on every rank), or ``None``."""
    head = f"{infos[0].call} #{infos[0].seq}"
    if len({i.call for i in infos}) > 1 or len({i.seq for i in infos}) > 1:
        calls = by_value([(i.rank, f"{i.call} #{i.seq}") for i in infos], "called")
        return ValueError, f"{head}: the ranks called different collectives on group " \
                           f"{pg.group_name}: {calls}"
    parts = []
    for key in infos[0].fields:
        vals = [(i.rank, i.fields.get(key, "-")) for i in infos]
        if len({v for _, v in vals}) > 1:
            parts.append(f"'{key}': {by_value(vals, 'passed')}")
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

"""Rank-aware output: only the master prints, ``logging`` says which rank wrote a record.

:func:`setup_for_distributed` replaces ``builtins.print`` so that non-master ranks are
quiet unless they pass ``force=True`` (the DETR/DeiT convention);
:func:`prefix_logging` prefixes every ``logging`` record with ``[rank N]``;
:func:`restore` undoes both. No MPI call is made here.
"""

from __future__ import annotations

import builtins
import logging
from typing import Any, Callable

_original_print: Callable[..., None] | None = None
_original_factory: Callable[..., logging.LogRecord] | None = None


def setup_for_distributed(is_master: bool) -> None:
    """Make ``print`` write only when ``is_master`` or when called with ``force=True``.

    Each call reaches the stream as one write, so whole lines of different ranks never
    interleave mid-line, even unbuffered. Calling it again replaces the previous setting;
    :func:`restore` brings back the original ``print``.
    """
    global _original_print
    if _original_print is None:
        _original_print = builtins.print
    real = _original_print

    def print(*args: Any, sep: str | None = " ", end: str | None = "\n", file: Any = None,  # noqa: A001
              flush: bool = False, force: bool = False) -> None:
        if is_master or force:
            # one write per call: unbuffered (python -u), print writes each piece on its own
            # and lines of different ranks interleave mid-line
            text = (" " if sep is None else sep).join(map(str, args)) + ("\n" if end is None else end)
            real(text, end="", file=file, flush=flush)

    builtins.print = print


def prefix_logging(rank: int) -> None:
    """Prefix the message of every ``logging`` record created from now on with ``[rank N]``.

    Works through the log-record factory, so handlers and formatters configured before
    or after the call all see the prefix.
    """
    global _original_factory
    if _original_factory is None:
        _original_factory = logging.getLogRecordFactory()
    make = _original_factory
    tag = f"[rank {rank}] "

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        record.rank = rank
        record.msg = tag + str(record.msg)
        return record

    logging.setLogRecordFactory(factory)


def restore() -> None:
    """Undo :func:`setup_for_distributed` and :func:`prefix_logging`."""
    global _original_print, _original_factory
    if _original_print is not None:
        builtins.print = _original_print
        _original_print = None
    if _original_factory is not None:
        logging.setLogRecordFactory(_original_factory)
        _original_factory = None

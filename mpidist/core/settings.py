"""Every ``MPIDIST_*`` environment variable mpidist reads: one table, one way to read each.

:data:`SETTINGS` declares each variable's name, kind, default and meaning (docs/environment.md
lists the same). Modules read a value through the function for its kind: :func:`flag`,
:func:`integer`, :func:`seconds`, :func:`choice`, :func:`path` (and :func:`is_set`). Each reads
``os.environ`` when called, so a value set before the call counts; a module that caches a value
does so at its own import. Unset and blank are the same: the default.

One spelling of true and false for every flag: ``1``, ``true``, ``yes``, ``on`` and ``0``,
``false``, ``no``, ``off``, in any case, surrounding whitespace ignored. Anything else raises a
``ValueError`` naming the variable, the value and what it accepts.

Imports: the standard library only. :mod:`mpidist.start.thread_level` and
:mod:`mpidist.start.startup` read settings before ``mpi4py.MPI`` initialises MPI, and
:mod:`.errors` imports ``mpi4py.MPI``; callers that want the call and rank in a message wrap
the ``ValueError`` with :func:`mpidist.core.errors.value_error`.
"""

from __future__ import annotations

import math
import os
from typing import Mapping, NamedTuple


class Setting(NamedTuple):
    """One environment variable: its name, kind, default (``None``: unset) and meaning."""

    name: str
    kind: str  # "flag", "int", "seconds", "choice" or "path"
    default: bool | int | float | str | None
    meaning: str
    choices: tuple[str, ...] = ()


TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
#: Spellings of 0 seconds for a bound or a watch that 0 turns off.
OFF_SECONDS = ("off", "none")

SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("MPIDIST_DEBUG", "choice", None,
            "unset: the sampled cross-rank argument check; OFF turns it off; INFO logs each "
            "collective; DETAIL checks every collective on all ranks", ("OFF", "INFO", "DETAIL")),
    Setting("MPIDIST_ABORT_ON_ERROR", "flag", True,
            "an uncaught exception or early exit on one rank ends the job (MPI_Abort)"),
    Setting("MPIDIST_EXIT_TIMEOUT", "seconds", None,
            "how long an exiting rank waits for its peers (unset: the group's timeout; "
            "60 s where a job that survives failures exits)"),
    Setting("MPIDIST_STALL_WARN_S", "seconds", 60.0,
            "seconds a call may wait before the stall watch reports it (0 turns the watch off)"),
    Setting("MPIDIST_INIT_TIMEOUT_S", "seconds", 300.0,
            "seconds a launched process may wait in MPI_Init for the others (0 turns it off)"),
    Setting("MPIDIST_THREAD_LEVEL", "choice", None,
            "the MPI thread level asked for (unset: mpi4py's, multiple)",
            ("single", "funneled", "serialized", "multiple")),
    Setting("MPIDIST_MALLOC", "flag", True,
            "raise glibc's mmap and trim thresholds at init_process_group (mpidist/start/heap.py)"),
    Setting("MPIDIST_CUDA_AWARE", "flag", None,
            "whether MPI reads and writes device memory (unset: ask MPIX_Query_cuda_support)"),
    Setting("MPIDIST_SPARES", "int", 0,
            "the last N processes of MPI_COMM_WORLD wait as spares for heal_group (0: none)"),
    Setting("MPIDIST_FLIGHT_RECORDER", "int", 0,
            "calls each rank's flight recorder keeps (0: off)"),
    Setting("MPIDIST_FLIGHT_DIR", "path", ".",
            "where the flight recorder writes mpidist-flight-rank<R>.json"),
    Setting("MPIDIST_TORCH_SYNC_BYTES", "int", None,
            "torch backend: asynchronous calls up to this many bytes run the blocking MPI call "
            "(unset: 64 MiB on one node, 0 across nodes)"),
    Setting("MPIDIST_TORCH_POLL_MIN", "seconds", 20e-6,
            "torch backend: the progress thread's first pause between tests"),
    Setting("MPIDIST_TORCH_POLL_MAX", "seconds", 500e-6,
            "torch backend: the progress thread's longest pause between tests"),
)}


def _raw(name: str, kind: str, env: Mapping[str, str] | None) -> tuple[Setting, str]:
    """The declared setting and its stripped value ("" when unset)."""
    setting = SETTINGS[name]  # a KeyError here is a variable missing from the table
    if setting.kind != kind:
        raise TypeError(f"{name} is a {setting.kind} setting, not a {kind} one")
    return setting, (os.environ if env is None else env).get(name, "").strip()


def is_set(name: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether ``name`` has a value (not unset, not blank)."""
    return bool((os.environ if env is None else env).get(SETTINGS[name].name, "").strip())


def flag(name: str, env: Mapping[str, str] | None = None) -> bool | None:
    """A flag's value.

    Parameters
    ----------
    name
        The variable, as declared in :data:`SETTINGS` (every reader below takes the same).
    env
        Where to read it (default ``os.environ``; a mapping lets a caller judge another environment).

    Returns
    -------
    bool or None
        ``True`` or ``False``; the declared default when unset or blank.

    Raises
    ------
    ValueError
        For any other spelling, naming the variable, the value and the accepted spellings.
    """
    setting, raw = _raw(name, "flag", env)
    if not raw:
        return setting.default  # type: ignore[return-value]
    if raw.lower() in TRUE:
        return True
    if raw.lower() in FALSE:
        return False
    raise ValueError(f"{name}={raw!r} is not a flag: use {', '.join(TRUE)} for true "
                     f"or {', '.join(FALSE)} for false")


def integer(name: str, env: Mapping[str, str] | None = None) -> int | None:
    """A whole number of 0 or more; the default when unset.

    Raises
    ------
    ValueError
        For anything else, naming the variable and the value.
    """
    setting, raw = _raw(name, "int", env)
    if not raw:
        return setting.default  # type: ignore[return-value]
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{name}={raw!r} is not a whole number of 0 or more")
    return value


def seconds(name: str, env: Mapping[str, str] | None = None) -> float | None:
    """A number of seconds, 0 or more (``off`` and ``none`` are 0); the default when unset.

    Raises
    ------
    ValueError
        For anything else (a negative number, ``nan``, a word), naming the variable and the value.
    """
    setting, raw = _raw(name, "seconds", env)
    if not raw:
        return setting.default  # type: ignore[return-value]
    if raw.lower() in OFF_SECONDS:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value >= 0:  # also refuses nan
        raise ValueError(f"{name}={raw!r} is not a number of seconds (0 or more, or off)")
    return value


def choice(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """One of the declared choices, in the table's spelling (any case accepted); the default when unset.

    Raises
    ------
    ValueError
        For anything else, naming the variable, the value and the choices.
    """
    setting, raw = _raw(name, "choice", env)
    if not raw:
        return setting.default  # type: ignore[return-value]
    for option in setting.choices:
        if raw.lower() == option.lower():
            return option
    raise ValueError(f"{name}={raw!r} is not one of {', '.join(setting.choices)}")


def path(name: str, env: Mapping[str, str] | None = None) -> str:
    """A file system path; the default when unset."""
    setting, raw = _raw(name, "path", env)
    return raw or str(setting.default)

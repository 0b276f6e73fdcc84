"""Error construction: every message names the call, the rank and the offending value.

Argument checks that a rank can make on its own raise here, locally, without a
collective, so a bad call fails on the rank that made it and the runtime stays usable.
An error MPI itself raises while a call runs (a ``mpi4py.MPI.Exception``) becomes an mpidist
error in one place, :func:`from_mpi`.
"""

from __future__ import annotations

from typing import Any, Sequence

from mpi4py import MPI

#: This process's rank in ``MPI_COMM_WORLD``; known from MPI initialisation on.
WORLD_RANK: int = MPI.COMM_WORLD.Get_rank()


def message(call: str, text: str) -> str:
    """``"<call>: rank <r>: <text>"``, the form every mpidist error uses."""
    return f"{call}: rank {WORLD_RANK}: {text}"


def value_error(call: str, text: str) -> ValueError:
    return ValueError(message(call, text))


def type_error(call: str, text: str) -> TypeError:
    return TypeError(message(call, text))


def runtime_error(call: str, text: str) -> RuntimeError:
    return RuntimeError(message(call, text))


def type_name(obj: object) -> str:
    """The qualified type name users recognise (``numpy.ndarray``, ``torch.Tensor``, ``list``)."""
    t = type(obj)
    mod = t.__module__
    if mod in ("builtins", None):
        return t.__qualname__
    return f"{mod.split('.')[0]}.{t.__qualname__}"


class NotAMemberError(ValueError):
    """A call named a group this rank is not a member of (``GroupMember.NON_GROUP_MEMBER``).

    The declared calls do what torch does there: warn and return without communicating
    (:func:`mpidist.core.registry.define`); anything else that needs the group sees a ``ValueError``.
    """


class MPICallError(RuntimeError):
    """An MPI routine failed while a call ran; ``mpi_error_class`` is MPI's error class."""

    mpi_error_class: int = MPI.SUCCESS


def from_mpi(exc: MPI.Exception, call: Any, pg: Any,
             statuses: Sequence[MPI.Status] | None = None) -> Exception:
    """The mpidist error for ``exc``, raised by MPI while ``call`` ran on group ``pg``.

    The one place a raw ``mpi4py.MPI.Exception`` is turned into mpidist's: every completion
    path (:func:`mpidist.core.timeouts.wait` and ``until``, the blocking one-rank routine, a
    Work's test) raises what this returns. A truncated message (ranks that passed different
    counts) is a ``ValueError``; anything else an :class:`MPICallError`. Both name the call,
    its sequence number, the group and this rank, and keep MPI's class as ``mpi_error_class``.
    """
    cls = exc.Get_error_class()
    code = exc.Get_error_code()
    if cls == MPI.ERR_IN_STATUS:  # Testall: each request's own error is in its status
        for st in statuses or ():
            if st.Get_error() != MPI.SUCCESS:
                code = st.Get_error()
                cls = MPI.Get_error_class(code)
                break
    name = getattr(pg, "group_name", "?")
    where = f"{call} #{getattr(pg, 'seq', '?')} on group {name!r}"
    said = MPI.Get_error_string(code).strip()
    if cls == MPI.ERR_TRUNCATE or "truncat" in said.lower():
        err: Exception = ValueError(message(call, f"{where}: a message was larger than its buffer "
                                            f"({said}): the ranks passed different counts"))
    else:
        hint = (" (a count or datatype that differs between ranks is the usual cause)"
                if cls in (MPI.ERR_IN_STATUS, MPI.ERR_OTHER, MPI.ERR_COUNT) else "")
        err = MPICallError(message(call, f"{where}: MPI error class {cls}: {said}{hint}"))
    err.mpi_error_class = cls  # type: ignore[attr-defined]
    return err

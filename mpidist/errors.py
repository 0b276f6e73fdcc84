"""Error construction: every message names the call, the rank and the offending value.

Argument checks that a rank can make on its own raise here, locally, without a
collective, so a bad call fails on the rank that made it and the runtime stays usable.
"""

from __future__ import annotations

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

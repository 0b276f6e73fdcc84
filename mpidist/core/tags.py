"""The MPI tag layout of a group's communicator: who may use which tags.

* user tags ``0..MAX_TAG`` of ``send``/``recv`` travel as the even MPI tags ``2 * tag``;
* object messages (``send_object_list``) as the odd ones ``2 * tag + 1``, so an any-source
  receive of an array never matches a pickled object;
* the three tags above both ranges belong to ``monitored_barrier`` (arrivals and answers)
  and to the timeout notices of :mod:`mpidist.core.timeouts`: a private duplicate communicator
  would be a collective, and a missing rank would hang its creation.
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

from . import errors

#: Largest tag a user may pass (half of ``MPI_TAG_UB``, less the three reserved tags).
MAX_TAG = (MPI.COMM_WORLD.Get_attr(MPI.TAG_UB) - 2) // 2 - 1
#: Channels: arrays and objects.
ARRAYS, OBJECTS = 0, 1
#: ``monitored_barrier``'s arrival and answer tags.
ARRIVE = 2 * (MAX_TAG + 1)
ANSWER = ARRIVE + 1
#: A rank that gave up waiting on a group tells its peers on this tag.
NOTICE = ARRIVE + 2


def mpi_tag(tag: Any, call: Any, channel: int = ARRAYS) -> int:
    """The MPI tag for user tag ``tag`` on ``channel``; checks that ``tag`` is in range."""
    if isinstance(tag, bool) or not isinstance(tag, int):
        raise errors.type_error(call, f"tag must be an int, got {tag!r}")
    if not 0 <= tag <= MAX_TAG:
        raise errors.value_error(call, f"tag={tag} is outside 0..{MAX_TAG}")
    return 2 * tag + channel

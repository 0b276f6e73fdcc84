"""The default process group: init, destroy and the questions asked of the world.

MPI is the source of truth for rank and size. ``init_process_group`` duplicates
``MPI_COMM_WORLD`` into the default group and checks every rank/size the caller or
the environment states against MPI's; ``init_method`` strings are parsed and
validated, but under an MPI launcher no rendezvous is needed.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ..checks import failure, flight, rollcall, stall
from ..core import errors, groups, job
from ..core.groups import GroupMember, ProcessGroup
from . import heap, launcher, spares

#: Default timeout of a process group, as torch's (30 minutes).
default_pg_timeout = timedelta(minutes=30)


class Backend(str):
    """Backend names; mpidist has one, ``"mpi"`` (case-insensitive)."""

    UNDEFINED = "undefined"
    MPI = "mpi"

    def __new__(cls, name: str) -> Backend:
        groups.check_backend(name, "Backend")
        return super().__new__(cls, "mpi")


def _int_param(value: Any, source: str, call: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise errors.value_error(call, f"{source} must be an integer, got {value!r}") from None


def parse_init_method(init_method: str, call: str = "init_process_group") -> dict[str, Any]:
    """Validate an ``init_method`` URL; return its scheme and any ``rank``/``world_size``.

    ``env://``, ``tcp://host:port[?rank=R&world_size=N]`` and
    ``file:///absolute/path[?rank=R&world_size=N]`` are accepted, as in torch.
    """
    if not isinstance(init_method, str):
        raise errors.type_error(call, f"init_method must be a string URL, got {init_method!r}")
    url = urlsplit(init_method)
    out: dict[str, Any] = {"scheme": url.scheme}
    if url.scheme == "tcp":
        try:
            port = url.port
        except ValueError:
            port = -1
        if not url.hostname or port is None or not 0 < port < 65536:
            raise errors.value_error(
                call, f"init_method {init_method!r} must look like tcp://host:port (port 1-65535)"
            )
        out["host"], out["port"] = url.hostname, port
    elif url.scheme == "file":
        if not url.path.startswith("/") or url.netloc not in ("", "localhost"):
            raise errors.value_error(
                call, f"init_method {init_method!r} must look like file:///absolute/path"
            )
        out["path"] = url.path
    elif url.scheme != "env" or url.netloc or url.path not in ("", "/"):
        raise errors.value_error(
            call,
            f"init_method {init_method!r} is not supported; use env://, tcp://host:port "
            "or file:///path (none is needed under an MPI launcher)",
        )
    for key, values in parse_qs(url.query).items():
        if key in ("rank", "world_size"):
            out[key] = _int_param(values[-1], f"init_method's {key}", call)
    return out


def _check_identity(stated: list[tuple[str, int]], actual: int, what: str, call: str) -> None:
    for source, value in stated:
        if value != actual:
            raise errors.value_error(
                call,
                f"{source}={value} disagrees with MPI, which gives this process "
                f"{what}={actual}; MPI is the source of truth (start the job with "
                f"mpiexec -n N, or drop the {source} setting)",
            )


def init_process_group(backend: str | None = None, init_method: str | None = None,
                       timeout: timedelta | None = None, world_size: int = -1, rank: int = -1,
                       store: Any = None, group_name: str = "", pg_options: Any = None,
                       device_id: Any = None, *, abort_on_error: bool | None = None) -> None:
    """Initialise the default process group on ``MPI_COMM_WORLD`` (duplicated).

    Every rank calls it (``MPI_Comm_dup`` is collective). ``rank``/``world_size``, the
    ``RANK``/``WORLD_SIZE`` environment variables and an ``init_method``'s query, when
    given, must equal MPI's rank and size or ``ValueError`` names both values.
    ``timeout`` (default :data:`default_pg_timeout`) bounds ``Work.wait``.
    ``abort_on_error`` (default on, or ``MPIDIST_ABORT_ON_ERROR``) makes an uncaught
    exception on any rank abort the job instead of hanging its peers.

    Example::

        import mpidist as dist
        dist.init_process_group("mpi")
        print(dist.get_rank(), dist.get_world_size())
    """
    call = "init_process_group"
    spares.park()  # a spare waits here until called in (MPIDIST_SPARES)
    if groups.registry.world is not None:
        raise errors.runtime_error(
            call, "the default process group is already initialized; "
            "call destroy_process_group() before initializing again"
        )
    groups.check_backend(backend, call)
    if timeout is not None and not isinstance(timeout, timedelta):
        raise errors.type_error(
            call, f"timeout must be a datetime.timedelta, got {errors.type_name(timeout)}"
        )
    if store is not None:
        if init_method is not None:
            raise errors.value_error(call, "cannot specify both init_method and store")
        if rank == -1 or world_size == -1:
            raise errors.value_error(call, "a store needs rank and world_size to be given")
    url = parse_init_method(init_method, call) if init_method is not None else {}
    size, me = job.size(), job.rank()
    stated_ranks = [("rank", _int_param(rank, "rank", call))] if rank not in (-1, None) else []
    stated_sizes = ([("world_size", _int_param(world_size, "world_size", call))]
                    if world_size not in (-1, None) else [])
    if "rank" in url:
        stated_ranks.append(("init_method's rank", url["rank"]))
    if "world_size" in url:
        stated_sizes.append(("init_method's world_size", url["world_size"]))
    if url.get("scheme", "env") == "env":
        for var, bucket in (("RANK", stated_ranks), ("WORLD_SIZE", stated_sizes)):
            if os.environ.get(var, "").strip():
                bucket.append((f"${var}", _int_param(os.environ[var], f"${var}", call)))
    launcher.check_not_singleton_trap(call)  # before the identity checks: its message says more
    _check_identity(stated_sizes, size, "world_size", call)
    _check_identity(stated_ranks, me, "rank", call)
    start(timeout or default_pg_timeout, group_name,
          (abort_on_error if abort_on_error is not None else failure.enabled_by_env()) and size > 1)


#: How the world was started (:func:`start`'s arguments): a heal starts the new world the same way.
started: dict[str, Any] = {}


def start(timeout: timedelta, group_name: str, abort_on_error: bool) -> ProcessGroup:
    """Make the world group on the job's processes and start what watches it.

    Collective over :data:`mpidist.core.job.world`, in this order on every rank (a heal replays
    it on the survivors while the spares it called in run it from their script's
    ``init_process_group``): ``MPI_Comm_dup``, the hosts and node facts, the exit watch's
    ``MPI_Comm_dup`` (with ``abort_on_error``), the roll call's ``MPI_Comm_dup``.
    """
    started.update(timeout=timeout, group_name=group_name, abort_on_error=abort_on_error)
    pg = groups.make_world(timeout, group_name)
    groups.registry.world = pg
    groups.registry.was_destroyed = False
    GroupMember.WORLD = groups.group.WORLD = pg
    errors.WORLD_RANK = pg._rank
    if abort_on_error:
        if failure.installed():  # a heal: the watch moves onto the new world
            failure.restart(job.world)
        else:
            failure.install()
    heap.tune()  # large freed blocks kept for reuse (MPIDIST_MALLOC=0 leaves glibc's defaults)
    stall.start_stall_watch()  # MPIDIST_STALL_WARN_S (default 60 s; 0 turns it off)
    rollcall.start(job.world)  # the stall report's roll call: its own communicator
    flight.enable_from_env()  # MPIDIST_FLIGHT_RECORDER=N keeps the last N calls (default: off)
    return pg


def init_process(group_name: str, rank: int = -1, world_size: int = -1,
                 init_method: str | None = None, backend: str | None = "mpi",
                 timeout: timedelta | None = None) -> ProcessGroup:
    """Initialise the world with ``group_name`` recorded and return the default group.

    The seed project's form of :func:`init_process_group`; ``get_backend()`` and
    ``group.WORLD.group_name`` report what was passed.
    """
    if not isinstance(group_name, str) or not group_name:
        raise errors.value_error("init_process", f"group_name must be a non-empty string, got {group_name!r}")
    init_process_group(backend=backend, init_method=init_method, timeout=timeout,
                       world_size=world_size, rank=rank, group_name=group_name)
    return groups.world("init_process")


def destroy_process_group(group: Any = None) -> None:  # noqa: A002
    """Free ``group``'s communicator; with no argument, every group and the world.

    After destroying the world, any call raises ``RuntimeError`` until
    :func:`init_process_group` runs again.
    """
    call = "destroy_process_group"
    reg = groups.registry
    if group is None or group is reg.world:
        if reg.world is None:
            raise groups._not_initialized(call)
        for pg in list(reg.live.values()):
            groups.free(pg)
        reg.world = None
        reg.was_destroyed = True
        GroupMember.WORLD = groups.group.WORLD = None
        failure.uninstall()
        return
    if group is GroupMember.NON_GROUP_MEMBER:
        return
    if type(group) is not ProcessGroup:
        raise errors.type_error(call, f"group must be a ProcessGroup, got {group!r}")
    groups.free(group)


def is_initialized() -> bool:
    """``True`` between :func:`init_process_group` and :func:`destroy_process_group`."""
    return groups.registry.world is not None


def is_available() -> bool:
    return True


def is_mpi_available() -> bool:
    return True


def is_nccl_available() -> bool:
    return False


def is_gloo_available() -> bool:
    return False


def is_ucc_available() -> bool:
    return False


def is_xccl_available() -> bool:
    return False


def is_backend_available(backend: str) -> bool:
    """Whether ``backend`` can be passed to :func:`init_process_group`: only ``"mpi"`` (any case)."""
    return isinstance(backend, str) and backend.lower() == Backend.MPI


def get_default_backend_for_device(device: Any) -> str:
    """The backend for ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:1"`` or a ``torch.device``):
    ``"mpi"``, which serves both (GPU buffers go to a CUDA-aware MPI, or through host memory)."""
    kind = getattr(device, "type", device)
    if not isinstance(kind, str) or kind.split(":")[0] not in ("cpu", "cuda"):
        raise errors.value_error("get_default_backend_for_device",
                                 f"device must be 'cpu' or 'cuda' (a string or torch.device), got {device!r}")
    return Backend.MPI


def get_backend_config(group: Any = None) -> str:  # noqa: A002
    """The backend of each device type for ``group``, as torch writes it: ``"cpu:mpi,cuda:mpi"``."""
    groups.resolve(group, "get_backend_config")
    return f"cpu:{Backend.MPI},cuda:{Backend.MPI}"


def get_pg_count() -> int:
    """How many process groups this rank took part in making since :func:`init_process_group`,
    the default one included: as in torch, the non-members of a ``new_group`` count it too (they
    make the call), and with ``use_local_synchronization=True`` only its members do. 0 before
    init and after the default group is destroyed."""
    return groups.registry.made if groups.registry.world is not None else 0


def get_node_local_rank(fallback_rank: int | None = None) -> int:
    """This process's rank among the processes on its node.

    torch reads ``LOCAL_RANK`` (torchrun sets it); so does mpidist first. Without it, the rank is
    MPI's (``MPI_COMM_TYPE_SHARED``, learnt at init), or before init the launcher's variable
    (``OMPI_COMM_WORLD_LOCAL_RANK``, ``MPI_LOCALRANKID``, ``SLURM_LOCALID``); then
    ``fallback_rank``; else ``RuntimeError``.
    """
    call = "get_node_local_rank"
    value = os.environ.get("LOCAL_RANK")
    if value is not None:
        try:
            return int(value)
        except ValueError:
            raise errors.value_error(call, f"LOCAL_RANK={value!r} is not an int") from None
    if groups.registry.world is not None and groups.registry.local_rank >= 0:
        return groups.registry.local_rank
    claimed = launcher.claimed_local_rank()
    if claimed is not None:
        return claimed
    if fallback_rank is not None:
        if isinstance(fallback_rank, bool) or not isinstance(fallback_rank, int):
            raise errors.type_error(call, f"fallback_rank must be an int, got {fallback_rank!r}")
        return fallback_rank
    raise errors.runtime_error(call, "LOCAL_RANK is not in the environment, no MPI launcher says the local "
                                     "rank and init_process_group() has not run; pass fallback_rank")


def is_torchelastic_launched() -> bool:
    return os.environ.get("TORCHELASTIC_RUN_ID") is not None


def get_backend(group: Any = None) -> str:  # noqa: A002
    """The backend of ``group`` (always ``"mpi"``)."""
    groups.resolve(group, "get_backend")
    return Backend.MPI


def get_rank(group: Any = None) -> int:  # noqa: A002
    """This process's rank in ``group`` (the world by default); ``-1`` if not a member."""
    if group is GroupMember.NON_GROUP_MEMBER:
        groups.world("get_rank")
        return -1
    return groups.resolve(group, "get_rank")._rank


def get_world_size(group: Any = None) -> int:  # noqa: A002
    """Number of ranks in ``group`` (the world by default); ``-1`` if not a member."""
    if group is GroupMember.NON_GROUP_MEMBER:
        groups.world("get_world_size")
        return -1
    return groups.resolve(group, "get_world_size")._size

"""``MpidistProcessGroup``: a torch ``ProcessGroup`` whose every method is one mpidist call.

torch calls the registered creator once per group, on the group's members only, with the
global ranks of the group (none for the default group). The default group gets a
duplicate of mpidist's world communicator; a subgroup is made as mpidist makes its own
(:func:`mpidist.core.groups.create`: ``MPI_Comm_create_group`` over the members of the world).

Each method converts torch's options (root rank, ``ReduceOp``) and calls the mpidist
collective on the group's :class:`mpidist.ProcessGroup`. A call torch makes synchronously
(``opts.asyncOp`` false, e.g. ``dist.all_reduce(t)``) runs the blocking MPI routine and
returns finished work; an asynchronous one (DDP's buckets, ``async_op=True``) runs the
nonblocking ``MPI_I*`` routine and the progress thread completes its future, except for
messages up to a limit chosen from the nodes the group spans (:mod:`.overlap`), where the
blocking call was measured faster.
"""

from __future__ import annotations

import warnings
from datetime import timedelta
from typing import Any, Callable, Sequence

import torch
import torch.autograd.profiler as _profiler
import torch.distributed as tdist

from ..calls import collectives, exchange, p2p
from ..calls.ops import ReduceOp, make_premul_sum
from ..checks import debug, failure
from ..core import errors, faults, groups
from ..core.groups import ProcessGroup as MpiGroup
from ..core.waiting import seconds
from ..start import threads
from ..start import world as mworld
from . import handshake, overlap, profiling
from . import work as twork
from .fault_tolerance import FaultTolerance

#: Backend name for ``init_process_group``.
NAME = "mpidist"
#: Asynchronous collectives of at most this many bytes run the blocking MPI call; ``None``
#: (``MPIDIST_TORCH_SYNC_BYTES`` unset): chosen per group from the nodes it spans (see
#: :mod:`.overlap`). Like torch's own MPI backend (one worker thread, calls in issue order),
#: ranks must issue collectives on different groups in the same order.
SYNC_BYTES = overlap.from_env()


_OPS: dict[Any, ReduceOp] = {}


def _torch_op(reduce_op: Any) -> ReduceOp:
    """torch's ``ReduceOp`` (``.op`` the kind, ``.factor`` for PREMUL_SUM) as mpidist's."""
    kind = reduce_op.op
    op = _OPS.get(kind)
    if op is None:
        if kind.name == "PREMUL_SUM":
            return make_premul_sum(reduce_op.factor)
        op = _OPS[kind] = getattr(ReduceOp, kind.name)
    return op


def _nbytes(tensors: Sequence[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


class MpidistProcessGroup(FaultTolerance, tdist.ProcessGroup):
    """A torch process group on one mpidist :class:`~mpidist.core.groups.ProcessGroup`.

    ``mpi_group`` is the mpidist group (``mpi_group.comm`` the raw communicator).
    """

    def __init__(self, mpi_group: MpiGroup, rank: int, size: int) -> None:
        super().__init__(rank, size)
        self.mpi_group = mpi_group
        self._name = mpi_group.group_name
        self._desc = mpi_group.group_desc
        self._timeout = seconds(mpi_group.timeout)
        # collective (the node count), so made here, where every member creates the group
        self._sync_limit = overlap.sync_bytes(mpi_group.comm, SYNC_BYTES)

    # names: functional collectives and DeviceMesh look groups up by name
    def getBackendName(self) -> str:  # noqa: N802 - torch's method names
        return NAME

    def getGroupName(self) -> str:  # noqa: N802
        return self._name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._name = name

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._desc = desc

    @property
    def group_name(self) -> str:
        return self._name

    @property
    def group_desc(self) -> str:
        return self._desc

    def name(self) -> str:
        return NAME

    def __repr__(self) -> str:
        return f"<MpidistProcessGroup {self._name!r} ranks={list(self.mpi_group.ranks)}>"

    # the one path every collective takes
    def _run(self, call: str, opts: Any, nbytes: Callable[[], int], value: Any, fn: Callable[..., Any],
             args: Sequence[tuple], **kw: Any) -> twork.Work:
        """``fn(*a, group=..., **kw)`` for each ``a`` in ``args``: blocking, or nonblocking with a future."""
        # torch's own fast flag: with the profiler off this is the whole cost (no extra call)
        if _profiler._is_profiler_enabled and profiling.outside_record():
            return profiling.recorded(call, self, args, self._run, (call, opts, nbytes, value, fn, args), kw)
        g = self.mpi_group
        limit = self._sync_limit
        if not getattr(opts, "asyncOp", True) or (limit and nbytes() <= limit):
            for a in args:
                fn(*a, group=g, **kw)
            return twork.done(value)
        works = [w for w in (fn(*a, group=g, async_op=True, **kw) for a in args) if w is not None]
        return twork.pending(works, value, call, self._timeout)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> twork.Work:
        opts = opts or tdist.AllreduceOptions()
        op = _torch_op(opts.reduceOp)
        if len(tensors) == 1 and not _profiler._is_profiler_enabled:
            # one tensor (dist.all_reduce, each DDP bucket): _run inlined, since after a call
            # larger than the L2 cache every line of Python here runs with cold caches
            # (docs/benchmarks.md, "The torch backend after a large call")
            t = tensors[0]
            limit = self._sync_limit
            if not getattr(opts, "asyncOp", True) or (limit and t.numel() * t.element_size() <= limit):
                collectives.all_reduce(t, op, group=self.mpi_group)
                return twork.done(tensors)
        return self._run("allreduce", opts, lambda: _nbytes(tensors), tensors,
                         collectives.all_reduce, [(t, op) for t in tensors])

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> twork.Work:
        return self.allreduce(tensors, opts or tdist.AllreduceCoalescedOptions())

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> twork.Work:
        opts = opts or tdist.BroadcastOptions()
        return self._run("broadcast", opts, lambda: _nbytes(tensors), tensors,
                         collectives.broadcast, [(t,) for t in tensors], group_src=opts.rootRank)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> twork.Work:
        opts = opts or tdist.ReduceOptions()
        return self._run("reduce", opts, lambda: _nbytes(tensors), tensors, collectives.reduce,
                         [(t,) for t in tensors], op=_torch_op(opts.reduceOp), group_dst=opts.rootRank)

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: Any = None) -> twork.Work:
        opts = opts or tdist.AllgatherOptions()
        return self._run("allgather", opts, lambda: _nbytes(input_tensors) * self.size(), output_tensors,
                         exchange.all_gather, list(zip(output_tensors, input_tensors)))

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor],
                            opts: Any = None) -> twork.Work:
        """torch passes ``output_lists[rank][k]`` (rank-major); :meth:`allgather` takes ``[k][rank]``."""
        n = self.size()
        if len(output_lists) != n or any(len(row) != len(input_list) for row in output_lists):
            raise errors.value_error(
                "all_gather_coalesced", f"output_tensor_lists must hold {n} lists (one per rank) of "
                f"{len(input_list)} tensors (one per input); got lengths {[len(r) for r in output_lists]} "
                f"on rank {self.rank()}")
        by_input = [[output_lists[r][k] for r in range(n)] for k in range(len(input_list))]
        opts = opts or tdist.AllgatherOptions()
        return self._run("allgather_coalesced", opts, lambda: _nbytes(input_list) * n, output_lists,
                         exchange.all_gather, list(zip(by_input, input_list)))

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                        opts: Any = None) -> twork.Work:
        return self.allgather_into_tensor_coalesced([output], [input], opts)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                          opts: Any = None) -> twork.Work:
        return self.allgather_into_tensor_coalesced([output], [input], opts)

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> twork.Work:
        opts = opts or tdist.AllgatherOptions()
        return self._run("all_gather_into_tensor", opts, lambda: _nbytes(outputs), outputs,
                         exchange.all_gather_into_tensor, list(zip(outputs, inputs)))

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> twork.Work:
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                       opts: Any = None) -> twork.Work:
        opts = opts or tdist.ReduceScatterOptions()
        op = _torch_op(opts.reduceOp)
        return self._run("reduce_scatter", opts, lambda: _nbytes(output_tensors) * self.size(),
                         output_tensors, collectives.reduce_scatter,
                         [(o, i, op) for o, i in zip(output_tensors, input_tensors)])

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                             opts: Any = None) -> twork.Work:
        return self.reduce_scatter_tensor_coalesced([output], [input], opts)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                              opts: Any = None) -> twork.Work:
        return self.reduce_scatter_tensor_coalesced([output], [input], opts)

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> twork.Work:
        opts = opts or tdist.ReduceScatterOptions()
        op = _torch_op(opts.reduceOp)
        return self._run("reduce_scatter_tensor", opts, lambda: _nbytes(inputs), outputs,
                         collectives.reduce_scatter_tensor, [(o, i, op) for o, i in zip(outputs, inputs)])

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> twork.Work:
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: Any = None) -> twork.Work:
        opts = opts or tdist.GatherOptions()
        root = opts.rootRank
        outs = output_tensors[0] if self.rank() == root and output_tensors else None
        return self._run("gather", opts, lambda: _nbytes(input_tensors) * self.size(), output_tensors,
                         exchange.gather, [(input_tensors[0], outs)], group_dst=root)

    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                opts: Any = None) -> twork.Work:
        opts = opts or tdist.ScatterOptions()
        root = opts.rootRank
        ins = input_tensors[0] if self.rank() == root and input_tensors else None
        return self._run("scatter", opts, lambda: _nbytes(output_tensors) * self.size(), output_tensors,
                         exchange.scatter, [(output_tensors[0], ins)], group_src=root)

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any = None) -> twork.Work:
        opts = opts or tdist.AllToAllOptions()
        return self._run("alltoall", opts, lambda: _nbytes(input_tensors), output_tensors,
                         exchange.all_to_all, [(output_tensors, input_tensors)])

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                          output_split_sizes: list[int], input_split_sizes: list[int],
                          opts: Any = None) -> twork.Work:
        opts = opts or tdist.AllToAllOptions()
        return self._run("all_to_all_single", opts, lambda: _nbytes([input]), [output],
                         exchange.all_to_all_single,
                         [(output, input, list(output_split_sizes), list(input_split_sizes))])

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                      output_split_sizes: list[int], input_split_sizes: list[int],
                      opts: Any = None) -> twork.Work:
        return self.all_to_all_single(output, input, output_split_sizes, input_split_sizes, opts)

    def barrier(self, opts: Any = None) -> twork.Work:
        opts = opts or tdist.BarrierOptions()
        own = getattr(opts, "timeout", None)  # torch's barrier(timeout=); unset, it is negative
        if isinstance(own, timedelta) and own > timedelta(0):
            # in place of the group's timeout for this barrier, which is waited for here
            collectives.barrier(group=self.mpi_group, timeout=own)
            return twork.done([])
        return self._run("barrier", opts, lambda: 0, [], collectives.barrier, [()])

    # point to point: always nonblocking (a blocking send could deadlock a paired exchange)
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> twork.Work:
        g = self.mpi_group
        with profiling.maybe("send", self, tensors):
            works = [p2p.isend(t, group=g, tag=tag, group_dst=dst) for t in tensors]
        return twork.pending(works, tensors, "send", self._timeout)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> twork.Work:
        g = self.mpi_group
        with profiling.maybe("recv", self, tensors):
            works = [p2p.irecv(t, group=g, tag=tag, group_src=src) for t in tensors]
        return twork.pending(works, tensors, "recv", self._timeout, source=lambda: src)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> twork.Work:
        g = self.mpi_group
        with profiling.maybe("recv_anysource", self, tensors):
            works = [p2p.irecv(t, group=g, tag=tag) for t in tensors]
        return twork.pending(works, tensors, "recv", self._timeout,
                             source=lambda: works[0].source_rank())

    def shutdown(self) -> None:
        """Free the communicator (torch calls it from ``destroy_process_group``)."""
        if self.mpi_group.comm is not None:
            groups.free(self.mpi_group)
        faults.forget(self.mpi_group)

    # torch looks up a group's backend per device (from 2.14 also for a ProcessGroup subclass:
    # batch_isend_irecv, FSDP's allocator); this group is its own backend on every device
    def _get_backend(self, device: Any) -> MpidistProcessGroup:
        return self

    @property
    def supports_splitting(self) -> bool:
        """No ``ncclCommSplit``-style eager split: subgroups come from ``MPI_Comm_create_group``."""
        return False

    @property
    def supports_coalescing(self) -> bool:
        """No coalescing manager: ``batch_isend_irecv`` issues each operation as it comes."""
        return False

    def supports_tensor_alloc(self, device: Any) -> bool:
        """No backend-owned memory: FSDP allocates with ``torch.empty``."""
        return False

    # rank and size come from the MPI group, which a reconfigure replaces: Python (get_rank) calls
    # rank()/size(), torch's C++ (DDP's reducer) getRank()/getSize() through the subclass
    def rank(self) -> int:
        return self.mpi_group._rank

    def size(self) -> int:
        return self.mpi_group._size

    getRank, getSize = rank, size  # noqa: N815


def _world(opts: Any) -> MpiGroup:
    """mpidist's world (initialised here if the user has not), checked against torch's view."""
    if not mworld.is_initialized():
        mworld.init_process_group("mpi", timeout=opts.timeout, abort_on_error=False)
    w = groups.world("init_process_group")
    if (opts.group_rank, opts.group_size) != (w._rank, w._size):
        raise errors.value_error(
            "init_process_group", f"torch gives this process rank {opts.group_rank} of "
            f"{opts.group_size}, but MPI gives rank {w._rank} of {w._size}; MPI is the source of "
            "truth (drop rank=/world_size=/RANK/WORLD_SIZE or make them agree with mpiexec)"
        )
    return w


def warn_if_oversubscribed(pg: MpiGroup) -> str | None:
    """Warn once, on the first rank of each node, where the node's ranks run more torch threads
    than it has cores with OpenMP's spinning wait (:mod:`mpidist.start.threads`); the text or ``None``."""
    hosts = groups.registry.hosts
    mine = hosts[pg.ranks[pg._rank]] if hosts else None
    local = [r for r in pg.ranks if hosts[r] == mine] if hosts else [pg.ranks[pg._rank]]
    text = threads.advice(len(local), torch.get_num_threads(), "OpenMP" in torch.__config__.parallel_info())
    if text is not None and pg.ranks[pg._rank] == min(local):
        warnings.warn(f"mpidist: {text}", RuntimeWarning, stacklevel=2)
    return text


def create(opts: Any, backend_options: Any = None) -> MpidistProcessGroup:
    """The creator torch calls (``extended_api=True``), on members only."""
    timeout = opts.timeout if isinstance(opts.timeout, timedelta) else None
    ranks = list(opts.global_ranks_in_group)
    name, desc = str(opts.group_id), "default_pg" if not ranks else "undefined"
    if not ranks:
        debug.set_debug_level_from_torch_env()
        pg = groups.duplicate(_world(opts), name, desc, timeout)
        failure.install_for_torch()
        handshake.prepare(pg.comm)  # reconfigure's own communicator (collective, as this is)
        warn_if_oversubscribed(pg)
    else:
        w = groups.world("new_group")
        pg = groups.create(w, [w._to_group[r] for r in ranks], desc, timeout, name)
    if pg._rank != opts.group_rank:
        raise errors.runtime_error("new_group", f"MPI rank {pg._rank} != torch group rank {opts.group_rank}")
    return MpidistProcessGroup(pg, opts.group_rank, opts.group_size)

"""torch 2.14's reconfigure contract on the ``mpidist`` backend (``dist._reconfigure``).

Organised as torch's own tests of gloo's reconfigure: every process's handle goes round out of
band (``MPI_Allgather`` on ``MPI_COMM_WORLD``, which mpidist's groups never use), only the processes
listed call ``_reconfigure``, and each configuration is checked the same way
(:func:`_check`): sizes and ranks (torch's, mpidist's, torch's global-to-group map), an
``all_reduce`` against the sum of the members' ``MPI_COMM_WORLD`` ranks, a ring of ``send``/``recv``,
and the uuid rule. Every test ends with all processes in ``MPI_COMM_WORLD`` order again
(:func:`_restore`), so the tests after it find the default group as it was.

Run under ``mpiexec -n {1,2,3,4} python -m pytest --only-mpi`` with ``MPIDIST_ABORT_ON_ERROR=0``;
the whole module skips on a torch without ``_reconfigure`` (before 2.14).
"""

from __future__ import annotations

import itertools
import time
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'mpidist[torch]')")
tdist = pytest.importorskip("torch.distributed", reason="torch.distributed is not available")
if not hasattr(tdist, "_reconfigure"):
    pytest.skip(f"torch {torch.__version__} has no dist._reconfigure (torch 2.14 brought it); these tests "
                "run in the newest torch's virtualenv (make venv-torch-newest)", allow_module_level=True)

import torch.distributed.distributed_c10d as c10d  # noqa: E402
from mpi4py import MPI  # noqa: E402

import mpidist  # noqa: E402

ME, N = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
#: Fresh uuids, drawn in the same order on every process (also by those a configuration leaves out),
#: from rank 0's clock: each process's own could read the next second, and a process whose uuid
#: differs waits for the others until the group's timeout, as torch's gloo would.
_uuids = itertools.count(MPI.COMM_WORLD.bcast(int(time.time()) % 100_000 * 1000))


def _uuid() -> int:
    return next(_uuids)


@pytest.fixture
def handles(tw):
    """Every process's handle, in ``MPI_COMM_WORLD`` order (exchanged out of band)."""
    out = MPI.COMM_WORLD.allgather(tw._get_reconfigure_handle())
    yield out
    _restore(tw, out)


def _restore(tw, handles):
    """All processes, in ``MPI_COMM_WORLD`` order: the default group as the tests found it."""
    uuid = _uuid()
    tw._reconfigure(uuid, handles).wait()
    _check(tw, list(range(N)), handles, uuid)


def _check(tw, members, handles, uuid=None, group=None):
    """On a member of ``members`` (``MPI_COMM_WORLD`` ranks in group order), after the reconfigure
    ``uuid``: ranks, sizes, a sum, a ring of messages, and ``uuid`` refused a second time."""
    rank, size = members.index(ME), len(members)
    assert (tw.get_rank(group), tw.get_world_size(group)) == (rank, size)
    pg = group or c10d._get_default_group()
    assert (pg.rank(), pg.size()) == (rank, size)
    # what torch's C++ reads (DDP's reducer, its parameter check)
    assert (tdist.ProcessGroup.rank(pg), tdist.ProcessGroup.size(pg)) == (rank, size)
    if group is None:
        assert (mpidist.get_rank(), mpidist.get_world_size()) == (rank, size)
        assert tw.get_process_group_ranks(None) == list(range(size))
    t = torch.tensor([float(ME + 1)])
    tw.all_reduce(t, group=group)
    assert t.item() == sum(m + 1 for m in members)
    if size > 1:
        got = torch.zeros(1)
        peer = tw.get_global_rank(pg, (rank + 1) % size) if group is not None else (rank + 1) % size
        src = tw.get_global_rank(pg, (rank - 1) % size) if group is not None else (rank - 1) % size
        works = [tw.isend(torch.tensor([float(ME)]), peer, group=group), tw.irecv(got, src, group=group)]
        for w in works:
            w.wait()
        assert got.item() == members[(rank - 1) % size]
    if uuid is not None:
        with pytest.raises(RuntimeError, match="already used"):
            tw._reconfigure(uuid, [handles[m] for m in members], group=group)


def _reconfigure(tw, members, handles, group=None, timeout=None):
    """The next configuration: ``members`` call ``_reconfigure`` and check it; the rest draw its uuid only."""
    uuid = _uuid()
    if ME in members:
        tw._reconfigure(uuid, [handles[m] for m in members], group=group, timeout=timeout).wait()
        _check(tw, members, handles, uuid, group)
    return uuid


@pytest.mark.mpi
def test_handles_name_processes_of_mpi_comm_world(tw, handles):
    assert tw._supports_reconfigure() and tw._supports_reconfigure(tw.new_group(list(range(N))))
    assert handles == [f"mpi:world:{r}" for r in range(N)]
    assert tw._get_reconfigure_handle(tw.new_group(list(range(N)))) == handles[ME]


@pytest.mark.mpi
def test_same_members(tw, handles):
    _reconfigure(tw, list(range(N)), handles)


@pytest.mark.mpi
def test_same_members_twice(tw, handles):
    _reconfigure(tw, list(range(N)), handles)
    _reconfigure(tw, list(range(N)), handles)


@pytest.mark.mpi
def test_a_list_assigns_ranks_by_position(tw, handles):
    _reconfigure(tw, list(range(N))[::-1], handles)


@pytest.mark.mpi
def test_a_set_assigns_ranks_by_ascending_handle(tw, handles):
    uuid = _uuid()
    tw._reconfigure(uuid, set(handles)).wait()
    _check(tw, list(range(N)), handles, uuid)


@pytest.mark.mpi(min_size=2)
def test_shrink_excluding_the_last(tw, handles):
    _reconfigure(tw, list(range(N - 1)), handles)


@pytest.mark.mpi(min_size=3)
def test_shrink_excluding_a_middle_rank(tw, handles):
    _reconfigure(tw, [r for r in range(N) if r != N // 2], handles)


@pytest.mark.mpi
def test_each_alone_then_all(tw, handles):
    uuid = _uuid() + ME  # one configuration per process, each of its own
    [_uuid() for _ in range(N - 1)]
    tw._reconfigure(uuid, [handles[ME]]).wait()
    _check(tw, [ME], handles, uuid)
    _reconfigure(tw, list(range(N)), handles)


@pytest.mark.mpi(min_size=2)
def test_one_to_all(tw, handles):
    _reconfigure(tw, [0], handles)
    _reconfigure(tw, list(range(N)), handles)


@pytest.mark.mpi(min_size=2)
def test_grow_from_a_spare(tw, handles):
    """The last process, left out of the first configuration, joins the second (the others' ranks stay)."""
    _reconfigure(tw, list(range(N - 1)), handles)
    _reconfigure(tw, list(range(N)), handles)


@pytest.mark.mpi(min_size=3)
def test_one_out_another_in(tw, handles):
    """The last process waits outside; then it takes rank 1's place, and rank 1 leaves."""
    _reconfigure(tw, list(range(N - 1)), handles)
    _reconfigure(tw, [0, N - 1] + list(range(2, N - 1)), handles)


@pytest.mark.mpi(min_size=2)
def test_ddp_on_the_reconfigured_group_averages_over_its_members(tw, handles):
    """DDP built after a reconfigure: torch's C++ side (the parameter check, the reducer's
    average) sees the new size."""
    members = list(range(1, N))
    _reconfigure(tw, members, handles)
    if ME in members:
        model = torch.nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            model.weight.fill_(1.0)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        ddp(torch.tensor([[float(ME)]])).sum().backward()
        assert model.weight.grad.item() == pytest.approx(sum(members) / len(members))
        del ddp


@pytest.mark.mpi(min_size=2)
def test_late_join(tw, handles):
    half = list(range(N // 2))
    _reconfigure(tw, half, handles)
    _reconfigure(tw, list(range(N)), handles)


@pytest.mark.mpi(min_size=2)
def test_split_then_merge(tw, handles):
    """Two halves at once, each a group of its own (different uuids), then everyone."""
    lower, upper = list(range(N // 2)), list(range(N // 2, N))
    first, second = _uuid(), _uuid()
    mine, uuid = (lower, first) if ME in lower else (upper, second)
    tw._reconfigure(uuid, [handles[m] for m in mine]).wait()
    _check(tw, mine, handles, uuid)
    _reconfigure(tw, list(range(N)), handles)


@pytest.mark.mpi
def test_a_used_uuid_is_refused_on_every_member(tw, handles):
    uuid = _reconfigure(tw, list(range(N)), handles)
    with pytest.raises(RuntimeError, match=f"uuid {uuid} was already used"):
        tw._reconfigure(uuid, handles)
    _check(tw, list(range(N)), handles, uuid)  # the group is as it was


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("absent", ["last", "first"])
def test_a_member_that_never_calls_times_out_the_others(tw, handles, absent):
    """The others raise "Timed out" within the timeout and a grace period, naming the absent
    handle; every group is as it was, and the next configuration works (the absent process
    finds the first process's answer to it and drops it)."""
    missing = N - 1 if absent == "last" else 0
    uuid, limit = _uuid(), 1.0
    if ME != missing:
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"Timed out") as info:
            tw._reconfigure(uuid, handles, timeout=timedelta(seconds=limit))
        took = time.monotonic() - start
        assert handles[missing] in str(info.value)
        assert took < limit + 0.5 + 3.0, took  # the grace period is at least 0.5 s
    MPI.COMM_WORLD.Barrier()
    _check(tw, list(range(N)), handles)


@pytest.mark.mpi(min_size=2)
def test_members_with_another_uuid_time_out_and_the_first_says_which(tw, handles):
    """As under gloo, members that pass different uuids wait for each other until the timeout;
    the first listed process's error names the members it heard from with another uuid."""
    ours, theirs = _uuid(), _uuid()
    with pytest.raises(RuntimeError, match=r"Timed out") as info:
        tw._reconfigure(ours if ME == 0 else theirs, handles, timeout=timedelta(seconds=2))
    if ME == 0:
        for m in range(1, N):
            assert f"{handles[m]} with uuid {theirs}" in str(info.value), info.value
        assert f"not {ours}" in str(info.value), info.value
    MPI.COMM_WORLD.Barrier()
    _check(tw, list(range(N)), handles)


@pytest.mark.mpi(min_size=2)
def test_members_that_list_other_orders_are_told(tw, handles):
    order = list(range(N)) if ME % 2 == 0 else list(range(N))[::-1]
    with pytest.raises(RuntimeError, match="other handles or another order"):
        tw._reconfigure(_uuid(), [handles[m] for m in order], timeout=timedelta(seconds=30))
    _check(tw, list(range(N)), handles)


@pytest.mark.mpi
@pytest.mark.parametrize("bad, error, words", [
    ("garbage", ValueError, "is not an mpidist handle"),
    ("mpi:world:x", ValueError, "names no process"),
    ("mpi:world:-1", ValueError, "names no process"),
    ("mpi:world:100000", ValueError, "names no process"),
    ("mpi:queue:1", ValueError, "of kind 'queue'"),
    ("mpi:port:tag#0$description#host$", RuntimeError, "cannot yet join"),
    ("twice", ValueError, "listed twice"),
    ("others", RuntimeError, "is not in handles"),
    ("empty", ValueError, "handles is empty"),
])
def test_bad_handles_are_refused_before_any_message(tw, handles, bad, error, words):
    if bad == "others" and N == 1:
        pytest.skip("one process: leaving it out leaves no handle")
    uuid = _uuid()
    given = {"twice": handles + [handles[ME]], "others": [h for h in handles if h != handles[ME]],
             "empty": []}.get(bad, [handles[ME], bad])
    with pytest.raises(error, match=words) as info:
        tw._reconfigure(uuid, given)
    assert "_reconfigure" in str(info.value)
    tw._reconfigure(uuid, handles).wait()  # the uuid was not used up
    _check(tw, list(range(N)), handles, uuid)


@pytest.mark.mpi(min_size=2)
def test_a_subgroup(tw, handles):
    """A group other than the default one: its members chosen anew among the default group's,
    torch's map of its global ranks kept true; the default group is left alone."""
    group = tw.new_group(list(range(N)))
    members = list(range(N - 1))[::-1]
    _reconfigure(tw, members, handles, group=group)
    if ME in members:
        assert tw.get_process_group_ranks(group) == members
        assert tw.get_group_rank(group, ME) == members.index(ME)
    assert (tw.get_rank(), tw.get_world_size()) == (ME, N)
    tw.destroy_process_group(group)
    t = torch.ones(1)
    tw.all_reduce(t)
    assert t.item() == N


@pytest.mark.mpi
def test_the_default_group_takes_mpidists_world_and_ends_the_other_groups(tw, handles):
    group = tw.new_group(list(range(N)))
    own = mpidist.new_group(list(range(N)))
    _reconfigure(tw, list(range(N))[::-1], handles)
    assert group not in c10d._world.pg_map
    assert own.comm is None
    assert mpidist.get_rank() == tw.get_rank() == N - 1 - ME


@pytest.mark.mpi
def test_init_with_enable_reconfigure(tw, handles):
    """``enable_reconfigure=True`` is accepted: the communicator is made at init as always."""
    tw.destroy_process_group()
    tw.init_process_group("mpidist", enable_reconfigure=True)
    _reconfigure(tw, list(range(N))[::-1], handles)

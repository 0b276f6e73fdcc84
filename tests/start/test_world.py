"""The default group: init/destroy/re-init, identity checks, init_method parsing, backend names.

MPI tests here destroy the world and always re-initialise it (``finally``), so the tests
after them still find it; checks of environment variables run in their own jobs
(``test_world_jobs.py``).
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from helpers import still_works


def reinit(dist, **kw):
    if not dist.is_initialized():
        dist.init_process_group("mpi", abort_on_error=False, **kw)


@pytest.mark.mpi
def test_double_init_is_runtime_error(dist, rank, size):
    with pytest.raises(RuntimeError, match=rf"^init_process_group: rank {rank}: .*already initialized.*"
                                           r"destroy_process_group"):
        dist.init_process_group("mpi")
    still_works(dist, size)


@pytest.mark.mpi
def test_destroy_then_use_then_reinit(dist, rank, size):
    sub = dist.new_group(list(range(size)))
    old_world = dist.group.WORLD
    try:
        dist.destroy_process_group()
        assert not dist.is_initialized()
        assert dist.group.WORLD is None and dist.GroupMember.WORLD is None
        assert old_world.comm is None and sub.comm is None  # communicators freed
        for fn in (dist.get_rank, dist.get_world_size, dist.get_backend, dist.barrier,
                   lambda: dist.all_reduce(np.ones(1)), lambda: dist.new_group([0]),
                   lambda: dist.all_reduce(np.ones(1), group=sub), dist.destroy_process_group,
                   lambda: dist.get_rank(dist.GroupMember.NON_GROUP_MEMBER)):
            with pytest.raises(RuntimeError, match=rf"rank {rank}: .*destroyed.*init_process_group"):
                fn()
    finally:
        reinit(dist)
    assert dist.is_initialized() and dist.get_rank() == rank and dist.get_world_size() == size
    assert dist.group.WORLD is not old_world
    with pytest.raises(RuntimeError, match="was destroyed"):
        dist.all_reduce(np.ones(1), group=sub)  # a group from the old world stays dead
    still_works(dist, size)


@pytest.mark.mpi
def test_identity_mismatch_names_both_values(dist, rank, size):
    try:
        dist.destroy_process_group()
        with pytest.raises(ValueError, match=rf"rank={rank + 1} disagrees with MPI.*rank={rank}"):
            dist.init_process_group("mpi", rank=rank + 1, world_size=size)
        with pytest.raises(ValueError, match=rf"world_size={size + 1} disagrees.*world_size={size}"):
            dist.init_process_group(world_size=size + 1, rank=rank)
        with pytest.raises(ValueError, match=rf"init_method's world_size={size + 2}.*world_size={size}"):
            dist.init_process_group(init_method=f"tcp://127.0.0.1:29500?world_size={size + 2}")
        with pytest.raises(ValueError, match=rf"init_method's rank={rank + 3}.*rank={rank}"):
            dist.init_process_group(init_method=f"file:///tmp/x?rank={rank + 3}&world_size={size}")
        assert not dist.is_initialized()  # a failed init leaves nothing half-made
        dist.init_process_group("MPI", init_method=f"tcp://127.0.0.1:29500?rank={rank}&world_size={size}",
                                rank=rank, world_size=size, abort_on_error=False)
        assert dist.get_rank() == rank and dist.get_world_size() == size
    finally:
        reinit(dist)
    still_works(dist, size)


@pytest.mark.mpi
def test_init_process_records_group_name(dist, rank, size):
    try:
        dist.destroy_process_group()
        with pytest.raises(ValueError, match="group_name must be a non-empty string"):
            dist.init_process("")
        pg = dist.init_process("trainer", rank=rank, world_size=size)
        assert pg is dist.group.WORLD and pg.group_name == "trainer"
        assert dist.get_backend() == "mpi" and dist.get_backend(pg) == "mpi"
        assert pg.rank() == rank and pg.size() == size
        still_works(dist, size)
        dist.destroy_process_group()
    finally:
        reinit(dist)
    assert dist.group.WORLD.group_name != "trainer"


@pytest.mark.mpi
def test_timeout_type_check_and_inheritance(dist, rank, size):
    try:
        dist.destroy_process_group()
        with pytest.raises(TypeError, match=rf"rank {rank}: timeout must be a datetime.timedelta, got int"):
            dist.init_process_group(timeout=5)
        custom = timedelta(seconds=77)
        dist.init_process_group(timeout=custom, abort_on_error=False)
        assert dist.group.WORLD.timeout == custom
        assert dist.new_group(list(range(size))).timeout == custom
        own = timedelta(seconds=5)
        assert dist.new_group(list(range(size)), timeout=own).timeout == own
        dist.destroy_process_group()
    finally:
        reinit(dist)
    assert dist.group.WORLD.timeout == dist.default_pg_timeout == timedelta(minutes=30)


@pytest.mark.mpi
def test_backend_names(dist, rank, size):
    assert dist.get_backend() == "mpi" and dist.Backend.MPI == "mpi"
    assert dist.Backend("MPI") == "mpi"
    with pytest.raises(ValueError, match="'gloo' is not supported"):
        dist.Backend("gloo")
    try:
        dist.destroy_process_group()
        for bad in ("nccl", "gloo", "", 3):
            with pytest.raises(ValueError, match=rf"rank {rank}: backend {bad!r} is not supported.*'mpi'"):
                dist.init_process_group(bad)
        dist.init_process_group("Mpi", abort_on_error=False)
    finally:
        reinit(dist)
    still_works(dist, size)


@pytest.mark.mpi
def test_is_helpers(dist, rank, size):
    assert dist.is_initialized() and dist.is_available() and dist.is_mpi_available()
    assert not dist.is_nccl_available() and not dist.is_gloo_available()
    assert isinstance(dist.is_torchelastic_launched(), bool)
    assert dist.get_rank() == rank and dist.get_world_size() == size
    assert dist.get_rank(dist.group.WORLD) == rank


# -- init_method parsing (no communication) --------------------------------------------------

GOOD_URLS = {
    "env://": {"scheme": "env"},
    "tcp://10.0.0.1:29500": {"scheme": "tcp", "host": "10.0.0.1", "port": 29500},
    "tcp://node-1:1?rank=3&world_size=8": {"scheme": "tcp", "host": "node-1", "port": 1, "rank": 3,
                                           "world_size": 8},
    "file:///tmp/rendezvous": {"scheme": "file", "path": "/tmp/rendezvous"},
    "file:///shared/f?world_size=2": {"scheme": "file", "path": "/shared/f", "world_size": 2},
}
BAD_URLS = ["tcp://host", "tcp://host:0", "tcp://host:70000", "tcp://:29500", "tcp://host:port",
            "file://relative/path", "ftp://host:1", "env://host:1", "localhost:29500", "",
            "tcp://h:1?rank=abc"]


@pytest.mark.parametrize("url", sorted(GOOD_URLS))
def test_parse_init_method_good(url):
    from mpidist.start.world import parse_init_method

    assert parse_init_method(url) == GOOD_URLS[url]


@pytest.mark.parametrize("url", BAD_URLS)
def test_parse_init_method_bad(url):
    from mpidist.start.world import parse_init_method

    with pytest.raises(ValueError, match=r"^init_process_group: rank 0: "):
        parse_init_method(url)


def test_parse_init_method_type():
    from mpidist.start.world import parse_init_method

    with pytest.raises(TypeError, match="must be a string URL"):
        parse_init_method(29500)

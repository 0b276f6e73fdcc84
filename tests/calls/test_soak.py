"""Load and soak: many mixed calls with every result checked, no leaked requests or communicators.

Also the large-count path (MPI's int counts overflow past 2**31) and the rendezvous
security facts (the ones that need a job of their own are in ``test_soak_jobs.py``).
``-m slow`` runs the 10**5-call soak and the >2 GiB message.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import rank_data
from mpi4py import MPI

from mpidist.core import groups

DTYPES = [np.float32, np.float64, np.int32, np.int64, np.uint8, np.complex64]


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def live_requests() -> int:
    """Active ``MPI.Request`` objects still reachable from Python."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, MPI.Request) and o != MPI.REQUEST_NULL)


def free_context_ids() -> int:
    """How many more communicators MPI can create in this process (MPICH: 2046 context ids at most).

    Live communicators use them up, so a leak shows as a smaller count.
    """
    made = []
    try:
        while len(made) < 100_000:
            made.append(MPI.COMM_SELF.Dup())
    except MPI.Exception:
        pass
    for c in made:
        c.Free()
    return len(made)


def soak(dist, rank: int, size: int, calls: int, seed: int = 7) -> int:
    """``calls`` mixed calls, the same sequence on every rank (shared seed); every result checked."""
    rng = np.random.default_rng(seed)  # the same choices on every rank
    done = 0
    while done < calls:
        kind = rng.integers(0, 8)
        dt = DTYPES[rng.integers(0, len(DTYPES))]
        n = int(rng.integers(0, 300))
        s = int(rng.integers(0, 10_000))
        if kind == 0:  # blocking or async all_reduce
            x = rank_data(rank, (n,), dt, s)
            want = np.sum([rank_data(r, (n,), dt, s) for r in range(size)], axis=0, dtype=dt)
            w = dist.all_reduce(x, async_op=bool(rng.integers(0, 2)))
            if w is not None:
                w.wait()
            np.testing.assert_allclose(x, want, rtol=1e-5)
        elif kind == 1:
            root = int(rng.integers(0, size))
            x = rank_data(rank, (n,), dt, s)
            dist.broadcast(x, src=root)
            np.testing.assert_array_equal(x, rank_data(root, (n,), dt, s))
        elif kind == 2:
            out = np.empty(n * size, dt)
            w = dist.all_gather_into_tensor(out, rank_data(rank, (n,), dt, s), async_op=True)
            w.wait()
            np.testing.assert_array_equal(out, np.concatenate([rank_data(r, (n,), dt, s)
                                                               for r in range(size)]))
        elif kind == 3:
            inp = rank_data(rank, (size * n,), dt, s)
            out = np.empty(size * n, dt)
            dist.all_to_all_single(out, inp)
            want = np.concatenate([rank_data(r, (size * n,), dt, s)[rank * n:(rank + 1) * n]
                                   for r in range(size)])
            np.testing.assert_array_equal(out, want)
        elif kind == 4 and size > 1:  # ring of tagged isend/irecv
            tag = int(rng.integers(0, 1000))
            right, left = (rank + 1) % size, (rank - 1) % size
            got = np.empty(n, dt)
            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, rank_data(rank, (n,), dt, s), right,
                                                       tag=tag),
                                            dist.P2POp(dist.irecv, got, left, tag=tag)])
            for w in works:
                w.wait()
            np.testing.assert_array_equal(got, rank_data(left, (n,), dt, s))
        elif kind == 5:
            out = [None] * size
            dist.all_gather_object(out, {"rank": rank, "s": s})
            assert out == [{"rank": r, "s": s} for r in range(size)]
        elif kind == 6:  # a subgroup created, used and destroyed
            members = sorted(set(rng.choice(size, size=int(rng.integers(1, size + 1)), replace=True)))
            g = dist.new_group(members)
            if rank in members:
                x = np.full(3, rank, np.int64)
                dist.all_reduce(x, group=g)
                assert (x == sum(members)).all()
                dist.destroy_process_group(g)
        else:
            dist.barrier()
        done += 1
    return done


def opt_in(request) -> None:
    """Skip unless the run selected slow tests (``-m slow``)."""
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("opt-in: run with -m slow")


def _check_flat(dist, rank, size, calls):
    soak(dist, rank, size, 50, seed=1)  # warm-up: pools, caches, lazily built ops
    gc.collect()
    reqs0, groups0, ctx0, rss0 = live_requests(), len(groups.registry.live), free_context_ids(), rss_mib()
    assert soak(dist, rank, size, calls) == calls
    dist.barrier()
    gc.collect()
    rss1 = rss_mib()
    print(f"[rank {rank}] soak: {calls} calls, RSS {rss0:.1f} -> {rss1:.1f} MiB")
    assert live_requests() == reqs0 == 0
    assert len(groups.registry.live) == groups0
    assert free_context_ids() == ctx0
    return rss0, rss1


@pytest.mark.mpi
def test_soak_short(dist, rank, size):
    rss0, rss1 = _check_flat(dist, rank, size, 400)
    assert rss1 - rss0 < 64, (rss0, rss1)


@pytest.mark.slow
@pytest.mark.mpi
def test_soak_100k_calls(dist, rank, size, request):
    opt_in(request)
    rss0, rss1 = _check_flat(dist, rank, size, 100_000)
    assert rss1 - rss0 < 32, (rss0, rss1)


@pytest.mark.mpi
def test_1000_subgroups_created_and_destroyed_free_their_communicators(dist, rank, size):
    ctx0, live0 = free_context_ids(), len(groups.registry.live)
    for i in range(1000):
        members = [r for r in range(size) if (r + i) % 2 == 0 or size == 1]
        g = dist.new_group(members)
        if rank in members:
            assert g.size() == len(members)
            dist.destroy_process_group(g)
    cur, subs = dist.new_subgroups(1)
    for g in subs:
        if g:
            dist.destroy_process_group(g)
    assert len(groups.registry.live) == live0
    assert free_context_ids() == ctx0  # every communicator handed back to MPI
    assert ctx0 < 2100  # the probe measures MPICH's context-id pool: 1000 leaks would show


# ---------------------------------------------------------------- large counts

def test_mpi4py_uses_the_large_count_routines():
    lib = next(line.split()[-1] for line in open("/proc/self/maps") if "libmpi" in line.split()[-1])
    import ctypes

    mpi = ctypes.CDLL(lib)
    for name in ("MPI_Bcast_c", "MPI_Allreduce_c", "MPI_Allgatherv_c", "MPI_Send_c", "MPI_Recv_c"):
        assert hasattr(mpi, name), name
    assert MPI.Get_version() >= (4, 0)


@pytest.mark.mpi
def test_count_above_2_31_goes_through(dist, rank, size):
    # a zero-size datatype lets the count exceed INT_MAX without 2 GiB of memory: with
    # int counts mpi4py would raise OverflowError, so passing proves the _c routines ran
    zero = MPI.BYTE.Create_contiguous(0).Commit()
    try:
        buf = np.empty(0, np.uint8)
        n = 2**31 + 5
        dist.group.WORLD.comm.Bcast([buf, n, zero], 0)
        if size > 1:
            status = MPI.Status()
            if rank == 0:
                dist.group.WORLD.comm.Send([buf, n, zero], 1, 5)
            elif rank == 1:
                dist.group.WORLD.comm.Recv([buf, n, zero], 0, 5, status)
                assert status.Get_count(zero) == 0  # MPI's rule for zero-size types
    finally:
        zero.Free()
    dist.barrier()


def _mem_available_gib() -> float:
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0


#: Elements of the arrays past MPI's int counts.
_BIG = 2**31 + 64


def _big_test(dist, size, request, need_per_rank: float) -> None:
    """Opt-in, and skipped on every rank unless each has the memory (GiB) free."""
    opt_in(request)
    need = need_per_rank * size + 4
    avail = [None] * size
    dist.all_gather_object(avail, _mem_available_gib())
    if min(avail) < need:
        pytest.skip(f"needs {need:.0f} GiB free, have {min(avail):.0f}")


def _ramp(n: int) -> np.ndarray:
    """i % 256 at index i, built without a 2**31-element uint64 temporary (16 GiB)."""
    return np.tile(np.arange(256, dtype=np.uint8), n // 256 + 1)[:n]


def _check_ramp(x: np.ndarray) -> None:
    assert x.size == _BIG
    assert x[-64:].tolist() == [(_BIG - 64 + i) % 256 for i in range(64)]
    assert x[2**31 - 1] == (2**31 - 1) % 256


@pytest.mark.slow
@pytest.mark.mpi(min_size=2)
def test_broadcast_over_2_gib(dist, rank, size, request):
    _big_test(dist, size, request, need_per_rank=2.2)
    x = np.zeros(_BIG, np.uint8) if rank else _ramp(_BIG)
    dist.broadcast(x, src=0)
    _check_ramp(x)
    del x


@pytest.mark.slow
@pytest.mark.mpi(min_size=2)
def test_objects_over_2_gib(dist, rank, size, request):
    """Past MPI's int counts: an array apart in 1 GiB pieces, and heads in 1 MiB units."""
    _big_test(dist, size, request, need_per_rank=4.5)
    lst = [{"big": _ramp(_BIG) if rank == 0 else None, "tag": "end"}]
    dist.broadcast_object_list(lst, src=0)  # one buffer apart, in three messages
    assert lst[0]["tag"] == "end"
    _check_ramp(lst[0]["big"])
    del lst
    # every rank's 1.1 GiB in the heads of one all-gather: more than 2 GiB in all, in 1 MiB units
    mine = np.full(1100 * 2**20, rank + 1, np.uint8)
    out = [None] * size
    dist.all_gather_object(out, mine)
    assert all(o.size == mine.size and o[0] == o[-1] == r + 1 for r, o in enumerate(out))


# ---------------------------------------------------------------- security

SRC = Path(__file__).resolve().parents[2] / "mpidist"


# The optional torch backend serves torch's own TCPStore (key/value strings, no pickles) for
# torch's rendezvous; every other module must stay off sockets.
#: Modules that touch sockets, and why: none reads data from one (checked below).
SOCKET_USERS = {
    "torch/rendezvous.py": "torch's TCPStore for the backend (its own protocol, no pickles)",
    "torch/netaddr.py": "which of rank 0's addresses a peer can reach: connect, then close",
    "start/torchrun_env.py": "MASTER_PORT: rank 0 holds a free port, peers probe it: connect, then close",
}


def test_no_mpidist_module_opens_sockets_or_unpickles_outside_mpi():
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        if path.relative_to(SRC).as_posix() in SOCKET_USERS:
            if path.name != "rendezvous.py":
                assert ".recv(" not in text and "makefile(" not in text, f"{path.name} reads a socket"
            continue
        for needle in ("import socket", "socketserver", "start_server", "http.server"):
            assert needle not in text, f"{path.name} uses {needle}: a rendezvous needs a per-job token"
        if path.name != "pickles.py":  # the object calls' messages, from ranks of the same job
            assert "pickle.load" not in text, f"{path.name} unpickles data"

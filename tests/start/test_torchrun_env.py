"""torchrun's variables from MPI (mpidist/start/torchrun_env.py), under mpiexec at any size."""

from __future__ import annotations

import socket

import pytest
from helpers import gathered
from mpi4py import MPI

from mpidist.start import torchrun_env


@pytest.mark.mpi
def test_layout_environment_follows_the_hosts(dist, rank, size):
    env = torchrun_env.layout_environment(MPI.COMM_WORLD)
    hosts = gathered(dist, socket.gethostname())
    mine = [r for r, h in enumerate(hosts) if h == hosts[rank]]
    firsts = sorted({h: hosts.index(h) for h in hosts}.values())
    node = firsts.index(hosts.index(hosts[rank]))
    assert env == {"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(mine.index(rank)),
                   "LOCAL_WORLD_SIZE": str(len(mine)), "GROUP_RANK": str(node),
                   "GROUP_WORLD_SIZE": str(len(firsts)), "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(size),
                   "ROLE_NAME": "default"}


@pytest.mark.mpi
def test_agree_raises_on_every_rank(dist, rank, size):
    torchrun_env.agree(None, MPI.COMM_WORLD)  # nobody has a problem: nothing happens
    bad = size - 1
    with pytest.raises(RuntimeError) as caught:
        torchrun_env.agree("broken here" if rank == bad else None, MPI.COMM_WORLD)
    text = str(caught.value)
    assert text.startswith(f"mpidist.run: rank {rank}: ")
    assert text.endswith("broken here")
    if rank != bad:
        assert f"rank(s) {bad} cannot start" in text


@pytest.mark.mpi
def test_master_address_on_one_node_is_loopback(dist, rank, monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    addr, port = torchrun_env.master_address(MPI.COMM_WORLD, 0, single_node=True)
    # below the ephemeral range: no outgoing connection can take it before the store binds it
    assert addr == "127.0.0.1" and torchrun_env.PORTS_FROM <= int(port) < _ephemeral_start()
    assert len(set(gathered(dist, (addr, port)))) == 1
    if rank == 0:  # free again for the script's store (one rank binds it: they share the host)
        with socket.socket() as s:
            s.bind((addr, int(port)))


def _ephemeral_start() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:  # read here, not by the code tested
        return int(f.read().split()[0])


def test_the_port_drawn_skips_ports_that_are_taken(monkeypatch):
    # 49 draws land on a port a listening socket holds, the 50th on a free one
    with socket.socket() as held, socket.socket() as probe:
        held.bind(("127.0.0.1", 0))
        held.listen()
        probe.bind(("127.0.0.1", 0))
        taken, free = held.getsockname()[1], probe.getsockname()[1]
        probe.close()
        draws = iter([taken] * 49 + [free])
        monkeypatch.setattr(torchrun_env.random.Random, "randrange", lambda self, a, b: next(draws))
        with torchrun_env._listener("127.0.0.1") as got:
            assert got.getsockname()[1] == free


@pytest.mark.mpi
def test_master_address_across_nodes_is_one_every_rank_reached(dist, rank, monkeypatch):
    # every rank probes, as the first rank of another node would (the connections stay on this host)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    candidates = gathered(dist, torchrun_env._candidates())[0]
    if not candidates:  # a host with loopback only: every rank says so
        with pytest.raises(RuntimeError, match="no address of rank 0"):
            torchrun_env.master_address(MPI.COMM_WORLD, 0, single_node=False)
        return
    addr, port = torchrun_env.master_address(MPI.COMM_WORLD, 0, single_node=False)
    assert addr in candidates and 0 < int(port) < 65536
    assert len(set(gathered(dist, (addr, port)))) == 1


@pytest.mark.mpi
def test_a_master_port_set_on_rank_zero_is_kept_and_a_different_one_refused(dist, rank, size, monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("MASTER_PORT", "29533")
    assert torchrun_env.master_address(MPI.COMM_WORLD, 0, single_node=True) == ("127.0.0.1", "29533")
    if size == 1:
        return
    monkeypatch.setenv("MASTER_PORT", str(29533 + rank))
    with pytest.raises(RuntimeError, match="MASTER_PORT"):
        torchrun_env.master_address(MPI.COMM_WORLD, 0, single_node=True)


def test_contradictions_names_each_variable():
    wanted = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
              "GROUP_WORLD_SIZE": "1", "ROLE_RANK": "1", "ROLE_WORLD_SIZE": "2"}
    assert torchrun_env.contradictions(wanted, {"RANK": "1", "WORLD_SIZE": " "}) is None
    text = torchrun_env.contradictions(wanted, {"RANK": "0", "LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "2"})
    assert "$RANK=0 but MPI gives 1" in text and "$LOCAL_WORLD_SIZE=8 but MPI gives 2" in text
    assert "WORLD_SIZE=2" not in text


def test_reachable_keeps_what_a_connection_reaches():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        assert torchrun_env._reachable(["127.0.0.1", "localhost"], port) in (["127.0.0.1", "localhost"],
                                                                             ["127.0.0.1"])
    assert torchrun_env._reachable(["127.0.0.1"], port) == []  # closed now

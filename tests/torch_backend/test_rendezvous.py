"""How rank 0 picks the one address its store listens on across nodes (no job needed)."""

from __future__ import annotations

import socket

import pytest

from mpidist.torch import netaddr, rendezvous

OFFER = [("10.0.0.1", "10.0.0.1", 1001), ("192.168.5.1", "192.168.5.1", 1002), ("head", "172.16.0.9", 1003)]


def test_the_address_every_node_reaches_directly_wins_then_rank_0s_order():
    # node b reaches the first address only through a router (1), the second directly (2)
    assert rendezvous._choose(OFFER, [None, ("a", [2, 2, 1]), None, ("b", [1, 2, 0])]) == 1
    assert rendezvous._choose(OFFER, [("a", [1, 1, 1]), ("b", [1, 1, 1])]) == 0
    assert rendezvous._choose(OFFER, [("a", [0, 0, 1])]) == 2
    assert rendezvous._choose(OFFER, [None, None]) == 0  # every rank on rank 0's node


def test_no_address_every_node_reaches_names_what_each_node_reached():
    with pytest.raises(RuntimeError) as info:
        rendezvous._choose(OFFER, [("a", [2, 0, 0]), ("b", [0, 1, 0])])
    text = str(info.value)
    assert "a reached ['10.0.0.1']" in text and "b reached ['192.168.5.1']" in text
    assert "MASTER_ADDR" in text


def test_a_master_addr_that_is_loopback_on_rank_0_is_refused_before_anything_listens(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    with pytest.raises(RuntimeError, match="MASTER_ADDR='localhost' resolves to 127.0.0.1"):
        rendezvous._candidates()
    monkeypatch.setenv("MASTER_ADDR", "198.51.100.77")  # an address as given is taken as it is
    assert rendezvous._candidates() == [("198.51.100.77", "198.51.100.77")]


def test_candidates_without_master_addr_are_never_loopback_or_every_interface(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    try:
        found = rendezvous._candidates()
    except RuntimeError as exc:  # a machine with loopback only
        assert "no IPv4 address other than loopback" in str(exc)
        return
    for _, address in found:
        assert address != "0.0.0.0" and not address.startswith("127.")


def test_the_listener_is_bound_to_its_address_and_probes_score_reach():
    with netaddr.listener("127.0.0.1") as s:
        host, port = s.getsockname()
        assert host == "127.0.0.1"
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            closed = free.getsockname()[1]  # bound, not listening: refuses
            targets = [("127.0.0.1", "127.0.0.1", port), ("127.0.0.1", "127.0.0.1", closed)]
            own = [(str(i.ip), str(i.ip), port) for _, i in netaddr.interfaces()][:1]
            # loopback is on none of this host's interface subnets: reached, but not "directly"
            assert netaddr.probe(targets + own, timeout=5) == [1, 0] + [0] * len(own)

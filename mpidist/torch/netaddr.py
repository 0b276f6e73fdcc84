"""This host's IPv4 addresses, and which of a peer's addresses this host can reach.

Used where a rank must advertise a TCP endpoint (the torch backend's store) to ranks on
other nodes: a host name may not resolve there, or resolve to loopback (``127.0.1.1`` in
Debian's ``/etc/hosts``), while an interface address on the shared network always works.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

_SIOCGIFFLAGS = 0x8913
_SIOCGIFADDR = 0x8915
_SIOCGIFNETMASK = 0x891B
_IFF_UP = 0x1
_IFF_LOOPBACK = 0x8


def interfaces() -> list[tuple[str, ipaddress.IPv4Interface]]:
    """``(name, address/netmask)`` of every interface that is up, has IPv4 and is not loopback.

    Linux only (``SIOCGIFADDR`` ioctls); elsewhere, or when none is found, an empty list.
    """
    out = []
    try:
        names = socket.if_nameindex()
    except OSError:
        return out
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in names:
            req = struct.pack("256s", name.encode()[:15])
            try:
                flags = struct.unpack("H", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, req)[16:18])[0]
                addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFADDR, req)[20:24])
                mask = socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFNETMASK, req)[20:24])
            except OSError:  # no IPv4 address on it
                continue
            if flags & _IFF_UP and not flags & _IFF_LOOPBACK:
                iface = ipaddress.IPv4Interface(f"{addr}/{mask}")
                if not iface.ip.is_loopback and not iface.ip.is_link_local:
                    out.append((name, iface))
    return out


def advertised_addresses() -> list[str]:
    """This host's addresses for peers on other nodes: its interface addresses, then its name."""
    found = [str(iface.ip) for _, iface in interfaces()]
    return found + [socket.getfqdn()]


def reachable(candidates: list[str], port: int, timeout: float = 2.0) -> str | None:
    """The first of ``candidates`` that accepts a TCP connection on ``port``, or ``None``.

    Candidates on one of this host's own subnets are tried first (one connect in the
    usual case); each try waits at most ``timeout`` seconds.
    """
    mine = [iface.network for _, iface in interfaces()]

    def local_first(c: str) -> int:
        try:
            ip = ipaddress.IPv4Address(c)
        except ValueError:
            return 1
        return 0 if any(ip in net for net in mine) else 1

    for host in sorted(candidates, key=local_first):
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return host
        except OSError:
            continue
    return None

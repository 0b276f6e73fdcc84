"""This host's IPv4 addresses, and which of a peer's addresses this host can reach.

Used where a rank must advertise a TCP endpoint (the torch backend's store) to ranks on
other nodes: a host name may not resolve there, or resolve to loopback (``127.0.1.1`` in
Debian's ``/etc/hosts``), while an interface address on the shared network always works.
The endpoint listens on that one address (:func:`listener`), never on every interface.
"""

from __future__ import annotations

import concurrent.futures
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


def ipv4_of(host: str) -> str | None:
    """``host``'s IPv4 address as this host resolves it (an address is returned as it is), or ``None``."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        return None


def listener(address: str, port: int = 0) -> socket.socket:
    """A TCP socket listening on ``address`` only (``port`` 0: a free one), never on every interface.

    ``SO_REUSEADDR``, as torch's own store sets it, so that a port left in ``TIME_WAIT`` by an
    earlier job can be bound again.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


def probe(targets: list[tuple[str, str, int]], timeout: float = 2.0) -> list[int]:
    """How well this host reaches each ``(host, address, port)`` of a peer: 0, 1 or 2.

    0: no TCP connection within ``timeout`` seconds, or ``address`` is one of this host's own
    (a peer's ``docker0``-style address that every host has would reach this host, not the
    peer); 1: reached; 2: reached, on one of this host's own subnets (no router between). The
    targets are tried at the same time, so the whole probe takes at most ``timeout``.
    """
    mine = interfaces()
    own = {str(iface.ip) for _, iface in mine}

    def score(target: tuple[str, str, int]) -> int:
        host, address, port = target
        if address in own:
            return 0
        try:
            with socket.create_connection((host, port), timeout=timeout):
                pass
        except OSError:
            return 0
        try:
            ip = ipaddress.IPv4Address(address)
        except ValueError:
            return 1
        return 2 if any(ip in iface.network for _, iface in mine) else 1

    if not targets:
        return []
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(targets)) as pool:
        return list(pool.map(score, targets))

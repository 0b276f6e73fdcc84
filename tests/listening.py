"""What a process listens on, read from ``/proc``: the listening TCP sockets among its descriptors.

For the job scripts of the tests of what mpidist listens on. They run as plain scripts, so each
starts with :data:`PRELUDE`, which puts this folder on ``sys.path`` and imports :func:`listening`.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

PRELUDE = (f"import sys\nsys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
           "from listening import listening\n")


def sockets(pid: int | str = "self") -> set[str]:
    """The socket inodes among the open descriptors of process ``pid``."""
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[8:-1])
    return out


def listening(inherited_from: int | None = None) -> list[tuple[str, int]]:
    """``(address, port)`` of this process's listening TCP sockets (IPv6 as ``"ipv6:<hex>"``),
    less those process ``inherited_from`` holds too: MPICH's proxy hands each rank a socket of its
    own on 0.0.0.0, which is not mpidist's."""
    mine = sockets() - (sockets(inherited_from) if inherited_from is not None else set())
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            rows = f.read().splitlines()[1:]
        for line in rows:
            fields = line.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if fields[3] == "0A" and fields[9] in mine:  # 0A: TCP_LISTEN
                ipv4 = table.endswith("tcp")
                out.append((socket.inet_ntoa(bytes.fromhex(address)[::-1]) if ipv4 else "ipv6:" + address,
                            int(hex_port, 16)))
    return out

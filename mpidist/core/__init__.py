"""The core: what every call stands on.

Errors (:mod:`.errors`), the call registry (:mod:`.registry`: each call's facts, declared where
it is defined), process groups and their communicators (:mod:`.groups`, :mod:`.subgroups`,
:mod:`.topology`), the tag layout (:mod:`.tags`), buffers (:mod:`.buffers`: any array to what
MPI sees), ``Work`` (:mod:`.work`), the one backoff (:mod:`.waiting`), the bounded wait every call ends in
(:mod:`.timeouts`), what a give-up reports (:mod:`.reports`) and rank lists in reports
(:mod:`.ranklists`), the CPUs a process may run on (:mod:`.cpus`), and every ``MPIDIST_*``
variable with how it is read (:mod:`.settings`, the standard library only). Beside it, at the
same level, :mod:`mpidist.gpu` (device buffers).

Imports: the standard library, numpy, mpi4py and :mod:`mpidist.gpu`; nothing else of mpidist.
Importing this package imports none of its modules.
"""

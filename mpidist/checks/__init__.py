"""The checks and watches: what catches a wrong or stuck job.

The default cross-rank argument check (:mod:`.signature`), debug mode (:mod:`.debug`, with what
it describes of a call's arguments in :mod:`.fingerprint`),
``monitored_barrier`` (:mod:`.monitor`), the stall watch and its roll call (:mod:`.stall`,
:mod:`.rollcall`), fail-fast on an uncaught exception (:mod:`.failure`) and the flight recorder
(:mod:`.flight`). Each is a hook on the call registry or a thread of its own: no call names
them in its body except the call path's debug check.

Imports: :mod:`mpidist.core` (and each other); never the calls above.
"""

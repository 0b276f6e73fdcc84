"""The calls: every collective, point-to-point and object call, and the one path they follow.

:mod:`.path` is the call path (resolve the group, check, convert buffers, map the op, call MPI,
wait); :mod:`.collectives` holds the reductions, broadcast and barrier, :mod:`.exchange` the
gathers, scatters and all-to-alls, :mod:`.p2p` point-to-point, :mod:`.objects` the object calls
(pickled by :mod:`.pickles`), :mod:`.sparse` sparse all_reduce; :mod:`.ops` maps reduce ops, and
:mod:`.lowprec` with :mod:`.lowprec_math` (and the C kernel ``_lowprec.c``) reduces float16/bfloat16.

Imports: :mod:`mpidist.core`, :mod:`mpidist.gpu` and :mod:`mpidist.checks`.
"""

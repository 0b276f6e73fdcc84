"""The optional C parts; everything else is in setup.cfg.

* ``mpidist.calls._words16``: the float16/bfloat16 kernel;
* ``mpidist.calls._native``: a small blocking all_reduce's, broadcast's or barrier's MPI call and
  the first part of its wait (it needs no MPI header: :mod:`mpidist.calls.native` hands it the
  routines mpi4py loaded).

``optional=True``: without a C compiler (or Python headers) the build warns and mpidist installs
without them; :mod:`mpidist.calls.lowprec` then uses its numpy path, and those calls mpi4py's.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("mpidist.calls._words16", ["mpidist/calls/_words16.c"],
                             extra_compile_args=["-O3"], optional=True),
                   Extension("mpidist.calls._native", ["mpidist/calls/_native.c"],
                             extra_compile_args=["-O2"], optional=True)])

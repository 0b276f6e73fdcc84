"""The optional C part; everything else is in setup.cfg.

``mpidist.calls._lowprec``: the float16/bfloat16 kernel of the 16-bit reductions.
``optional=True``: without a C compiler (or Python headers) the build warns and mpidist installs
without it; :mod:`mpidist.calls.lowprec` then uses its numpy path.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("mpidist.calls._lowprec", ["mpidist/calls/_lowprec.c"],
                             extra_compile_args=["-O3"], optional=True)])

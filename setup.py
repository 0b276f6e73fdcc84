"""The optional C part; everything else is in setup.cfg.

``mpidist.calls._words16``: the float16/bfloat16 kernel of the 16-bit reductions.
``optional=True``: without a C compiler (or Python headers) the build warns and mpidist installs
without it; :mod:`mpidist.calls.lowprec` then uses its numpy path.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("mpidist.calls._words16", ["mpidist/calls/_words16.c"],
                             extra_compile_args=["-O3"], optional=True)])

"""The optional float16/bfloat16 kernel (``mpidist.calls._words16``); everything else is in setup.cfg.

``optional=True``: without a C compiler (or Python headers) the build warns and mpidist installs
without the kernel, and :mod:`mpidist.calls.lowprec` uses its numpy path.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("mpidist.calls._words16", ["mpidist/calls/_words16.c"],
                             extra_compile_args=["-O3"], optional=True)])

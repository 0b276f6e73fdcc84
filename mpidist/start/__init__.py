"""Starting and ending a job.

Before MPI runs (``mpidist/__init__.py`` imports these first): the bound on ``MPI_Init``
(:mod:`.startup`), the thread level (:mod:`.thread_level`) and loading the MPI library, or
saying why it cannot be loaded (:mod:`.mpi_library`, with :mod:`.libmpi`: which library a file
is, and the files installed with it). Then: what the launcher says
(:mod:`.launcher`), the default group's life (:mod:`.world`: ``init_process_group``,
``destroy_process_group``, ranks and sizes), ``python -m mpidist info`` (:mod:`.info`), printing on
rank 0 (:mod:`.printing`) and torchrun's variables from MPI (:mod:`.torchrun_env`).

Imports: :mod:`mpidist.core`, :mod:`mpidist.gpu` and :mod:`mpidist.checks` (``init_process_group``
arms the watches). The first four modules import nothing of mpidist but the core's errors.
"""

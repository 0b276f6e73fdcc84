"""Glue for the training libraries that start torch.distributed themselves.

:mod:`mpidist.integrations.lightning` holds :class:`~mpidist.integrations.lightning.MpidistEnvironment`,
a Lightning ``ClusterEnvironment`` whose ranks, nodes and rendezvous come from MPI. Each module
imports its library when it is imported itself, never before: ``import mpidist`` and
``import mpidist.torch`` work without Lightning installed. HF Trainer and accelerate need no
module here: :func:`mpidist.torch.use_for_cpu` is enough for them (see the docs' "Training
libraries" pages).

Imports: the library each module is named for, torch, and the layers below (:mod:`mpidist.start`,
:mod:`mpidist.core`); :mod:`mpidist.torch` beside it (layer 3) where a module needs the backend.
"""

"""Training helpers: the pieces of a data-parallel training script.

``init_distributed_mode`` (:mod:`.distributed_mode`: the DETR-style helper that finds the
launcher, the local rank and the device, and starts torch.distributed in a torch program),
``DistributedSampler`` (:mod:`.sampler`) and gradient averaging (:mod:`.gradients`).

Imports: every layer below (:mod:`mpidist.start`, :mod:`mpidist.calls`, :mod:`mpidist.core`) and,
beside it, :mod:`mpidist.torch` (imported only in a torch program).
"""

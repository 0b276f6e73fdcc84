"""The benchmark suite behind ``benchmarks/run.py``: OSU-style latency per call and size.

``cases`` knows each call and how every implementation (mpidist, raw mpi4py, the C
floor, torch.distributed on gloo) performs it on shared buffers; ``timing`` runs the
implementations interleaved and reduces rounds to medians and paired ratios; ``cfloor``
builds the C library with the MPI's ``mpicc``; ``report`` prints the table and writes
the JSON and the plots.
"""

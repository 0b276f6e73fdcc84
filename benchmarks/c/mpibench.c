/* The C floor: timed loops of one MPI call each, on the caller's communicator and buffers.
 *
 * benchmarks/suite/cfloor.py builds this with the MPI's own mpicc as a shared library and
 * calls mpib_run() through ctypes from inside the benchmark job, so C runs interleaved with
 * the Python implementations, on the same communicator and the same buffers. MPI is already
 * initialised by mpi4py; nothing here initialises or finalises it.
 *
 * Buffers hold MPI_FLOAT; `count` is the elements of one rank's block (the message size).
 * The return value is the elapsed MPI_Wtime() of `iters` calls.
 */
#include <mpi.h>
#include <stddef.h>

enum {
    MPIB_ALLREDUCE = 0, MPIB_BCAST, MPIB_REDUCE, MPIB_ALLGATHER, MPIB_REDUCE_SCATTER,
    MPIB_ALLTOALL, MPIB_GATHER, MPIB_SCATTER, MPIB_PINGPONG, MPIB_BARRIER
};

double mpib_run(int call, MPI_Comm comm, void *sbuf, void *rbuf, int count, int iters)
{
    int rank, i;
    MPI_Comm_rank(comm, &rank);
    double t0 = MPI_Wtime();
    switch (call) {
    case MPIB_ALLREDUCE:
        for (i = 0; i < iters; i++)
            MPI_Allreduce(MPI_IN_PLACE, rbuf, count, MPI_FLOAT, MPI_SUM, comm);
        break;
    case MPIB_BCAST:
        for (i = 0; i < iters; i++)
            MPI_Bcast(rbuf, count, MPI_FLOAT, 0, comm);
        break;
    case MPIB_REDUCE:  /* as mpidist: the root reduces in place, the others only send */
        for (i = 0; i < iters; i++)
            MPI_Reduce(rank == 0 ? MPI_IN_PLACE : rbuf, rank == 0 ? rbuf : NULL, count,
                       MPI_FLOAT, MPI_SUM, 0, comm);
        break;
    case MPIB_ALLGATHER:
        for (i = 0; i < iters; i++)
            MPI_Allgather(sbuf, count, MPI_FLOAT, rbuf, count, MPI_FLOAT, comm);
        break;
    case MPIB_REDUCE_SCATTER:
        for (i = 0; i < iters; i++)
            MPI_Reduce_scatter_block(sbuf, rbuf, count, MPI_FLOAT, MPI_SUM, comm);
        break;
    case MPIB_ALLTOALL:
        for (i = 0; i < iters; i++)
            MPI_Alltoall(sbuf, count, MPI_FLOAT, rbuf, count, MPI_FLOAT, comm);
        break;
    case MPIB_GATHER:
        for (i = 0; i < iters; i++)
            MPI_Gather(sbuf, count, MPI_FLOAT, rbuf, count, MPI_FLOAT, 0, comm);
        break;
    case MPIB_SCATTER:
        for (i = 0; i < iters; i++)
            MPI_Scatter(sbuf, count, MPI_FLOAT, rbuf, count, MPI_FLOAT, 0, comm);
        break;
    case MPIB_PINGPONG:  /* ranks 0 and 1 bounce one message; the others wait outside */
        if (rank == 0) {
            for (i = 0; i < iters; i++) {
                MPI_Send(rbuf, count, MPI_FLOAT, 1, 0, comm);
                MPI_Recv(rbuf, count, MPI_FLOAT, 1, 0, comm, MPI_STATUS_IGNORE);
            }
        } else if (rank == 1) {
            for (i = 0; i < iters; i++) {
                MPI_Recv(rbuf, count, MPI_FLOAT, 0, 0, comm, MPI_STATUS_IGNORE);
                MPI_Send(rbuf, count, MPI_FLOAT, 0, 0, comm);
            }
        }
        break;
    case MPIB_BARRIER:
        for (i = 0; i < iters; i++)
            MPI_Barrier(comm);
        break;
    default:
        return -1.0;
    }
    return MPI_Wtime() - t0;
}

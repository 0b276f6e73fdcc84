/* In-place MPI_Iallreduce and the first part of its bounded wait, in one call from Python.
 *
 * For a small all_reduce the Python around MPI costs more than MPI: mpi4py's Request object,
 * each Test, the loop that yields the core between tests. This module runs the start and the
 * spin of mpidist.core.timeouts.wait in C: one MPI_Test, then QUICK_TESTS tests in runs of
 * TESTS_PER_YIELD with sched_yield between runs, then the same runs until the spin ends
 * (SPIN_LEAST + bytes * SPIN_PER_BYTE seconds, at most SPIN). What is still incomplete then goes
 * back to Python as the request's handle, and the bounded wait (notices, the group's timeout)
 * goes on there.
 *
 * No MPI header is needed at build time: the MPI routines come as addresses from the library
 * mpi4py loaded (mpidist/calls/native.py finds them) and the handles as integers. Two handle
 * ABIs exist among the MPIs mpi4py runs on, and mpi4py's own wheels tell them apart the same
 * way: MPICH's (MPICH, Intel MPI, Cray MPICH, MVAPICH), whose handles are C ints, and Open
 * MPI's, whose handles are pointers. setup() says which, and what MPI_IN_PLACE is there.
 *
 * allreduce(buf, datatype, extent, op, comm) -> None (done) | int (the pending request) |
 * NotImplemented (a count over INT_MAX: the caller takes mpi4py's large-count path).
 * An MPI error raises the exception class given to setup() with the error code.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>

typedef int (*iallreduce_int_t)(const void *, void *, int, int, int, int, int *);
typedef int (*test_int_t)(int *, int *, void *);
typedef int (*iallreduce_ptr_t)(const void *, void *, int, void *, void *, void *, void **);
typedef int (*test_ptr_t)(void **, int *, void *);

static void *f_iallreduce, *f_test;
static int pointer_handles;          /* 0: MPICH's int handles; 1: Open MPI's pointers */
static void *in_place;
static PyObject *mpi_exception;
static int quick_tests = 32, tests_per_yield = 4, clock_every = 4;
static double spin_least = 0.003, spin_per_byte = 1 / 256e6, spin_most = 0.01;

/* Room for any MPI_Status (MPICH: 20 bytes, Open MPI: 24, the standard ABI: 32). MPI_Test
 * writes it on completion; a real status instead of MPI_STATUS_IGNORE, whose value differs
 * between the ABIs. */
typedef struct { int64_t words[16]; } status_t;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One request of either ABI: its handle and the test for it. */
typedef struct {
    int ireq;
    void *preq;
} request_t;

static int test(request_t *r, int *flag, status_t *st) {
    if (pointer_handles)
        return ((test_ptr_t)f_test)(&r->preq, flag, st);
    return ((test_int_t)f_test)(&r->ireq, flag, st);
}

/* Tests in runs of tests_per_yield, a sched_yield after each run, until done (1), an MPI error
 * (*err set, 1), or: rounds runs when until is 0, else until the clock passes it (0). */
static int spin(request_t *r, int rounds, double until, int *err) {
    status_t st;
    int flag = 0;
    for (int i = 0; until > 0 || i < rounds; i++) {
        for (int k = 0; k < tests_per_yield; k++) {
            if ((*err = test(r, &flag, &st)) != 0 || flag)
                return 1;
        }
        sched_yield();
        if (until > 0 && (i + 1) % clock_every == 0 && now() >= until)
            return 0;
    }
    return 0;
}

static PyObject *raise_mpi(int err) {
    PyObject *code = PyLong_FromLong(err);
    if (code != NULL) {
        PyErr_SetObject(mpi_exception, code);
        Py_DECREF(code);
    }
    return NULL;
}

static PyObject *allreduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "allreduce(buf, datatype, extent, op, comm)");
        return NULL;
    }
    if (f_iallreduce == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "mpidist.calls._iallreduce: setup() was not called");
        return NULL;
    }
    /* mpi4py gives an int handle sign-extended to 64 bits, unsigned: the low bits are the handle */
    unsigned long long dtype = PyLong_AsUnsignedLongLongMask(args[1]);
    Py_ssize_t extent = PyLong_AsSsize_t(args[2]);
    unsigned long long op = PyLong_AsUnsignedLongLongMask(args[3]);
    unsigned long long comm = PyLong_AsUnsignedLongLongMask(args[4]);
    if (PyErr_Occurred())
        return NULL;
    if (extent <= 0) {
        PyErr_SetString(PyExc_ValueError, "extent must be positive");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) != 0)
        return NULL;
    if (view.len % extent != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "the buffer is not a whole number of elements");
        return NULL;
    }
    Py_ssize_t count = view.len / extent;
    if (count > INT_MAX) {
        PyBuffer_Release(&view);
        Py_RETURN_NOTIMPLEMENTED;
    }
    request_t r = {0, NULL};
    int err;
    if (pointer_handles)
        err = ((iallreduce_ptr_t)f_iallreduce)(in_place, view.buf, (int)count, (void *)(uintptr_t)dtype,
                                                (void *)(uintptr_t)op, (void *)(uintptr_t)comm, &r.preq);
    else
        err = ((iallreduce_int_t)f_iallreduce)(in_place, view.buf, (int)count, (int)dtype, (int)op,
                                                (int)comm, &r.ireq);
    double bytes = (double)view.len;
    /* MPI writes into the buffer until the request completes; the caller holds the array for
     * as long (the bounded wait keeps it with a group it gives up on) */
    PyBuffer_Release(&view);
    if (err != 0)
        return raise_mpi(err);
    status_t st;
    int flag = 0;
    if ((err = test(&r, &flag, &st)) != 0)
        return raise_mpi(err);
    if (!flag) {
        int done;
        Py_BEGIN_ALLOW_THREADS
        done = spin(&r, quick_tests / tests_per_yield, 0.0, &err);
        if (!done) {
            double s = spin_least + bytes * spin_per_byte;
            done = spin(&r, 0, now() + (s < spin_most ? s : spin_most), &err);
        }
        flag = done && err == 0;
        Py_END_ALLOW_THREADS
        if (err != 0)
            return raise_mpi(err);
    }
    if (flag)
        Py_RETURN_NONE;
    if (pointer_handles)
        return PyLong_FromVoidPtr(r.preq);
    return PyLong_FromUnsignedLongLong((unsigned long long)(long long)r.ireq);  /* as mpi4py gives them */
}

static PyObject *setup(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long iallreduce_at, test_at;
    long long in_place_value;
    int pointers;
    PyObject *exc;
    if (!PyArg_ParseTuple(args, "KKpLO|iiiddd", &iallreduce_at, &test_at, &pointers, &in_place_value,
                          &exc, &quick_tests, &tests_per_yield, &clock_every, &spin_least,
                          &spin_per_byte, &spin_most))
        return NULL;
    if (!iallreduce_at || !test_at || tests_per_yield < 1 || clock_every < 1 || quick_tests < 0) {
        PyErr_SetString(PyExc_ValueError, "setup: a routine's address is 0, or a count is < 1");
        return NULL;
    }
    Py_INCREF(exc);
    Py_XSETREF(mpi_exception, exc);
    f_iallreduce = (void *)(uintptr_t)iallreduce_at;
    f_test = (void *)(uintptr_t)test_at;
    pointer_handles = pointers;
    in_place = (void *)(intptr_t)in_place_value;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"allreduce", (PyCFunction)(void (*)(void))allreduce, METH_FASTCALL,
     "allreduce(buf, datatype, extent, op, comm): in-place MPI_Iallreduce, then the spin of the "
     "bounded wait; None when done, else the pending request's handle."},
    {"setup", setup, METH_VARARGS,
     "setup(iallreduce, test, pointer_handles, in_place, exception[, quick_tests, tests_per_yield, "
     "clock_every, spin_least, spin_per_byte, spin_most])"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_iallreduce", NULL, -1, methods};

PyMODINIT_FUNC PyInit__iallreduce(void) { return PyModule_Create(&module); }

/* Small blocking collectives' MPI part in one call from Python: the nonblocking start and the
 * first part of its bounded wait.
 *
 * For a small all_reduce, broadcast or barrier the Python around MPI costs more than MPI:
 * mpi4py's Request object, each Test, the loop that yields the core between tests. Each call here
 * starts the nonblocking routine (MPI_Iallreduce in place, MPI_Ibcast, MPI_Ibarrier) and runs the
 * start and the spin of mpidist.core.timeouts.wait in C: one MPI_Test, then QUICK_TESTS tests in
 * runs of TESTS_PER_YIELD with sched_yield between runs, then the same runs until the spin ends
 * (SPIN_LEAST + bytes * SPIN_PER_BYTE seconds, at most SPIN), the GIL released. What is still
 * incomplete then goes back to Python as the request's handle, and the bounded wait (notices,
 * the group's timeout) goes on there.
 *
 * No MPI header is needed at build time: the MPI routines come as addresses from the library
 * mpi4py loaded (mpidist/calls/native.py finds them) and the handles as integers. Two handle
 * ABIs exist among the MPIs mpi4py runs on, and mpi4py's own wheels tell them apart the same
 * way: MPICH's (MPICH, Intel MPI, Cray MPICH, MVAPICH), whose handles are C ints, and Open
 * MPI's, whose handles are pointers. setup() says which, and what MPI_IN_PLACE is there.
 *
 * allreduce(buf, datatype, extent, op, comm), bcast(buf, datatype, extent, root, comm, writable),
 * barrier(comm) -> None (done) | int (the pending request) | NotImplemented (a count over
 * INT_MAX: the caller takes mpi4py's large-count path). An MPI error raises the exception class
 * given to setup() with the error code.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>

typedef int (*iallreduce_int_t)(const void *, void *, int, int, int, int, int *);
typedef int (*ibcast_int_t)(void *, int, int, int, int, int *);
typedef int (*ibarrier_int_t)(int, int *);
typedef int (*test_int_t)(int *, int *, void *);
typedef int (*iallreduce_ptr_t)(const void *, void *, int, void *, void *, void *, void **);
typedef int (*ibcast_ptr_t)(void *, int, void *, int, void *, void **);
typedef int (*ibarrier_ptr_t)(void *, void **);
typedef int (*test_ptr_t)(void **, int *, void *);

static void *f_iallreduce, *f_ibcast, *f_ibarrier, *f_test;
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

/* The rest of a started call: test once; then, the GIL released, the quick tests and the spin.
 * None when done, else the pending request's handle. */
static PyObject *finish(request_t *r, int err, double bytes) {
    if (err != 0)
        return raise_mpi(err);
    status_t st;
    int flag = 0;
    if ((err = test(r, &flag, &st)) != 0)
        return raise_mpi(err);
    if (!flag) {
        int done;
        Py_BEGIN_ALLOW_THREADS
        done = spin(r, quick_tests / tests_per_yield, 0.0, &err);
        if (!done) {
            double s = spin_least + bytes * spin_per_byte;
            done = spin(r, 0, now() + (s < spin_most ? s : spin_most), &err);
        }
        flag = done && err == 0;
        Py_END_ALLOW_THREADS
        if (err != 0)
            return raise_mpi(err);
    }
    if (flag)
        Py_RETURN_NONE;
    if (pointer_handles)
        return PyLong_FromVoidPtr(r->preq);
    return PyLong_FromUnsignedLongLong((unsigned long long)(long long)r->ireq);  /* as mpi4py gives them */
}

/* mpi4py gives an int handle sign-extended to 64 bits, unsigned: the low bits are the handle */
static unsigned long long handle_of(PyObject *o) { return PyLong_AsUnsignedLongLongMask(o); }

/* The buffer and its element count: 0, or -1 with an exception set, or 1 for a count past
 * INT_MAX (view released). MPI reads or writes the memory until the request completes; the
 * caller holds the array for as long (the bounded wait keeps it with a group it gives up on). */
static int take(PyObject *obj, PyObject *extent_obj, int writable, Py_buffer *view, int *count) {
    Py_ssize_t extent = PyLong_AsSsize_t(extent_obj);
    if (extent == -1 && PyErr_Occurred())
        return -1;
    if (extent <= 0) {
        PyErr_SetString(PyExc_ValueError, "extent must be positive");
        return -1;
    }
    if (PyObject_GetBuffer(obj, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) != 0)
        return -1;
    if (view->len % extent != 0) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "the buffer is not a whole number of elements");
        return -1;
    }
    if (view->len / extent > INT_MAX) {
        PyBuffer_Release(view);
        return 1;
    }
    *count = (int)(view->len / extent);
    return 0;
}

static PyObject *not_implemented(void) {
    Py_INCREF(Py_NotImplemented);
    return Py_NotImplemented;
}

static int ready(const char *name, void *routine, Py_ssize_t nargs, Py_ssize_t want) {
    if (routine == NULL) {
        PyErr_Format(PyExc_RuntimeError, "mpidist.calls._native.%s: setup() was not called", name);
        return 0;
    }
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", name, want, nargs);
        return 0;
    }
    return 1;
}

static PyObject *allreduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (!ready("allreduce(buf, datatype, extent, op, comm)", f_iallreduce, nargs, 5))
        return NULL;
    unsigned long long dtype = handle_of(args[1]), op = handle_of(args[3]), comm = handle_of(args[4]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer view;
    int count, got = take(args[0], args[2], 1, &view, &count);
    if (got != 0)
        return got < 0 ? NULL : not_implemented();
    request_t r = {0, NULL};
    int err;
    if (pointer_handles)
        err = ((iallreduce_ptr_t)f_iallreduce)(in_place, view.buf, count, (void *)(uintptr_t)dtype,
                                                (void *)(uintptr_t)op, (void *)(uintptr_t)comm, &r.preq);
    else
        err = ((iallreduce_int_t)f_iallreduce)(in_place, view.buf, count, (int)dtype, (int)op,
                                                (int)comm, &r.ireq);
    double bytes = (double)view.len;
    PyBuffer_Release(&view);
    return finish(&r, err, bytes);
}

static PyObject *bcast(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (!ready("bcast(buf, datatype, extent, root, comm, writable)", f_ibcast, nargs, 6))
        return NULL;
    unsigned long long dtype = handle_of(args[1]), comm = handle_of(args[4]);
    long root = PyLong_AsLong(args[3]);
    int writable = PyObject_IsTrue(args[5]);
    if (PyErr_Occurred())
        return NULL;
    if (root < 0 || root > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "root must be a rank (0 or more)");
        return NULL;
    }
    Py_buffer view;
    int count, got = take(args[0], args[2], writable, &view, &count);
    if (got != 0)
        return got < 0 ? NULL : not_implemented();
    request_t r = {0, NULL};
    int err;
    if (pointer_handles)
        err = ((ibcast_ptr_t)f_ibcast)(view.buf, count, (void *)(uintptr_t)dtype, (int)root,
                                        (void *)(uintptr_t)comm, &r.preq);
    else
        err = ((ibcast_int_t)f_ibcast)(view.buf, count, (int)dtype, (int)root, (int)comm, &r.ireq);
    double bytes = (double)view.len;
    PyBuffer_Release(&view);
    return finish(&r, err, bytes);
}

static PyObject *barrier(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (!ready("barrier(comm)", f_ibarrier, nargs, 1))
        return NULL;
    unsigned long long comm = handle_of(args[0]);
    if (PyErr_Occurred())
        return NULL;
    request_t r = {0, NULL};
    int err;
    if (pointer_handles)
        err = ((ibarrier_ptr_t)f_ibarrier)((void *)(uintptr_t)comm, &r.preq);
    else
        err = ((ibarrier_int_t)f_ibarrier)((int)comm, &r.ireq);
    return finish(&r, err, 0.0);
}

static PyObject *setup(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long iallreduce_at, ibcast_at, ibarrier_at, test_at;
    long long in_place_value;
    int pointers;
    PyObject *exc;
    if (!PyArg_ParseTuple(args, "KKKKpLO|iiiddd", &iallreduce_at, &ibcast_at, &ibarrier_at, &test_at,
                          &pointers, &in_place_value, &exc, &quick_tests, &tests_per_yield,
                          &clock_every, &spin_least, &spin_per_byte, &spin_most))
        return NULL;
    if (!iallreduce_at || !ibcast_at || !ibarrier_at || !test_at || tests_per_yield < 1 || clock_every < 1
        || quick_tests < 0) {
        PyErr_SetString(PyExc_ValueError, "setup: a routine's address is 0, or a count is < 1");
        return NULL;
    }
    Py_INCREF(exc);
    Py_XSETREF(mpi_exception, exc);
    f_iallreduce = (void *)(uintptr_t)iallreduce_at;
    f_ibcast = (void *)(uintptr_t)ibcast_at;
    f_ibarrier = (void *)(uintptr_t)ibarrier_at;
    f_test = (void *)(uintptr_t)test_at;
    pointer_handles = pointers;
    in_place = (void *)(intptr_t)in_place_value;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"allreduce", (PyCFunction)(void (*)(void))allreduce, METH_FASTCALL,
     "allreduce(buf, datatype, extent, op, comm): in-place MPI_Iallreduce, then the spin of the "
     "bounded wait; None when done, else the pending request's handle."},
    {"bcast", (PyCFunction)(void (*)(void))bcast, METH_FASTCALL,
     "bcast(buf, datatype, extent, root, comm, writable): MPI_Ibcast, then the spin; as allreduce."},
    {"barrier", (PyCFunction)(void (*)(void))barrier, METH_FASTCALL,
     "barrier(comm): MPI_Ibarrier, then the spin; as allreduce."},
    {"setup", setup, METH_VARARGS,
     "setup(iallreduce, ibcast, ibarrier, test, pointer_handles, in_place, exception[, quick_tests, "
     "tests_per_yield, clock_every, spin_least, spin_per_byte, spin_most])"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }

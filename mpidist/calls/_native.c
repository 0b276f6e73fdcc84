/* Small blocking collectives' MPI part in one call from Python: the nonblocking start and the
 * first part of its bounded wait.
 *
 * For a small all_reduce, broadcast or barrier the Python around MPI costs more than MPI:
 * mpi4py's Request object, each Test, the loop that yields the core between tests. Each call here
 * starts the nonblocking routine (MPI_Iallreduce in place, MPI_Ibcast, MPI_Ibarrier) and runs the
 * start and the spin of mpidist.core.timeouts.wait in C: one MPI_Test, then QUICK_TESTS tests in
 * runs of TESTS_PER_YIELD with sched_yield between runs, then the same runs until the spin ends
 * (SPIN_LEAST + bytes * SPIN_PER_BYTE seconds, at most SPIN_MOST), the GIL released. What is still
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
 * given to setup() with the error code. Each takes the group's bell mask as an optional last
 * argument (the node's bell, below and mpidist/core/bell.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h> /* PyMemberDef, before Python 3.12 */
#include <limits.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

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
static double spin_least = 0.003, spin_per_byte = 1 / 256e6, spin_most = 0.01, spin_alone = 0.0,
              alone_per_byte = 0.0;
/* all_reduce leaves arrays of this many bytes or more to Python (0: none), where a group on one
 * node sums them through its shared window (mpidist/calls/nodereduce.py) */
static Py_ssize_t large_from = 0;

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


/* ---- The node's bell (mpidist/core/bell.py): a page of shared memory that every rank of the node
 * maps. Word 0 is a futex that a rank rings when it starts a call and some rank of the node sleeps
 * on it (word 1 counts the sleepers); then one cache line per local rank, whose first word counts
 * the waits that rank's threads are in, and whose words 2-3 hold the ticket of the last call it
 * reached (bell_ticket). A wait whose group lies on one node spins only while
 * every member is in a wait (a member still computing rings the bell when it arrives, so spinning
 * for it would only take the core it needs), and otherwise sleeps on the futex, in the kernel as
 * gloo's waits do, until a ring or its pause's end. Everything here is a hint: a lost ring costs
 * one pause, never a wrong result. */
#define BELL_LINE 16 /* uint32 words per cache line */
static uint32_t *bell_words;
static int bell_me;

static inline uint32_t *bell_slot(int i) { return bell_words + (size_t)(i + 1) * BELL_LINE; }

static void bell_ring(void) {
    uint32_t *b = bell_words;
    if (b != NULL && __atomic_load_n(&b[1], __ATOMIC_SEQ_CST) != 0) {
        __atomic_add_fetch(&b[0], 1, __ATOMIC_SEQ_CST);
#ifdef __linux__
        syscall(SYS_futex, &b[0], FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
#endif
    }
}

/* A call's ticket: its group (the mask, folded to 32 bits) and its number there (the group's seq,
 * which every member counts alike), stored in words 2-3 of a rank's line as it starts a wait for
 * the call; 0: a wait that is no call of the group's (point to point) and leaves the word alone. */
static inline uint64_t *bell_ticket_at(int i) { return (uint64_t *)(void *)(bell_slot(i) + 2); }

static unsigned long long bell_ticket(unsigned long long mask, unsigned long long seq) {
    return (((mask ^ (mask >> 32)) & 0xffffffffULL) << 32) | (seq & 0xffffffffULL);
}

/* this process has reached the call of ticket (0: none) */
static void bell_arrive(unsigned long long ticket) {
    if (bell_words != NULL && ticket != 0)
        __atomic_store_n(bell_ticket_at(bell_me), (uint64_t)ticket, __ATOMIC_SEQ_CST);
}

/* this process starts (+1) or ends (-1) a wait, for the call of this ticket (0: none); starting
 * one rings the bell */
static void bell_enter(int delta, unsigned long long ticket) {
    if (bell_words == NULL)
        return;
    if (delta > 0)
        bell_arrive(ticket);
    __atomic_add_fetch(bell_slot(bell_me), (uint32_t)delta, __ATOMIC_SEQ_CST);
    if (delta > 0)
        bell_ring();
}

/* the local ranks of mask that are in a wait, as bits of mask */
static unsigned long long bell_in_bits(unsigned long long mask) {
    unsigned long long in = 0;
    if (bell_words == NULL)
        return mask;
    for (int i = 0; (mask >> i) != 0; i++)
        if (((mask >> i) & 1) && __atomic_load_n(bell_slot(i), __ATOMIC_SEQ_CST) != 0)
            in |= 1ULL << i;
    return in;
}

/* the local ranks of mask that have started a wait for the call of this ticket, or a later call
 * of the same group */
static unsigned long long bell_arrived_bits(unsigned long long mask, unsigned long long ticket) {
    unsigned long long arrived = 0;
    if (bell_words == NULL)
        return mask;
    for (int i = 0; (mask >> i) != 0; i++) {
        if (!((mask >> i) & 1))
            continue;
        uint64_t t = __atomic_load_n(bell_ticket_at(i), __ATOMIC_SEQ_CST);
        if ((t >> 32) == (ticket >> 32) && (int32_t)((uint32_t)t - (uint32_t)ticket) >= 0)
            arrived |= 1ULL << i;
    }
    return arrived;
}

/* What a spinning wait has seen of its group: when every member was last in a wait at once (or
 * when it started), and (a wait with no ticket) who has been seen in one. */
typedef struct {
    double last_all;
    unsigned long long seen;
} watch_t;

enum { LOOK_STOP = 1, LOOK_LATE = 2 }; /* bell_look's bits */

/* Whether a wait of mask for the call of ticket spins on at time t (LOOK_STOP clear), and whether
 * a member has not reached the call (LOOK_LATE: its ticket is behind; without a ticket, it has
 * not been seen in a wait). It spins while every member is in a wait, and otherwise for a while
 * since they last were: alone seconds while a member has not reached the call (it rings when it
 * arrives, so the wait may sleep until then), gone seconds once every member has (a member out of
 * its wait did its part, while this rank's part of a large message moves only while it tests).
 * A member seen in a wait for its previous call and out again is late, not done: it computes. */
static int bell_look(watch_t *w, unsigned long long mask, unsigned long long ticket, double alone, double gone,
                     double t) {
    unsigned long long in = bell_in_bits(mask);
    w->seen |= in;
    if (in == mask) {
        w->last_all = t;
        return 0;
    }
    unsigned long long arrived = ticket ? bell_arrived_bits(mask, ticket) | (1ULL << bell_me) : w->seen;
    if ((mask & ~arrived) != 0)
        return LOOK_LATE | (t >= w->last_all + alone ? LOOK_STOP : 0);
    return t >= w->last_all + gone ? LOOK_STOP : 0;
}

/* every local rank in mask is in a wait (mask 0: the group is not on one node: spin as ever) */
static int bell_all_in(unsigned long long mask) { return bell_in_bits(mask) == mask; }

/* Tests in runs of tests_per_yield, a sched_yield after each run, until done (1), an MPI error
 * (*err set, 1), or (0): rounds runs when until is 0; else until the clock passes until, or, with
 * a bell mask, bell_look says to stop (the call of ticket; alone and gone seconds). */
static int spin(request_t *r, int rounds, double alone, double gone, double until, unsigned long long mask,
                unsigned long long ticket, int *err) {
    status_t st;
    int flag = 0;
    double t0 = until > 0 ? now() : 0.0;
    watch_t w = {t0, 0};
    for (int i = 0; until > 0 || i < rounds; i++) {
        for (int k = 0; k < tests_per_yield; k++) {
            if ((*err = test(r, &flag, &st)) != 0 || flag)
                return 1;
        }
        sched_yield();
        if (until > 0 && (i + 1) % clock_every == 0) {
            double t = now();
            if (t >= until)
                return 0;
            if (mask && bell_words != NULL && (bell_look(&w, mask, ticket, alone, gone, t) & LOOK_STOP))
                return 0;
        }
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
 * None when done, else the pending request's handle. With a bell mask (the group's members on
 * this node, mpidist/core/bell.py) the call rings the bell, counts as a wait while it is one, and
 * spins only while every member is in a wait; a handle returned is still counted as a wait, which
 * the bounded wait in Python ends. */
static PyObject *finish(request_t *r, int err, double bytes, unsigned long long mask, unsigned long long ticket) {
    if (err != 0)
        return raise_mpi(err);
    status_t st;
    int flag = 0;
    if (mask) {
        bell_arrive(ticket);
        bell_ring();
    }
    if ((err = test(r, &flag, &st)) != 0)
        return raise_mpi(err);
    if (!flag) {
        int done, entered = 0;
        Py_BEGIN_ALLOW_THREADS
        done = spin(r, quick_tests / tests_per_yield, 0.0, 0.0, 0.0, 0, 0, &err);
        if (!done && mask && bell_words != NULL) {
            bell_enter(1, ticket);
            entered = 1;
        }
        if (!done) {
            double s = spin_least + bytes * spin_per_byte, t = now();
            done = spin(r, 0, spin_alone, spin_alone + bytes * alone_per_byte, t + (s < spin_most ? s : spin_most),
                        mask, ticket, &err);
        }
        if ((done || err != 0) && entered)
            bell_enter(-1, 0);
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

/* the optional last arguments of allreduce, bcast and barrier: the group's bell mask and the
 * call's number on the group (0 if absent); the ticket they make (bell_ticket; 0 without a number) */
static unsigned long long mask_arg(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want) {
    return nargs > want ? PyLong_AsUnsignedLongLongMask(args[want]) : 0;
}

static unsigned long long ticket_arg(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want) {
    unsigned long long seq = nargs > want + 1 ? PyLong_AsUnsignedLongLongMask(args[want + 1]) : 0;
    return seq ? bell_ticket(mask_arg(args, nargs, want), seq) : 0;
}

/* The element count of a buffer: 0, or -1 with an exception set, or 1 for a count past INT_MAX;
 * the view is released unless 0. */
static int take_count(Py_buffer *view, PyObject *extent_obj, int *count) {
    Py_ssize_t extent = PyLong_AsSsize_t(extent_obj);
    if (extent == -1 && PyErr_Occurred()) {
        PyBuffer_Release(view);
        return -1;
    }
    if (extent <= 0 || view->len % extent != 0) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, extent <= 0 ? "extent must be positive"
                                                      : "the buffer is not a whole number of elements");
        return -1;
    }
    if (view->len / extent > INT_MAX) {
        PyBuffer_Release(view);
        return 1;
    }
    *count = (int)(view->len / extent);
    return 0;
}

/* The buffer and its element count, as take_count. MPI reads or writes the memory until the
 * request completes; the caller holds the array for as long (the bounded wait keeps it with a
 * group it gives up on). */
static int take(PyObject *obj, PyObject *extent_obj, int writable, Py_buffer *view, int *count) {
    if (PyObject_GetBuffer(obj, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) != 0)
        return -1;
    return take_count(view, extent_obj, count);
}

static int start_allreduce(void *buf, int count, unsigned long long dtype, unsigned long long op,
                           unsigned long long comm, request_t *r) {
    if (pointer_handles)
        return ((iallreduce_ptr_t)f_iallreduce)(in_place, buf, count, (void *)(uintptr_t)dtype,
                                                 (void *)(uintptr_t)op, (void *)(uintptr_t)comm, &r->preq);
    return ((iallreduce_int_t)f_iallreduce)(in_place, buf, count, (int)dtype, (int)op, (int)comm, &r->ireq);
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
    if (nargs < want || nargs > want + 2) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments, a bell mask and a call number (%zd given)",
                     name, want, nargs);
        return 0;
    }
    return 1;
}

static PyObject *allreduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (!ready("allreduce(buf, datatype, extent, op, comm)", f_iallreduce, nargs, 5))
        return NULL;
    unsigned long long dtype = handle_of(args[1]), op = handle_of(args[3]), comm = handle_of(args[4]),
                       mask = mask_arg(args, nargs, 5), ticket = ticket_arg(args, nargs, 5);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer view;
    int count, got = take(args[0], args[2], 1, &view, &count);
    if (got != 0)
        return got < 0 ? NULL : not_implemented();
    request_t r = {0, NULL};
    int err = start_allreduce(view.buf, count, dtype, op, comm, &r);
    double bytes = (double)view.len;
    PyBuffer_Release(&view);
    return finish(&r, err, bytes, mask, ticket);
}

/* ---- all_reduce's whole common case: what mpidist.calls.collectives.all_reduce checks in Python
 * before the C call, read here from the same objects. bind() hands over the classes; their
 * __slots__ become byte offsets (each slot is a member descriptor), and DType and Plan are named
 * tuples read by index. Anything off the common case returns NotImplemented before any change,
 * and the Python path takes the call. */

static PyTypeObject *t_ndarray, *t_op, *t_group, *t_record, *t_dtype, *t_plan;
static PyObject *as_is, *call_name, *s_dtype, *last_sig, *check_fn;
static Py_ssize_t op_name, op_factor, op_plans;
static Py_ssize_t g_comm, g_size, g_persistent, g_handle, g_seq, g_signatures, g_bell;
static Py_ssize_t r_n, r_sigs, r_seen, r_due;
static Py_ssize_t d_name, d_kind, d_handle, d_extent, p_average, p_factor, p_lowprec, p_handle;

#define SLOT(obj, at) (*(PyObject **)((char *)(obj) + (at)))

/* The byte offset of the __slots__ member `name` of `type`, or -1 with an exception set. */
static Py_ssize_t slot_of(PyTypeObject *type, const char *name) {
    PyObject *d = PyObject_GetAttrString((PyObject *)type, name);
    if (d == NULL)
        return -1;
    Py_ssize_t at = -1;
    if (Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == 16 /* T_OBJECT_EX: what __slots__ makes */ && m->offset > 0)
            at = m->offset;
    }
    Py_DECREF(d);
    if (at < 0)
        PyErr_Format(PyExc_TypeError, "bind: %s.%s is not a __slots__ member", type->tp_name, name);
    return at;
}

static int take_type(PyObject *o, PyTypeObject **slot) {
    if (!PyType_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "bind: a class is expected");
        return 0;
    }
    Py_INCREF(o);
    Py_XSETREF(*slot, (PyTypeObject *)o);
    return 1;
}

/* bind(ndarray, ReduceOp, ProcessGroup, Record, DType, Plan, AS_IS, "all_reduce", dtype fields
 * (name, kind, handle, extent), plan fields (average, factor, lowprec, handle)[, check]):
 * check(group, record) is signature.check; without it a call whose check is due goes to Python. */
static PyObject *bind(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *nd, *op, *grp, *rec, *dt, *pl, *table, *name, *check = NULL;
    Py_CLEAR(t_ndarray);  /* all_reduce is off until every step below has succeeded */
    if (!PyArg_ParseTuple(args, "OOOOOOO!U(nnnn)(nnnn)|O", &nd, &op, &grp, &rec, &dt, &pl, &PyDict_Type,
                          &table, &name, &d_name, &d_kind, &d_handle, &d_extent, &p_average,
                          &p_factor, &p_lowprec, &p_handle, &check))
        return NULL;
    if (check != NULL && !PyCallable_Check(check)) {
        PyErr_SetString(PyExc_TypeError, "bind: check must be callable");
        return NULL;
    }
    Py_XINCREF(check);
    Py_XSETREF(check_fn, check);
    if (!PyType_Check(nd) || !take_type(op, &t_op) || !take_type(grp, &t_group)
        || !take_type(rec, &t_record) || !take_type(dt, &t_dtype) || !take_type(pl, &t_plan)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "bind: a class is expected");
        return NULL;
    }
    if ((op_name = slot_of(t_op, "name")) < 0 || (op_factor = slot_of(t_op, "factor")) < 0
        || (op_plans = slot_of(t_op, "plans")) < 0 || (g_comm = slot_of(t_group, "comm")) < 0
        || (g_size = slot_of(t_group, "_size")) < 0 || (g_persistent = slot_of(t_group, "persistent")) < 0
        || (g_handle = slot_of(t_group, "handle")) < 0 || (g_seq = slot_of(t_group, "seq")) < 0
        || (g_signatures = slot_of(t_group, "signatures")) < 0 || (g_bell = slot_of(t_group, "bell")) < 0
        || (r_n = slot_of(t_record, "n")) < 0
        || (r_sigs = slot_of(t_record, "sigs")) < 0 || (r_seen = slot_of(t_record, "seen")) < 0
        || (r_due = slot_of(t_record, "due")) < 0)
        return NULL;
    Py_INCREF(table);
    Py_XSETREF(as_is, table);
    Py_INCREF(name);
    Py_XSETREF(call_name, name);
    Py_CLEAR(last_sig);
    if (s_dtype == NULL && (s_dtype = PyUnicode_InternFromString("dtype")) == NULL)
        return NULL;
    if (!take_type(nd, &t_ndarray))
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *field(PyObject *tuple, PyTypeObject *type, Py_ssize_t i) {
    if (!Py_IS_TYPE(tuple, type) || i < 0 || i >= PyTuple_GET_SIZE(tuple))
        return NULL;
    return PyTuple_GET_ITEM(tuple, i);
}

/* An int slot's value, or -1 (not an int, or off the common case). */
static long long small_int(PyObject *o) {
    if (o == NULL || !PyLong_CheckExact(o))
        return -1;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    return overflow ? -1 : v;
}

/* The signature signature.note records, ("all_reduce", count, dtype name, op name): the previous
 * one again (the same object) when nothing differs, as in a loop, which spares the allocation
 * and lets signature.digest_of hash a run of them at once. */
static PyObject *signature(int count, PyObject *d, PyObject *op) {
    PyObject *dname = field(d, t_dtype, d_name), *oname = SLOT(op, op_name);
    if (dname == NULL || oname == NULL) {
        PyErr_SetString(PyExc_TypeError, "all_reduce: a DType or ReduceOp without its name");
        return NULL;
    }
    if (last_sig != NULL && PyTuple_GET_ITEM(last_sig, 2) == dname && PyTuple_GET_ITEM(last_sig, 3) == oname
        && PyLong_AsLong(PyTuple_GET_ITEM(last_sig, 1)) == count) {
        Py_INCREF(last_sig);
        return last_sig;
    }
    PyObject *size = PyLong_FromLong(count);
    if (size == NULL)
        return NULL;
    PyObject *sig = PyTuple_Pack(4, call_name, size, dname, oname);
    Py_DECREF(size);
    if (sig != NULL) {
        Py_INCREF(sig);
        Py_XSETREF(last_sig, sig);
    }
    return sig;
}

/* all_reduce's common case, done here: a contiguous, writable numpy array of a dtype MPI moves as
 * it is, a plain ReduceOp that is not AVG, a live group of 2 or more ranks without persistent
 * requests. With `sign` (the cross-rank check on) and a record on the group, the signature is
 * recorded as signature.note would, and the check (bound's signature.check) runs when due. Counts
 * the call on the group, then as allreduce(). NotImplemented: nothing was done. An error of the
 * MPI routine sets *from_mpi (an error the check raises does not). */
static PyObject *whole(PyObject *tensor, PyObject *op, PyObject *pg, int sign, int *from_mpi) {
    *from_mpi = 0;
    if (t_ndarray == NULL || f_iallreduce == NULL || !Py_IS_TYPE(tensor, t_ndarray)
        || !Py_IS_TYPE(op, t_op) || !Py_IS_TYPE(pg, t_group) || SLOT(op, op_factor) != Py_None)
        return not_implemented();
    PyObject *comm = SLOT(pg, g_comm), *persistent = SLOT(pg, g_persistent);
    if (comm == NULL || comm == Py_None || small_int(SLOT(pg, g_size)) < 2
        || !(persistent == Py_None || persistent == Py_False
             || (PyDict_CheckExact(persistent) && PyDict_GET_SIZE(persistent) == 0)))
        return not_implemented();
    PyObject *descr = PyObject_GetAttr(tensor, s_dtype);
    if (descr == NULL)
        return NULL;
    PyObject *d = PyDict_GetItemWithError(as_is, descr);  /* borrowed; the table holds it */
    Py_DECREF(descr);
    if (d == NULL)
        return PyErr_Occurred() ? NULL : not_implemented();
    PyObject *kind = field(d, t_dtype, d_kind), *plans = SLOT(op, op_plans);
    if (kind == NULL || plans == NULL || !PyDict_CheckExact(plans))
        return not_implemented();
    PyObject *p = PyDict_GetItemWithError(plans, kind);
    if (p == NULL)
        return PyErr_Occurred() ? NULL : not_implemented();
    if (field(p, t_plan, p_average) != Py_False || field(p, t_plan, p_factor) != Py_None
        || field(p, t_plan, p_lowprec) != Py_None)
        return not_implemented();
    PyObject *rec = NULL, *sigs = NULL;
    long long n = 0;
    int due = 0;
    if (sign) {
        rec = SLOT(pg, g_signatures);
        if (rec == NULL || !Py_IS_TYPE(rec, t_record) || check_fn == NULL)
            return not_implemented();  /* the group's first call makes its record, in Python */
        sigs = SLOT(rec, r_sigs);
        PyObject *seen = SLOT(rec, r_seen);
        n = small_int(SLOT(rec, r_n));
        long long next = small_int(SLOT(rec, r_due));
        if (n < 0 || next < 0 || sigs == NULL || !PyList_CheckExact(sigs) || seen == NULL
            || !PyAnySet_CheckExact(seen))
            return not_implemented();
        int known = PySet_Contains(seen, call_name);
        if (known < 0)
            return NULL;
        due = n + 1 >= next || !known;
    }
    long long seq = small_int(SLOT(pg, g_seq));
    if (seq < 0)
        return not_implemented();
    unsigned long long dtype = handle_of(field(d, t_dtype, d_handle)),
                       mop = handle_of(field(p, t_plan, p_handle)), chandle = handle_of(SLOT(pg, g_handle));
    if (PyErr_Occurred())
        return NULL;
    Py_buffer view;
    int count;
    if (PyObject_GetBuffer(tensor, &view, PyBUF_WRITABLE) != 0) {
        PyErr_Clear();  /* read-only or not contiguous: the Python path says which, or copies */
        return not_implemented();
    }
    int got = take_count(&view, field(d, t_dtype, d_extent), &count);
    if (got != 0)
        return got < 0 ? NULL : not_implemented();
    if (large_from > 0 && view.len >= large_from) {
        PyBuffer_Release(&view);
        return not_implemented();
    }
    /* the common case: count the call and record its signature (and check, when due: a mismatch
     * raises on every rank before any starts the routine), then call MPI */
    PyObject *new_seq = PyLong_FromLongLong(seq + 1), *sig = NULL, *new_n = NULL;
    if (new_seq == NULL)
        goto fail;
    Py_SETREF(SLOT(pg, g_seq), new_seq);
    new_seq = NULL;
    if (sign) {
        if ((new_n = PyLong_FromLongLong(n + 1)) == NULL || (sig = signature(count, d, op)) == NULL
            || PyList_Append(sigs, sig) != 0)
            goto fail;
        Py_CLEAR(sig);
        Py_SETREF(SLOT(rec, r_n), new_n);
        new_n = NULL;
        if (due) {
            PyObject *done = PyObject_CallFunctionObjArgs(check_fn, pg, rec, NULL);
            if (done == NULL)
                goto fail;
            Py_DECREF(done);
        }
    }
    request_t r = {0, NULL};
    int err = start_allreduce(view.buf, count, dtype, mop, chandle, &r);
    double bytes = (double)view.len;
    PyBuffer_Release(&view);
    *from_mpi = 1;  /* the only errors from here on are the routine's */
    PyObject *bell_mask = SLOT(pg, g_bell);
    unsigned long long mask = bell_words && bell_mask && PyLong_CheckExact(bell_mask)
                              ? PyLong_AsUnsignedLongLongMask(bell_mask) : 0;
    PyObject *out = finish(&r, err, bytes, mask, bell_ticket(mask, (unsigned long long)seq + 1));
    if (out != NULL)
        *from_mpi = 0;
    return out;
fail:
    Py_XDECREF(new_seq);
    Py_XDECREF(new_n);
    Py_XDECREF(sig);
    PyBuffer_Release(&view);
    return NULL;
}

/* all_reduce(tensor, op, group, sign): whole() from Python (the C call that
 * mpidist.calls.collectives.all_reduce tries first where no Entry serves it, and the tests). */
static PyObject *all_reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "all_reduce takes 4 arguments (%zd given)", nargs);
        return NULL;
    }
    int from_mpi;
    return whole(args[0], args[1], args[2], args[3] == Py_True, &from_mpi);
}

/* ---- Entry: mpidist.all_reduce itself, for its common case. A Python function's call and body
 * cost about 0.14 us, 8 % of a 2-rank 8 B MPI_Allreduce here (docs/benchmarks.md). An Entry takes
 * torch's arguments (tensor, op=SUM, group=None, async_op=False) by vectorcall, reads the
 * switches that send a call elsewhere, and runs whole(); every other call -- other arguments, a
 * switch set, NotImplemented -- goes to the Python function, unchanged, with the same arguments.
 * Its __dict__ carries the function's name, doc, __wrapped__ and `call`. Entries are made once
 * per process and live as long as it (no cyclic GC). */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict;
    PyObject *fallback;                 /* the Python function */
    PyObject *gates;                    /* ((dict, key, value), ...): each dict[key] must be value */
    PyObject *world_dict, *world_key;   /* where group=None is found */
    PyObject *sign_dict, *sign_key;     /* the cross-rank check's switch */
    PyObject *default_op;
    PyObject *on_pending, *on_error;    /* (handle or exception, group, tensor) */
} entry_t;

static PyObject *s_tensor, *s_op, *s_group, *s_async_op;

static int same_name(PyObject *key, PyObject *name) {
    return key == name || PyUnicode_Compare(key, name) == 0;
}

static PyObject *entry_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    entry_t *e = (entry_t *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    PyObject *a[4] = {NULL, e->default_op, Py_None, Py_False};
    if (nargs > 4)
        goto python;
    for (Py_ssize_t i = 0; i < nargs; i++)
        a[i] = args[i];
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        Py_ssize_t at = same_name(key, s_tensor) ? 0 : same_name(key, s_op) ? 1
                        : same_name(key, s_group) ? 2 : same_name(key, s_async_op) ? 3 : -1;
        if (at < nargs)  /* unknown, or given twice: the Python function raises torch's TypeError */
            goto python;
        a[at] = args[nargs + k];
    }
    if (a[0] == NULL || a[3] != Py_False)
        goto python;
    for (Py_ssize_t g = 0; g < PyTuple_GET_SIZE(e->gates); g++) {
        PyObject *gate = PyTuple_GET_ITEM(e->gates, g);
        if (PyDict_GetItemWithError(PyTuple_GET_ITEM(gate, 0), PyTuple_GET_ITEM(gate, 1))
            != PyTuple_GET_ITEM(gate, 2)) {
            if (PyErr_Occurred())
                return NULL;
            goto python;
        }
    }
    PyObject *pg = a[2];
    if (pg == Py_None) {
        pg = PyDict_GetItemWithError(e->world_dict, e->world_key);
        if (pg == NULL) {
            if (PyErr_Occurred())
                return NULL;
            goto python;  /* not initialized: the Python path says so */
        }
    }
    int sign = PyDict_GetItemWithError(e->sign_dict, e->sign_key) == Py_True, from_mpi;
    if (PyErr_Occurred())
        return NULL;
    Py_INCREF(pg);  /* whole() may run Python (the check), which may rebind the world */
    PyObject *out = whole(a[0], a[1], pg, sign, &from_mpi);
    if (out == Py_None || (out == NULL && !from_mpi)) {
        Py_DECREF(pg);
        return out;
    }
    if (out == Py_NotImplemented) {
        Py_DECREF(out);
        Py_DECREF(pg);
        goto python;
    }
    PyObject *then;
    if (out != NULL) {  /* the pending request: the bounded wait goes on in Python */
        then = PyObject_CallFunctionObjArgs(e->on_pending, out, pg, a[0], NULL);
        Py_DECREF(out);
    } else if (PyErr_ExceptionMatches(mpi_exception)) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        then = PyObject_CallFunctionObjArgs(e->on_error, value, pg, a[0], NULL);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
    } else {
        then = NULL;
    }
    Py_DECREF(pg);
    if (then == NULL)
        return NULL;
    Py_DECREF(then);
    Py_RETURN_NONE;
python:
    return PyObject_Vectorcall(e->fallback, args, nargsf, kwnames);
}

static void entry_dealloc(PyObject *self) {
    entry_t *e = (entry_t *)self;
    Py_XDECREF(e->dict);
    Py_XDECREF(e->fallback);
    Py_XDECREF(e->gates);
    Py_XDECREF(e->world_dict);
    Py_XDECREF(e->world_key);
    Py_XDECREF(e->sign_dict);
    Py_XDECREF(e->sign_key);
    Py_XDECREF(e->default_op);
    Py_XDECREF(e->on_pending);
    Py_XDECREF(e->on_error);
    PyObject_Free(self);
}

static PyObject *entry_get(PyObject *self, PyObject *obj, PyObject *type) {
    (void)obj;
    (void)type;
    Py_INCREF(self);  /* as a builtin function: no binding (and inspect sees a routine) */
    return self;
}

static PyObject *entry_repr(PyObject *self) {
    PyObject *name = ((entry_t *)self)->dict ? PyDict_GetItemString(((entry_t *)self)->dict, "__qualname__") : NULL;
    return PyUnicode_FromFormat("<function %S (common case in C)>", name ? name : Py_None);
}

static PyGetSetDef entry_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject entry_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpidist.calls._native.Entry",
    .tp_basicsize = sizeof(entry_t),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A torch.distributed call whose common case runs in C (see mpidist.calls.native.entry).",
    .tp_vectorcall_offset = offsetof(entry_t, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_dictoffset = offsetof(entry_t, dict),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_descr_get = entry_get,
    .tp_repr = entry_repr,
    .tp_dealloc = entry_dealloc,
    .tp_getset = entry_getset,
};

static int gates_ok(PyObject *gates) {
    if (!PyTuple_Check(gates))
        return 0;
    for (Py_ssize_t g = 0; g < PyTuple_GET_SIZE(gates); g++) {
        PyObject *gate = PyTuple_GET_ITEM(gates, g);
        if (!PyTuple_Check(gate) || PyTuple_GET_SIZE(gate) != 3 || !PyDict_Check(PyTuple_GET_ITEM(gate, 0)))
            return 0;
    }
    return 1;
}

/* entry(fallback, gates, (world dict, key), (check's dict, key), default op, on_pending, on_error) */
static PyObject *entry(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *fallback, *gates, *wd, *wk, *sd, *sk, *op, *pend, *err;
    if (!PyArg_ParseTuple(args, "OO(O!O)(O!O)OOO", &fallback, &gates, &PyDict_Type, &wd, &wk,
                          &PyDict_Type, &sd, &sk, &op, &pend, &err))
        return NULL;
    if (!PyCallable_Check(fallback) || !PyCallable_Check(pend) || !PyCallable_Check(err) || !gates_ok(gates)) {
        PyErr_SetString(PyExc_TypeError, "entry: callables and a tuple of (dict, key, value) gates are expected");
        return NULL;
    }
    if (s_tensor == NULL && ((s_tensor = PyUnicode_InternFromString("tensor")) == NULL
                             || (s_op = PyUnicode_InternFromString("op")) == NULL
                             || (s_group = PyUnicode_InternFromString("group")) == NULL
                             || (s_async_op = PyUnicode_InternFromString("async_op")) == NULL))
        return NULL;
    entry_t *e = PyObject_New(entry_t, &entry_type);
    if (e == NULL)
        return NULL;
    e->vectorcall = entry_call;
    e->fallback = e->gates = e->world_dict = e->world_key = e->sign_dict = e->sign_key = NULL;
    e->default_op = e->on_pending = e->on_error = NULL;
    e->dict = PyDict_New();
    if (e->dict == NULL) {
        Py_DECREF(e);
        return NULL;
    }
    PyObject *held[] = {fallback, gates, wd, wk, sd, sk, op, pend, err};
    PyObject **slots[] = {&e->fallback, &e->gates, &e->world_dict, &e->world_key, &e->sign_dict,
                          &e->sign_key, &e->default_op, &e->on_pending, &e->on_error};
    for (size_t i = 0; i < sizeof held / sizeof held[0]; i++) {
        Py_INCREF(held[i]);
        *slots[i] = held[i];
    }
    return (PyObject *)e;
}

static PyObject *bcast(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (!ready("bcast(buf, datatype, extent, root, comm, writable)", f_ibcast, nargs, 6))
        return NULL;
    unsigned long long dtype = handle_of(args[1]), comm = handle_of(args[4]), mask = mask_arg(args, nargs, 6),
                       ticket = ticket_arg(args, nargs, 6);
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
    return finish(&r, err, bytes, mask, ticket);
}

static PyObject *barrier(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (!ready("barrier(comm)", f_ibarrier, nargs, 1))
        return NULL;
    unsigned long long comm = handle_of(args[0]), mask = mask_arg(args, nargs, 1), ticket = ticket_arg(args, nargs, 1);
    if (PyErr_Occurred())
        return NULL;
    request_t r = {0, NULL};
    int err;
    if (pointer_handles)
        err = ((ibarrier_ptr_t)f_ibarrier)((void *)(uintptr_t)comm, &r.preq);
    else
        err = ((ibarrier_int_t)f_ibarrier)((int)comm, &r.ireq);
    return finish(&r, err, 0.0, mask, ticket);
}

static PyObject *py_large_from(PyObject *self, PyObject *arg) {
    (void)self;
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    large_from = n < 0 ? 0 : n;
    Py_RETURN_NONE;
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

/* ---- the bell from Python (mpidist/core/bell.py) */

/* bell_attach(address, local rank, alone, alone per byte): the mapped page (at least (local
 * ranks + 1) * 64 bytes), and how long a wait spins while a member is not in a wait (seconds,
 * and seconds per byte the call moves) */
static PyObject *py_bell_attach(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long at;
    int me;
    double alone, per_byte = 0.0;
    if (!PyArg_ParseTuple(args, "Kid|d", &at, &me, &alone, &per_byte))
        return NULL;
    if (at == 0 || me < 0 || alone < 0 || per_byte < 0) {
        PyErr_SetString(PyExc_ValueError, "bell_attach: the address is 0, or the rank or time negative");
        return NULL;
    }
    spin_alone = alone;
    alone_per_byte = per_byte;
    bell_me = me;
    bell_words = (uint32_t *)(uintptr_t)at;
    Py_RETURN_NONE;
}

/* bell_enter(+1 | -1[, ticket]) */
static PyObject *py_bell_enter(PyObject *self, PyObject *args) {
    (void)self;
    long delta;
    unsigned long long ticket = 0;
    if (!PyArg_ParseTuple(args, "l|K", &delta, &ticket))
        return NULL;
    bell_enter(delta > 0 ? 1 : -1, ticket);
    Py_RETURN_NONE;
}

/* bell_ticket(mask, seq) -> the ticket of the group's call number seq */
static PyObject *py_bell_ticket(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long mask, seq;
    if (!PyArg_ParseTuple(args, "KK", &mask, &seq))
        return NULL;
    return PyLong_FromUnsignedLongLong(bell_ticket(mask, seq));
}

/* bell_arrive(mask, seq) -> ticket: this rank has reached the group's call number seq (0: none) */
static PyObject *py_bell_arrive(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long mask, seq;
    if (!PyArg_ParseTuple(args, "KK", &mask, &seq))
        return NULL;
    unsigned long long ticket = seq ? bell_ticket(mask, seq) : 0;
    bell_arrive(ticket);
    return PyLong_FromUnsignedLongLong(ticket);
}

/* bell_watch() -> a fresh watch (bytes that bell_look keeps its state in), started now */
static PyObject *py_bell_watch(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    watch_t w = {now(), 0};
    return PyByteArray_FromStringAndSize((const char *)&w, sizeof w);
}

/* bell_look(watch, mask, ticket, alone, gone) -> bell_look's bits: 1 stop spinning, 2 a member
 * has not reached the call */
static PyObject *py_bell_look(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5 || !PyByteArray_CheckExact(args[0]) || PyByteArray_GET_SIZE(args[0]) != (Py_ssize_t)sizeof(watch_t)) {
        PyErr_SetString(PyExc_TypeError, "bell_look(watch, mask, ticket, alone, gone): watch from bell_watch()");
        return NULL;
    }
    unsigned long long mask = PyLong_AsUnsignedLongLongMask(args[1]), ticket = PyLong_AsUnsignedLongLongMask(args[2]);
    double alone = PyFloat_AsDouble(args[3]), gone = PyFloat_AsDouble(args[4]);
    if (PyErr_Occurred())
        return NULL;
    watch_t w;
    memcpy(&w, PyByteArray_AS_STRING(args[0]), sizeof w);
    int seen = bell_look(&w, mask, ticket, alone, gone, now());
    memcpy(PyByteArray_AS_STRING(args[0]), &w, sizeof w);
    return PyLong_FromLong(seen);
}

static PyObject *py_bell_in(PyObject *self, PyObject *arg) {
    (void)self;
    unsigned long long mask = PyLong_AsUnsignedLongLongMask(arg);
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromUnsignedLongLong(bell_in_bits(mask));
}

static PyObject *py_bell_all_in(PyObject *self, PyObject *arg) {
    (void)self;
    unsigned long long mask = PyLong_AsUnsignedLongLongMask(arg);
    if (PyErr_Occurred())
        return NULL;
    return PyBool_FromLong(bell_all_in(mask));
}

/* bell_ring(): wake every sleeper on the bell, counting no wait (a progress thread asleep on it
 * that has other news: mpidist/torch/progress.py) */
static PyObject *py_bell_ring(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    bell_ring();
    Py_RETURN_NONE;
}

/* bell_arm(): count this thread as a sleeper and return the ring count to sleep on; test once
 * more after it, then bell_sleep (or bell_disarm), so that no ring falls between */
static PyObject *py_bell_arm(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    if (bell_words == NULL)
        return PyLong_FromLong(0);
    __atomic_add_fetch(&bell_words[1], 1, __ATOMIC_SEQ_CST);
    return PyLong_FromUnsignedLong(__atomic_load_n(&bell_words[0], __ATOMIC_SEQ_CST));
}

static PyObject *py_bell_disarm(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    if (bell_words != NULL)
        __atomic_sub_fetch(&bell_words[1], 1, __ATOMIC_SEQ_CST);
    Py_RETURN_NONE;
}

/* bell_sleep(rings, seconds): sleep until the bell rings past `rings` or the time is up, the GIL
 * released; disarms. True when it rang. */
static PyObject *py_bell_sleep(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long seen;
    double seconds;
    if (!PyArg_ParseTuple(args, "kd", &seen, &seconds))
        return NULL;
    if (bell_words == NULL)
        Py_RETURN_FALSE;
    uint32_t *b = bell_words;
    if (seconds < 0)
        seconds = 0;
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    Py_BEGIN_ALLOW_THREADS
#ifdef __linux__
    syscall(SYS_futex, &b[0], FUTEX_WAIT, (uint32_t)seen, &ts, NULL, 0);
#else
    nanosleep(&ts, NULL);
#endif
    __atomic_sub_fetch(&b[1], 1, __ATOMIC_SEQ_CST);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(__atomic_load_n(&b[0], __ATOMIC_SEQ_CST) != (uint32_t)seen);
}

static PyMethodDef methods[] = {
    {"allreduce", (PyCFunction)(void (*)(void))allreduce, METH_FASTCALL,
     "allreduce(buf, datatype, extent, op, comm): in-place MPI_Iallreduce, then the spin of the "
     "bounded wait; None when done, else the pending request's handle."},
    {"bcast", (PyCFunction)(void (*)(void))bcast, METH_FASTCALL,
     "bcast(buf, datatype, extent, root, comm, writable): MPI_Ibcast, then the spin; as allreduce."},
    {"barrier", (PyCFunction)(void (*)(void))barrier, METH_FASTCALL,
     "barrier(comm): MPI_Ibarrier, then the spin; as allreduce."},
    {"all_reduce", (PyCFunction)(void (*)(void))all_reduce, METH_FASTCALL,
     "all_reduce(tensor, op, group, sign): mpidist's all_reduce in its common case, done here "
     "(see bind); as allreduce, or NotImplemented when off that case (nothing done)."},
    {"entry", entry, METH_VARARGS,
     "entry(fallback, gates, (world dict, key), (check dict, key), default op, on_pending, on_error): "
     "a callable that runs all_reduce's common case here and everything else through fallback."},
    {"bind", bind, METH_VARARGS,
     "bind(ndarray, ReduceOp, ProcessGroup, Record, DType, Plan, AS_IS, call name, DType fields "
     "(name, kind, handle, extent), Plan fields (average, factor, lowprec, handle))"},
    {"bell_attach", py_bell_attach, METH_VARARGS,
     "bell_attach(address, local rank, alone[, alone per byte]): use the node's bell page mapped at address."},
    {"bell_enter", py_bell_enter, METH_VARARGS,
     "bell_enter(+1 | -1[, ticket]): start (and ring) a wait for the call of ticket, or end one."},
    {"bell_ticket", py_bell_ticket, METH_VARARGS, "bell_ticket(mask, seq) -> the ticket of a group's call."},
    {"bell_arrive", py_bell_arrive, METH_VARARGS,
     "bell_arrive(mask, seq) -> ticket: this rank has reached the group's call number seq."},
    {"bell_watch", py_bell_watch, METH_NOARGS, "bell_watch() -> a spinning wait's state, for bell_look."},
    {"bell_look", (PyCFunction)(void (*)(void))py_bell_look, METH_FASTCALL,
     "bell_look(watch, mask, ticket, alone, gone) -> bits: 1 stop spinning, 2 a member has not "
     "reached the call."},
    {"bell_ring", py_bell_ring, METH_NOARGS, "bell_ring(): wake the bell's sleepers, counting no wait."},
    {"bell_in", py_bell_in, METH_O, "bell_in(mask) -> the bits of mask whose local ranks are in a wait."},
    {"bell_all_in", py_bell_all_in, METH_O, "bell_all_in(mask): every local rank of mask is in a wait."},
    {"bell_arm", py_bell_arm, METH_NOARGS, "bell_arm() -> rings: count as a sleeper (test once more, then sleep)."},
    {"bell_disarm", py_bell_disarm, METH_NOARGS, "bell_disarm(): no sleep after bell_arm after all."},
    {"bell_sleep", py_bell_sleep, METH_VARARGS,
     "bell_sleep(rings, seconds) -> rang: sleep until a ring or the time is up (after bell_arm)."},
    {"large_from", py_large_from, METH_O,
     "large_from(bytes): all_reduce returns NotImplemented for arrays of this size or more (0: never)."},
    {"setup", setup, METH_VARARGS,
     "setup(iallreduce, ibcast, ibarrier, test, pointer_handles, in_place, exception[, quick_tests, "
     "tests_per_yield, clock_every, spin_least, spin_per_byte, spin_most])"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&entry_type) < 0)
        return NULL;
    return PyModule_Create(&module);
}

/* float16 / bfloat16 word kernels for mpidist.lowprec: one pass over memory.
 *
 * reduce(rows, k, out, kind, op, divisor, scale): out[i] = round16(op over rows[r][i],
 * r = 0..k-1 in order, in float32, then / divisor and * scale in float32), rounded once to
 * nearest even. widen(words, kind, out32) and narrow(in32, kind, words) are the two casts.
 *
 * kind: 0 float16, 1 bfloat16. op: 0 sum, 1 product, 2 min, 3 max (NaN propagates, as
 * numpy's minimum/maximum). x86-64 with F16C/AVX2 takes vector loops chosen at run time;
 * elsewhere the portable loops (float16 through the compiler's _Float16) run. Without a
 * _Float16 type the module reports has_f16 = False and Python keeps float16 on numpy.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define W16_X86 1
#include <immintrin.h>
#endif

#if defined(__FLT16_MANT_DIG__)
#define W16_HAVE_F16 1
#endif

#define BLOCK 1024

enum { OP_SUM, OP_PROD, OP_MIN, OP_MAX };

/* ------------------------------------------------------------ portable scalar code */

static inline float bf16_to_f32(uint16_t w) {
    uint32_t b = (uint32_t)w << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    if (f != f) return (uint16_t)((b >> 16) | 0x0040);
    return (uint16_t)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

#ifdef W16_HAVE_F16
static inline float f16_to_f32(uint16_t w) {
    _Float16 h;
    memcpy(&h, &w, 2);
    return (float)h;
}

static inline uint16_t f32_to_f16(float f) {
    _Float16 h = (_Float16)f;
    uint16_t w;
    memcpy(&w, &h, 2);
    return w;
}
#endif

static inline float combine(int op, float a, float b) {
    switch (op) {
    case OP_SUM: return a + b;
    case OP_PROD: return a * b;
    case OP_MIN: return (a < b || a != a) ? a : b;
    default: return (a > b || a != a) ? a : b;
    }
}

static void widen_generic(const uint16_t *w, Py_ssize_t n, int kind, float *out) {
    Py_ssize_t i;
    if (kind == 1) {
        for (i = 0; i < n; i++) out[i] = bf16_to_f32(w[i]);
    }
#ifdef W16_HAVE_F16
    else {
        for (i = 0; i < n; i++) out[i] = f16_to_f32(w[i]);
    }
#endif
}

static void narrow_generic(const float *in, Py_ssize_t n, int kind, uint16_t *w) {
    Py_ssize_t i;
    if (kind == 1) {
        for (i = 0; i < n; i++) w[i] = f32_to_bf16(in[i]);
    }
#ifdef W16_HAVE_F16
    else {
        for (i = 0; i < n; i++) w[i] = f32_to_f16(in[i]);
    }
#endif
}

/* ------------------------------------------------------------ x86: F16C + AVX2 */

#ifdef W16_X86
#define W16_TARGET __attribute__((target("avx2,f16c")))

W16_TARGET static inline __m256 load8(const uint16_t *p, int kind) {
    __m128i w = _mm_loadu_si128((const __m128i *)p);
    if (kind == 0) return _mm256_cvtph_ps(w);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(w), 16));
}

W16_TARGET static inline void store8(uint16_t *p, __m256 x, int kind) {
    if (kind == 0) {
        _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
        return;
    }
    __m256i b = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb)), 16);
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x0040));
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, q, nan);
    /* 8 x 32-bit (each < 0x10000) -> 8 x 16-bit, in order */
    __m128i lo = _mm256_castsi256_si128(r), hi = _mm256_extracti128_si256(r, 1);
    _mm_storeu_si128((__m128i *)p, _mm_packus_epi32(lo, hi));
}

W16_TARGET static inline __m256 combine8(int op, __m256 a, __m256 b) {
    switch (op) {
    case OP_SUM: return _mm256_add_ps(a, b);
    case OP_PROD: return _mm256_mul_ps(a, b);
    case OP_MIN: {
        /* (a < b || a is NaN) ? a : b, as the scalar combine() */
        __m256 pick = _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_LT_OQ), _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
        return _mm256_blendv_ps(b, a, pick);
    }
    default: {
        __m256 pick = _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_GT_OQ), _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
        return _mm256_blendv_ps(b, a, pick);
    }
    }
}

W16_TARGET static inline __attribute__((always_inline)) void reduce_avx2_body(const uint16_t *rows, Py_ssize_t k, Py_ssize_t m, uint16_t *out,
                                   int kind, int op, float divisor, float scale, int scaled) {
    Py_ssize_t i, r, m8 = m - m % 8;
    __m256 vd = _mm256_set1_ps(divisor), vs = _mm256_set1_ps(scale);
    for (i = 0; i < m8; i += 8) {
        __m256 acc = load8(rows + i, kind);
        for (r = 1; r < k; r++) acc = combine8(op, acc, load8(rows + r * m + i, kind));
        if (divisor != 0.0f) acc = _mm256_div_ps(acc, vd);
        if (scaled) acc = _mm256_mul_ps(acc, vs);
        store8(out + i, acc, kind);
    }
    for (; i < m; i++) {
        uint16_t pad[8] = {0}, res[8];
        __m256 v;
        pad[0] = rows[i];
        v = load8(pad, kind);
        for (r = 1; r < k; r++) {
            pad[0] = rows[r * m + i];
            v = combine8(op, v, load8(pad, kind));
        }
        if (divisor != 0.0f) v = _mm256_div_ps(v, vd);
        if (scaled) v = _mm256_mul_ps(v, vs);
        store8(res, v, kind);
        out[i] = res[0];
    }
}

/* one copy of the loop per (kind, op): the constants let the compiler drop the branches */
W16_TARGET static void reduce_avx2(const uint16_t *rows, Py_ssize_t k, Py_ssize_t m, uint16_t *out, int kind,
                                   int op, float divisor, float scale, int scaled) {
#define W16_CASE(K, O) \
    case K * 4 + O: reduce_avx2_body(rows, k, m, out, K, O, divisor, scale, scaled); break;
    switch (kind * 4 + op) {
    W16_CASE(0, 0) W16_CASE(0, 1) W16_CASE(0, 2) W16_CASE(0, 3)
    W16_CASE(1, 0) W16_CASE(1, 1) W16_CASE(1, 2) W16_CASE(1, 3)
    }
#undef W16_CASE
}

W16_TARGET static void widen_avx2(const uint16_t *w, Py_ssize_t n, int kind, float *out) {
    Py_ssize_t i, n8 = n - n % 8;
    for (i = 0; i < n8; i += 8) _mm256_storeu_ps(out + i, load8(w + i, kind));
    for (; i < n; i++) {
        uint16_t pad[8] = {0};
        float res[8];
        pad[0] = w[i];
        _mm256_storeu_ps(res, load8(pad, kind));
        out[i] = res[0];
    }
}

W16_TARGET static void narrow_avx2(const float *in, Py_ssize_t n, int kind, uint16_t *w) {
    Py_ssize_t i, n8 = n - n % 8;
    for (i = 0; i < n8; i += 8) store8(w + i, _mm256_loadu_ps(in + i), kind);
    for (; i < n; i++) {
        float pad[8] = {0};
        uint16_t res[8];
        pad[0] = in[i];
        store8(res, _mm256_loadu_ps(pad), kind);
        w[i] = res[0];
    }
}

#endif

/* The loops are chosen at run time, never at build time: the build uses no -march flag, only the
 * *_avx2 functions carry target("avx2,f16c"), and they run where the CPU (and the OS, for the
 * AVX state) supports both, as __builtin_cpu_supports reports. A wheel built on an AVX2
 * machine thus runs the portable loops on any other x86-64. select() overrides the choice. */
static int cpu_has_avx2(void) {
#ifdef W16_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

static int isa_avx2 = -1; /* -1: not chosen yet (set at import, so no thread races on it) */

static int use_avx2(void) {
    if (isa_avx2 < 0) isa_avx2 = cpu_has_avx2();
    return isa_avx2;
}

static void reduce_generic(const uint16_t *rows, Py_ssize_t k, Py_ssize_t m, uint16_t *out, int kind,
                           int op, float divisor, float scale, int scaled) {
    float acc[BLOCK], tmp[BLOCK];
    Py_ssize_t i0, i, r;
    for (i0 = 0; i0 < m; i0 += BLOCK) {
        Py_ssize_t b = m - i0 < BLOCK ? m - i0 : BLOCK;
        widen_generic(rows + i0, b, kind, acc);
        for (r = 1; r < k; r++) {
            widen_generic(rows + r * m + i0, b, kind, tmp);
            for (i = 0; i < b; i++) acc[i] = combine(op, acc[i], tmp[i]);
        }
        if (divisor != 0.0f)
            for (i = 0; i < b; i++) acc[i] /= divisor;
        if (scaled)
            for (i = 0; i < b; i++) acc[i] *= scale;
        narrow_generic(acc, b, kind, out + i0);
    }
}

/* ------------------------------------------------------------ Python entry points */

static int has_kind(int kind) {
#ifdef W16_HAVE_F16
    return kind == 0 || kind == 1;
#else
    return kind == 1 || (kind == 0 && use_avx2());
#endif
}

static void reduce_any(const uint16_t *rows, Py_ssize_t k, Py_ssize_t m, uint16_t *out, int kind, int op,
                       float divisor, float scale, int scaled) {
#ifdef W16_X86
    if (use_avx2()) {
        reduce_avx2(rows, k, m, out, kind, op, divisor, scale, scaled);
        return;
    }
#endif
    reduce_generic(rows, k, m, out, kind, op, divisor, scale, scaled);
}

/* Below this many elements the GIL is kept (releasing it costs more than the work). */
#define NOGIL_MIN 65536

static PyObject *py_reduce(PyObject *self, PyObject *args) {
    Py_buffer rows, out;
    Py_ssize_t k;
    int kind, op, scaled;
    float divisor, scale;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nw*iifpf", &rows, &k, &out, &kind, &op, &divisor, &scaled, &scale))
        return NULL;
    Py_ssize_t m = out.len / 2;
    if (!has_kind(kind) || op < 0 || op > 3 || k < 1 || rows.len < k * m * 2) {
        PyBuffer_Release(&rows);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "_lowprec.reduce: bad kind, op or buffer sizes");
        return NULL;
    }
    const uint16_t *src = (const uint16_t *)rows.buf;
    uint16_t *dst = (uint16_t *)out.buf;
    if (m * k < NOGIL_MIN) {
        reduce_any(src, k, m, dst, kind, op, divisor, scale, scaled);
    } else {
        Py_BEGIN_ALLOW_THREADS
        reduce_any(src, k, m, dst, kind, op, divisor, scale, scaled);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&rows);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

static PyObject *py_cast(PyObject *args, int to_wide) {
    Py_buffer src, dst;
    int kind;
    if (!PyArg_ParseTuple(args, "y*w*i", &src, &dst, &kind)) return NULL;
    Py_ssize_t n = to_wide ? src.len / 2 : src.len / 4;
    Py_ssize_t need = to_wide ? n * 4 : n * 2;
    if (!has_kind(kind) || dst.len < need) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        PyErr_SetString(PyExc_ValueError, "_lowprec: bad kind or buffer sizes");
        return NULL;
    }
#ifdef W16_X86
    if (use_avx2()) {
        if (to_wide) widen_avx2((const uint16_t *)src.buf, n, kind, (float *)dst.buf);
        else narrow_avx2((const float *)src.buf, n, kind, (uint16_t *)dst.buf);
    } else
#endif
    {
        if (to_wide) widen_generic((const uint16_t *)src.buf, n, kind, (float *)dst.buf);
        else narrow_generic((const float *)src.buf, n, kind, (uint16_t *)dst.buf);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    Py_RETURN_NONE;
}

static PyObject *py_widen(PyObject *self, PyObject *args) {
    (void)self;
    return py_cast(args, 1);
}

static PyObject *py_narrow(PyObject *self, PyObject *args) {
    (void)self;
    return py_cast(args, 0);
}

static int set_facts(PyObject *m) {
    if (PyObject_SetAttrString(m, "has_f16", has_kind(0) ? Py_True : Py_False) < 0) return -1;
    PyObject *isa = PyUnicode_FromString(use_avx2() ? "avx2+f16c" : "portable");
    if (isa == NULL) return -1;
    int rc = PyObject_SetAttrString(m, "isa", isa);
    Py_DECREF(isa);
    return rc;
}

static PyObject *py_select(PyObject *self, PyObject *args) {
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    if (strcmp(name, "auto") == 0) {
        isa_avx2 = cpu_has_avx2();
    } else if (strcmp(name, "portable") == 0) {
        isa_avx2 = 0;
    } else if (strcmp(name, "avx2+f16c") == 0) {
        if (!cpu_has_avx2()) {
            PyErr_SetString(PyExc_ValueError, "_lowprec.select: this CPU (or OS) lacks AVX2 or F16C");
            return NULL;
        }
        isa_avx2 = 1;
    } else {
        PyErr_Format(PyExc_ValueError, "_lowprec.select: %R is not 'auto', 'portable' or 'avx2+f16c'",
                     PyTuple_GET_ITEM(args, 0));
        return NULL;
    }
    if (set_facts(self) < 0) return NULL;
    return PyUnicode_FromString(use_avx2() ? "avx2+f16c" : "portable");
}

static PyMethodDef methods[] = {
    {"reduce", py_reduce, METH_VARARGS,
     "reduce(rows, k, out, kind, op, divisor, scaled, scale): k rows of words -> out, rounded once."},
    {"widen", py_widen, METH_VARARGS, "widen(words, out32, kind): 16-bit words -> float32, exactly."},
    {"narrow", py_narrow, METH_VARARGS, "narrow(in32, words, kind): float32 -> 16-bit words, nearest even."},
    {"select", py_select, METH_VARARGS,
     "select(isa): 'auto' (the CPU's best), 'portable' or 'avx2+f16c' loops from now on; returns the ISA."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lowprec", NULL, -1, methods};

PyMODINIT_FUNC PyInit__lowprec(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (set_facts(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

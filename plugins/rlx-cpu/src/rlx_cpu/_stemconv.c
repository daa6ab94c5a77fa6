/* rlx_cpu._stemconv: a direct convolution for a few input channels, written in oneDNN's nChw16c or
 * in NHWC (whichever the next conv reads).
 *
 * Why: a CNN's stem conv (ResNet's 3->64 7x7 stride 2) has so few input channels that oneDNN's
 * kernels for it run at under half the core's FMA rate (ResNet-18 224x224 b1: 1.5 ms of the chain's
 * 15, ONNX Runtime's MLAS 0.86 ms). Here each output row is tiles of RW pixels x NB blocks of 16
 * output channels held in registers; every tap (channel, kernel row, kernel column) loads NB weight
 * vectors and broadcasts RW input values, RW * NB fused multiply-adds. The input is first copied
 * with its zero padding around it, so the inner loops have no bounds to test: a padded tap
 * multiplies a zero, and NaN or Inf weights there make NaN as the IR's reference does.
 *
 * Threads: the caller's OpenMP runtime (GOMP_parallel, the libgomp that oneDNN runs on, by address)
 * so that the conv runs on the same team as the chain's oneDNN primitives. Each output element is
 * summed in one fixed order (bias, then channels, kernel rows, kernel columns) by whichever thread
 * owns its row: the same bits for every thread count.
 *
 * The module's Python functions only give the C functions' addresses and the tiles this CPU runs:
 * rlx_cpu.stem_conv calls the kernel through ctypes, which releases the GIL. Optional, as
 * rlx_cpu._dispatch: without it oneDNN runs the stem. Only GCC and clang build it (vector
 * extensions, target attributes); elsewhere the optional build is skipped.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64), aligned(4), may_alias));
typedef int32_t v16i __attribute__((vector_size(64), aligned(4), may_alias));

/* a where m (all ones), else b: C has no ?: on vectors */
#define SELECT(m, a, b) ((v16)(((v16i)(a) & (m)) | ((v16i)(b) & ~(m))))
typedef void (*gomp_parallel_fn)(void (*)(void *), void *, unsigned, unsigned);
typedef int (*omp_int_fn)(void);

enum { ACT_NONE = 0, ACT_RELU = 1, ACT_CLIP = 2 };
/* ISA_AUTO: the AVX-512 tiles where the CPU has them, else none (the caller keeps oneDNN's conv);
 * ISA_GENERIC: the portable tiles, for tests (correct everywhere, slow). */
enum { ISA_AUTO = 0, ISA_GENERIC = 1, ISA_AVX512 = 3 };

/* dims: n, c, h, w, oc, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow, act, isa, nhwc (18 words; nhwc: 1
 * writes NHWC, 0 oneDNN's nChw16c) */
enum { D_N, D_C, D_H, D_W, D_OC, D_KH, D_KW, D_SH, D_SW, D_PT, D_PL, D_DH, D_DW, D_OH, D_OW, D_ACT,
       D_ISA, D_NHWC, D_COUNT };

typedef struct {
    const float *x;
    float *xp; /* the padded input: n, c, hp, wp */
    const float *w; /* packed: oc / 16 blocks of (c, kh, kw, 16) */
    const float *bias;
    float *y; /* nChw16c (n, oc / 16, oh, ow, 16) or NHWC (n, oh, ow, oc) */
    int64_t d[D_COUNT];
    int64_t hp, wp;
    float lo, hi;
    omp_int_fn thread_num, num_threads;
} job_t;

static void share(const job_t *j, int64_t total, int64_t *lo, int64_t *hi) {
    int64_t t = j->thread_num(), nt = j->num_threads();
    *lo = total * t / nt;
    *hi = total * (t + 1) / nt;
}

static void pad_rows(void *arg) {
    const job_t *j = (const job_t *)arg;
    const int64_t *d = j->d;
    int64_t lo, hi;
    share(j, d[D_N] * d[D_C] * j->hp, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        int64_t plane = r / j->hp, ih = r % j->hp - d[D_PT];
        float *dst = j->xp + r * j->wp;
        if (ih < 0 || ih >= d[D_H]) {
            memset(dst, 0, (size_t)j->wp * sizeof(float));
            continue;
        }
        memset(dst, 0, (size_t)d[D_PL] * sizeof(float));
        memcpy(dst + d[D_PL], j->x + (plane * d[D_H] + ih) * d[D_W], (size_t)d[D_W] * sizeof(float));
        memset(dst + d[D_PL] + d[D_W], 0, (size_t)(j->wp - d[D_PL] - d[D_W]) * sizeof(float));
    }
}

/* One tile: RW output pixels of row oh from column ow0, NB blocks of 16 channels of group g
 * (weights packed by rlx_stem_conv_pack: per group, (c, kh, kw, NB, 16)), input column stride SW
 * (0: the runtime stride). RW, NB and SW are constants where it is inlined, so that the
 * accumulators live in registers and the taps' offsets are immediates. */
static inline __attribute__((always_inline)) void tile(const job_t *j, const float *xn, float *yn,
                                                       const float *wg, int64_t b0, int64_t oh,
                                                       int64_t ow0, const int RW, const int NB,
                                                       const int SW) {
    const int64_t *d = j->d;
    const int64_t c = d[D_C], kh = d[D_KH], kw = d[D_KW], sw = SW ? SW : d[D_SW];
    v16 acc[5][4];
#pragma GCC unroll 4
    for (int b = 0; b < NB; b++) {
        v16 bv = *(const v16 *)(j->bias + (b0 + b) * 16);
#pragma GCC unroll 5
        for (int r = 0; r < RW; r++) acc[r][b] = bv;
    }
    const float *wt = wg;
    for (int64_t ci = 0; ci < c; ci++) {
        for (int64_t i = 0; i < kh; i++) {
            const float *xr = xn + (ci * j->hp + oh * d[D_SH] + i) * j->wp + ow0 * sw;
            for (int64_t k = 0; k < kw; k++, xr++, wt += NB * 16) {
                v16 wv[4];
#pragma GCC unroll 4
                for (int b = 0; b < NB; b++) wv[b] = *(const v16 *)(wt + b * 16);
#pragma GCC unroll 5
                for (int r = 0; r < RW; r++) {
                    const float s = xr[r * sw];
                    const v16 xv = {s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s};
#pragma GCC unroll 4
                    for (int b = 0; b < NB; b++) acc[r][b] += xv * wv[b];
                }
            }
        }
    }
    const int64_t oh_n = d[D_OH], ow_n = d[D_OW];
    const float l = j->lo, h = j->hi;
    const v16 zero = {0}, lo = {l, l, l, l, l, l, l, l, l, l, l, l, l, l, l, l},
              hi = {h, h, h, h, h, h, h, h, h, h, h, h, h, h, h, h};
#pragma GCC unroll 4
    for (int b = 0; b < NB; b++) {
#pragma GCC unroll 5
        for (int r = 0; r < RW; r++) {
            v16 v = acc[r][b];
            if (d[D_ACT] == ACT_RELU) {
                v = SELECT(v <= zero, zero, v); /* NaN compares false: it stays, as the IR's relu keeps it */
            } else if (d[D_ACT] == ACT_CLIP) {
                v = SELECT(v < lo, lo, v);
                v = SELECT(v > hi, hi, v);
            }
            int64_t at = d[D_NHWC] ? (oh * ow_n + ow0 + r) * d[D_OC] + (b0 + b) * 16
                                   : (((b0 + b) * oh_n + oh) * ow_n + ow0 + r) * 16;
            *(v16 *)(yn + at) = v;
        }
    }
}

/* A row's tiles: whole RW-pixel tiles, then one tile of the rest. */
#define ROW(NB, SW)                                                                                \
    do {                                                                                           \
        int64_t ow0 = 0;                                                                           \
        for (; ow0 + RW <= ow_n; ow0 += RW) tile(j, xn, yn, wg, b0, oh, ow0, RW, (NB), (SW));      \
        switch (ow_n - ow0) {                                                                      \
        case 4: tile(j, xn, yn, wg, b0, oh, ow0, 4, (NB), (SW)); break;                            \
        case 3: tile(j, xn, yn, wg, b0, oh, ow0, 3, (NB), (SW)); break;                            \
        case 2: tile(j, xn, yn, wg, b0, oh, ow0, 2, (NB), (SW)); break;                            \
        case 1: tile(j, xn, yn, wg, b0, oh, ow0, 1, (NB), (SW)); break;                            \
        default: break;                                                                            \
        }                                                                                          \
    } while (0)

/* Rows lo..hi of (image, channel group, output row), RW x NB tiles (RW <= 5, NB <= 4); groups of
 * fewer blocks (the last) and other strides than 1 and 2 take the general tiles. */
static inline __attribute__((always_inline)) void rows(const job_t *j, int64_t lo, int64_t hi,
                                                       const int RW, const int NB) {
    const int64_t *d = j->d;
    const int64_t blocks = d[D_OC] / 16, groups = (blocks + NB - 1) / NB;
    const int64_t taps = d[D_C] * d[D_KH] * d[D_KW], ow_n = d[D_OW], sw = d[D_SW];
    for (int64_t it = lo; it < hi; it++) {
        int64_t oh = it % d[D_OH], g = it / d[D_OH] % groups, n = it / d[D_OH] / groups;
        const float *xn = j->xp + n * d[D_C] * j->hp * j->wp;
        float *yn = j->y + n * d[D_OC] * d[D_OH] * d[D_OW];
        const float *wg = j->w + g * NB * taps * 16;
        int64_t b0 = g * NB, nb = blocks - b0 < NB ? blocks - b0 : NB;
        if (nb == NB && sw == 1) ROW(NB, 1);
        else if (nb == NB && sw == 2) ROW(NB, 2);
        else if (nb == NB) ROW(NB, 0);
        else if (nb == 3) ROW(3, 0);
        else if (nb == 2) ROW(2, 0);
        else ROW(1, 0);
    }
}

static int64_t row_count(const job_t *j, int nbmax) {
    const int64_t blocks = j->d[D_OC] / 16;
    return j->d[D_N] * ((blocks + nbmax - 1) / nbmax) * j->d[D_OH];
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_X86 1
/* 20 zmm accumulators, 4 weight vectors and 5 broadcasts: 29 of the 32 registers. Six pixels (24
 * accumulators) left GCC too few registers: it read the weights from memory in every FMA and
 * spilled. One-off builds of each tile width (not kept), ResNet-18's stem at b1 on two Ice Lake
 * cores, p50: 6 pixels 1.57 ms, 4 pixels 1.13, 5 pixels 1.09. */
static __attribute__((target("avx512f,fma"))) void rows_avx512(void *arg) {
    const job_t *j = (const job_t *)arg;
    int64_t lo, hi;
    share(j, row_count(j, 4), &lo, &hi);
    rows(j, lo, hi, 5, 4);
}
#endif

/* The portable tiles (one pixel, one block): for tests on any machine, never picked by ISA_AUTO. */
static void rows_generic(void *arg) {
    const job_t *j = (const job_t *)arg;
    int64_t lo, hi;
    share(j, row_count(j, 1), &lo, &hi);
    rows(j, lo, hi, 1, 1);
}

static int group_blocks(int isa) { return isa == ISA_AVX512 ? 4 : 1; }

static int best_isa(void) {
#ifdef HAVE_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")) return ISA_AVX512;
#endif
    return ISA_GENERIC;
}

/* The kernel (called through ctypes). dims: D_COUNT words (see the enum); isa: ISA_AUTO or one
 * that best_isa allows. Returns 0, or -1 for arguments it does not take (nothing written). */
int rlx_stem_conv(const float *x, float *xp, const float *w, const float *bias, float *y,
                   const int64_t *dims, float lo, float hi, void *gomp_parallel, void *thread_num,
                   void *num_threads, int threads) {
    job_t j;
    memset(&j, 0, sizeof j);
    memcpy(j.d, dims, sizeof j.d);
    const int64_t *d = j.d;
    for (int i = 0; i < D_ACT; i++) {
        if (d[i] < (i >= D_PT && i <= D_PL ? 0 : 1)) return -1;
    }
    if (d[D_OC] % 16 != 0 || d[D_ACT] < ACT_NONE || d[D_ACT] > ACT_CLIP || threads < 1) return -1;
    if (d[D_NHWC] != 0 && d[D_NHWC] != 1) return -1;
    int best = best_isa();
    int isa = d[D_ISA] == ISA_AUTO ? best : (int)d[D_ISA];
    if (isa == ISA_GENERIC && d[D_ISA] == ISA_AUTO) return -1;
    if ((isa != ISA_GENERIC && isa != ISA_AVX512) || isa > best) return -1;
    if (d[D_DH] != 1 || d[D_DW] != 1) return -1;
    /* the padded extent the taps of the last output pixel reach */
    j.hp = (d[D_OH] - 1) * d[D_SH] + (d[D_KH] - 1) * d[D_DH] + 1;
    j.wp = (d[D_OW] - 1) * d[D_SW] + (d[D_KW] - 1) * d[D_DW] + 1;
    if (j.hp < d[D_PT] + d[D_H]) j.hp = d[D_PT] + d[D_H];
    if (j.wp < d[D_PL] + d[D_W]) j.wp = d[D_PL] + d[D_W];
    j.x = x, j.xp = xp, j.w = w, j.bias = bias, j.y = y, j.lo = lo, j.hi = hi;
    j.thread_num = (omp_int_fn)thread_num;
    j.num_threads = (omp_int_fn)num_threads;
    gomp_parallel_fn par = (gomp_parallel_fn)gomp_parallel;
    par(pad_rows, &j, (unsigned)threads, 0);
    void (*fn)(void *) = rows_generic;
#ifdef HAVE_X86
    if (isa == ISA_AVX512) fn = rows_avx512;
#endif
    par(fn, &j, (unsigned)threads, 0);
    return 0;
}

/* Packs OIHW weights (dims[D_ISA]: the ISA they are for) into the groups rlx_stem_conv reads:
 * per group of up to 4 (AVX-512) or 1 block of 16 output channels, (c, kh, kw, blocks, 16).
 * Returns 0, or -1 where oc is not a multiple of 16. */
int rlx_stem_conv_pack(const float *w, float *wpk, const int64_t *dims) {
    const int64_t *d = dims;
    if (d[D_OC] % 16 != 0 || d[D_OC] < 16) return -1;
    int isa = d[D_ISA] == ISA_AUTO ? best_isa() : (int)d[D_ISA];
    const int64_t nbmax = group_blocks(isa), blocks = d[D_OC] / 16;
    const int64_t taps = d[D_C] * d[D_KH] * d[D_KW];
    float *out = wpk;
    for (int64_t b0 = 0; b0 < blocks; b0 += nbmax) {
        int64_t nb = blocks - b0 < nbmax ? blocks - b0 : nbmax;
        for (int64_t t = 0; t < taps; t++)
            for (int64_t b = 0; b < nb; b++)
                for (int64_t l = 0; l < 16; l++) *out++ = w[((b0 + b) * 16 + l) * taps + t];
    }
    return 0;
}

/* Bytes of the padded input copy rlx_stem_conv needs (xp), or -1. */
int64_t rlx_stem_conv_pad_nbytes(const int64_t *dims) {
    const int64_t *d = dims;
    if (d[D_N] < 1 || d[D_C] < 1 || d[D_OH] < 1 || d[D_OW] < 1) return -1;
    int64_t hp = (d[D_OH] - 1) * d[D_SH] + (d[D_KH] - 1) * d[D_DH] + 1;
    int64_t wp = (d[D_OW] - 1) * d[D_SW] + (d[D_KW] - 1) * d[D_DW] + 1;
    if (hp < d[D_PT] + d[D_H]) hp = d[D_PT] + d[D_H];
    if (wp < d[D_PL] + d[D_W]) wp = d[D_PL] + d[D_W];
    return d[D_N] * d[D_C] * hp * wp * (int64_t)sizeof(float);
}

static PyObject *addresses(PyObject *self, PyObject *unused) {
    return Py_BuildValue("(KKK)", (unsigned long long)(uintptr_t)rlx_stem_conv,
                         (unsigned long long)(uintptr_t)rlx_stem_conv_pack,
                         (unsigned long long)(uintptr_t)rlx_stem_conv_pad_nbytes);
}

static PyObject *isa(PyObject *self, PyObject *unused) {
    static const char *names[] = {"", "generic", "", "avx512"};
    return PyUnicode_FromString(names[best_isa()]);
}

static PyMethodDef methods[] = {
    {"addresses", addresses, METH_NOARGS,
     "(rlx_stem_conv, rlx_stem_conv_pack, rlx_stem_conv_pad_nbytes): addresses, for ctypes."},
    {"isa", isa, METH_NOARGS, "The tiles this CPU runs: 'avx512', or 'generic' (tests only)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "rlx_cpu._stemconv",
                                    "A direct convolution for few input channels (see the C source).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__stemconv(void) { return PyModule_Create(&module); }

/* rlx_cpu._winograd: 3x3 stride-1 convolutions as Winograd's F(4x4, 3x3), on NHWC tensors.
 *
 * Why: ResNet's 3x3 convs are most of its time, and oneDNN (the build rlx-cpu loads) has no
 * Winograd kernel on x86: every one runs as a direct conv, 9 multiply-adds an output per input
 * channel. F(4x4, 3x3) computes a 4x4 output tile from a 6x6 input tile with 36 multiply-adds per
 * input channel instead of 144: the input tile and the weights are transformed (V = B^T d B,
 * U = G g G^T, the latter once when the conv is bound), multiplied element by element and summed
 * over channels (36 GEMMs, tiles x C by C x K), and transformed back (Y = A^T M A).
 *
 * Numbers: the transforms mix all 36 values of a tile, so a NaN or Inf input makes a whole tile
 * NaN where the direct conv keeps it to the outputs whose window holds it, and rounding differs
 * from the direct sum (tests/test_cpu_winograd.py bounds it by 2e-5 of the output's largest magnitude). rlx_cpu.conv_chain
 * therefore binds it only in a chain's finite variant, which runs while its input is finite and
 * bounded so that no value of the chain can overflow (see conv_chain._finite_plan).
 *
 * Work: tiles (image, tile row, tile column) are shared out to the OpenMP team of the caller
 * (GOMP_parallel by address, oneDNN's team, as rlx_cpu._stemconv does); each thread takes blocks of
 * TB tiles whose transformed inputs and products fit its L2 and runs the three steps on them. Each
 * output is summed in one fixed order by the thread that owns its tile: the same bits for every
 * thread count.
 *
 * The GEMM's register tile is 5 tiles x 64 output channels (20 zmm accumulators, as the stem conv's
 * kernel: 6 rows spilled there). Only GCC and clang build it (vector extensions, target
 * attributes); optional in the build, as the other two extensions.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64), aligned(4), may_alias));
typedef int32_t v16i __attribute__((vector_size(64), aligned(4), may_alias));

#define SELECT(m, a, b) ((v16)(((v16i)(a) & (m)) | ((v16i)(b) & ~(m))))
typedef void (*gomp_parallel_fn)(void (*)(void *), void *, unsigned, unsigned);
typedef int (*omp_int_fn)(void);

enum { ACT_NONE = 0, ACT_RELU = 1, ACT_CLIP = 2 };
enum { ISA_AUTO = 0, ISA_GENERIC = 1, ISA_AVX512 = 3 };
/* dims: n, c, h, w, k, pt, pl, oh, ow, act, isa (11 words); input NHWC (n, h, w, c), output and
 * residual NHWC (n, oh, ow, k); pads bottom/right follow from oh, ow. */
enum { D_N, D_C, D_H, D_W, D_K, D_PT, D_PL, D_OH, D_OW, D_ACT, D_ISA, D_COUNT };

/* A block of tiles: as many as keep their transformed inputs and products (36 x (C + K) floats a
 * tile) within BLOCK_BYTES of a 1.25-2 MB L2, but at least MIN_TB, since every block reads all of U
 * (36 x C x K floats) again: with 256 channels that is 9.4 MB for 8 tiles' 2.4M multiply-adds each.
 * Measured (2 threads, 2-core Ice Lake VM, one-off builds, p50 ms): ResNet-18's 256-channel 3x3
 * conv at b8 6.8 with blocks of 5 tiles (the L2 bound alone), 5.1 with at least 40; the 512-channel
 * one 16.7 vs 7.6; 64 and 128 channels within 5% either way. */
#define BLOCK_BYTES (640 * 1024)
#define MIN_TB 40
#define RW 5

typedef struct {
    const float *x, *u, *bias, *res;
    float *y, *scratch;
    int64_t d[D_COUNT];
    int64_t th, tw, tiles, tb, per_thread;
    float lo, hi;
    omp_int_fn thread_num, num_threads;
} job_t;

/* s in all 16 lanes (one vbroadcastss; a function returning the vector made GCC insert lane by lane) */
#define SPLAT(s) ((v16){(s), (s), (s), (s), (s), (s), (s), (s), (s), (s), (s), (s), (s), (s), (s), (s)})

/* B^T applied to six values (one column or row of a 6x6 tile). */
static inline __attribute__((always_inline)) void in6(v16 *t, const v16 *d) {
    const v16 four = SPLAT(4.0f), five = SPLAT(5.0f), two = SPLAT(2.0f);
    v16 a = d[4] - d[2] * four, b = d[3] - d[1] * four; /* for t1, t2 */
    v16 c = d[4] - d[2], e = (d[3] - d[1]) * two;       /* for t3, t4 */
    t[0] = d[0] * four - d[2] * five + d[4];
    t[1] = a + b;
    t[2] = a - b;
    t[3] = c + e;
    t[4] = c - e;
    t[5] = d[1] * four - d[3] * five + d[5];
}

/* A^T applied to six values. */
static inline __attribute__((always_inline)) void out6(v16 *o, const v16 *m) {
    const v16 two = SPLAT(2.0f), four = SPLAT(4.0f), eight = SPLAT(8.0f);
    v16 s12 = m[1] + m[2], d12 = m[1] - m[2], s34 = m[3] + m[4], d34 = m[3] - m[4];
    o[0] = m[0] + s12 + s34;
    o[1] = d12 + d34 * two;
    o[2] = s12 + s34 * four;
    o[3] = d12 + d34 * eight + m[5];
}

static inline __attribute__((always_inline)) void tile_of(const job_t *j, int64_t t, int64_t *n, int64_t *r0,
                                                          int64_t *c0) {
    int64_t per = j->th * j->tw;
    *n = t / per;
    *r0 = (t % per) / j->tw * 4;
    *c0 = t % j->tw * 4;
}

/* V[xi][tl][c] for the block's tiles t0..t0+nt (zero outside the input). */
static inline __attribute__((always_inline)) void transform_in(const job_t *j, float *V, int64_t t0, int64_t nt) {
    const int64_t *d = j->d;
    const int64_t C = d[D_C], H = d[D_H], W = d[D_W], tb = j->tb;
    const v16 zero = {0};
    for (int64_t tl = 0; tl < nt; tl++) {
        int64_t n, r0, c0;
        tile_of(j, t0 + tl, &n, &r0, &c0);
        const int64_t ih0 = r0 - d[D_PT], iw0 = c0 - d[D_PL];
        const int inside = ih0 >= 0 && iw0 >= 0 && ih0 + 6 <= H && iw0 + 6 <= W;
        for (int64_t cb = 0; cb < C; cb += 16) {
            v16 p[6][6], q[6][6];
            for (int i = 0; i < 6; i++) {
                const int64_t ih = ih0 + i;
                for (int k = 0; k < 6; k++) {
                    const int64_t iw = iw0 + k;
                    if (inside || (ih >= 0 && ih < H && iw >= 0 && iw < W))
                        p[i][k] = *(const v16 *)(j->x + ((n * H + ih) * W + iw) * C + cb);
                    else
                        p[i][k] = zero;
                }
            }
            /* rows: q = B^T p (per column), then columns: V = q B */
            for (int k = 0; k < 6; k++) {
                v16 col[6], t[6];
                for (int i = 0; i < 6; i++) col[i] = p[i][k];
                in6(t, col);
                for (int i = 0; i < 6; i++) q[i][k] = t[i];
            }
            for (int i = 0; i < 6; i++) {
                v16 t[6];
                in6(t, q[i]);
                for (int k = 0; k < 6; k++) *(v16 *)(V + ((i * 6 + k) * tb + tl) * C + cb) = t[k];
            }
        }
    }
}

/* M[xi][tl][k] = sum over c of V[xi][tl][c] U[xi][c][k], rows r..r+R of the block, 64 channels g. */
static inline __attribute__((always_inline)) void gemm_rows(const float *Vx, const float *Ug, float *Mx,
                                                            int64_t C, int64_t K, int64_t r, int64_t g,
                                                            const int R) {
    v16 acc[RW][4];
#pragma GCC unroll 5
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int b = 0; b < 4; b++) acc[i][b] = (v16){0};
    const float *vr = Vx + r * C;
    for (int64_t c = 0; c < C; c++, Ug += 64) {
        v16 wv[4];
#pragma GCC unroll 4
        for (int b = 0; b < 4; b++) wv[b] = *(const v16 *)(Ug + b * 16);
#pragma GCC unroll 5
        for (int i = 0; i < R; i++) {
            const float s = vr[i * C + c];
            const v16 xv = SPLAT(s);
#pragma GCC unroll 4
            for (int b = 0; b < 4; b++) acc[i][b] += xv * wv[b];
        }
    }
#pragma GCC unroll 5
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int b = 0; b < 4; b++) *(v16 *)(Mx + (r + i) * K + g * 64 + b * 16) = acc[i][b];
}

static inline __attribute__((always_inline)) void gemm(const job_t *j, const float *V, float *M, int64_t nt) {
    const int64_t C = j->d[D_C], K = j->d[D_K], tb = j->tb;
    for (int64_t xi = 0; xi < 36; xi++) {
        const float *Vx = V + xi * tb * C, *Ux = j->u + xi * C * K;
        float *Mx = M + xi * tb * K;
        for (int64_t g = 0; g < K / 64; g++) {
            const float *Ug = Ux + g * C * 64;
            int64_t r = 0;
            for (; r + RW <= nt; r += RW) gemm_rows(Vx, Ug, Mx, C, K, r, g, RW);
            switch (nt - r) {
            case 4: gemm_rows(Vx, Ug, Mx, C, K, r, g, 4); break;
            case 3: gemm_rows(Vx, Ug, Mx, C, K, r, g, 3); break;
            case 2: gemm_rows(Vx, Ug, Mx, C, K, r, g, 2); break;
            case 1: gemm_rows(Vx, Ug, Mx, C, K, r, g, 1); break;
            default: break;
            }
        }
    }
}

/* Y = A^T M A + bias (+ residual), the activation, written where the tile is inside the output. */
static inline __attribute__((always_inline)) void transform_out(const job_t *j, const float *M, int64_t t0,
                                                                int64_t nt) {
    const int64_t *d = j->d;
    const int64_t K = d[D_K], OH = d[D_OH], OW = d[D_OW], tb = j->tb, act = d[D_ACT];
    const v16 zero = {0}, lo = SPLAT(j->lo), hi = SPLAT(j->hi);
    for (int64_t tl = 0; tl < nt; tl++) {
        int64_t n, r0, c0;
        tile_of(j, t0 + tl, &n, &r0, &c0);
        for (int64_t kb = 0; kb < K; kb += 16) {
            v16 q[4][6];
            for (int k = 0; k < 6; k++) {
                v16 col[6], o[4];
                for (int i = 0; i < 6; i++) col[i] = *(const v16 *)(M + ((i * 6 + k) * tb + tl) * K + kb);
                out6(o, col);
                for (int i = 0; i < 4; i++) q[i][k] = o[i];
            }
            const v16 bv = *(const v16 *)(j->bias + kb);
            for (int i = 0; i < 4; i++) {
                const int64_t oh = r0 + i;
                if (oh >= OH) break;
                v16 o[4];
                out6(o, q[i]);
                for (int k = 0; k < 4; k++) {
                    const int64_t ow = c0 + k;
                    if (ow >= OW) break;
                    const int64_t at = ((n * OH + oh) * OW + ow) * K + kb;
                    v16 v = o[k] + bv;
                    if (j->res) v += *(const v16 *)(j->res + at);
                    if (act == ACT_RELU) {
                        v = SELECT(v <= zero, zero, v);
                    } else if (act == ACT_CLIP) {
                        v = SELECT(v < lo, lo, v);
                        v = SELECT(v > hi, hi, v);
                    }
                    *(v16 *)(j->y + at) = v;
                }
            }
        }
    }
}

static inline __attribute__((always_inline)) void work(const job_t *j) {
    const int64_t t = j->thread_num(), nth = j->num_threads();
    const int64_t lo = j->tiles * t / nth, hi = j->tiles * (t + 1) / nth;
    float *V = j->scratch + t * j->per_thread, *M = V + 36 * j->tb * j->d[D_C];
    for (int64_t t0 = lo; t0 < hi; t0 += j->tb) {
        const int64_t nt = hi - t0 < j->tb ? hi - t0 : j->tb;
        transform_in(j, V, t0, nt);
        gemm(j, V, M, nt);
        transform_out(j, M, t0, nt);
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_X86 1
static __attribute__((target("avx512f,fma"))) void work_avx512(void *arg) { work((const job_t *)arg); }
#endif

/* The same code for the baseline ISA: for tests on any machine, never picked by ISA_AUTO. */
static void work_generic(void *arg) { work((const job_t *)arg); }

static int best_isa(void) {
#ifdef HAVE_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")) return ISA_AVX512;
#endif
    return ISA_GENERIC;
}

/* Checks dims and fills the job's geometry; -1 for what the kernel does not take. */
static int plan(job_t *j, const int64_t *dims, int threads) {
    memcpy(j->d, dims, sizeof j->d);
    const int64_t *d = j->d;
    for (int i = 0; i < D_ACT; i++) {
        if (d[i] < (i == D_PT || i == D_PL ? 0 : 1)) return -1;
    }
    if (d[D_C] % 16 || d[D_K] % 64 || d[D_ACT] < ACT_NONE || d[D_ACT] > ACT_CLIP || threads < 1) return -1;
    /* the output's taps stay within the padded input: oh <= h + pt + pb - 2 with pb <= 2 */
    if (d[D_PT] > 2 || d[D_PL] > 2 || d[D_OH] > d[D_H] + d[D_PT] || d[D_OW] > d[D_W] + d[D_PL]) return -1;
    j->th = (d[D_OH] + 3) / 4;
    j->tw = (d[D_OW] + 3) / 4;
    j->tiles = d[D_N] * j->th * j->tw;
    int64_t per_tile = 36 * (d[D_C] + d[D_K]) * (int64_t)sizeof(float);
    int64_t tb = BLOCK_BYTES / per_tile, share = (j->tiles + threads - 1) / threads;
    if (tb < MIN_TB) tb = MIN_TB;
    if (tb > share) tb = share;
    j->tb = tb;
    j->per_thread = 36 * tb * (d[D_C] + d[D_K]) + 16; /* + 16: each thread's area starts 64-byte aligned */
    j->per_thread = (j->per_thread + 15) / 16 * 16;
    return 0;
}

/* Bytes of scratch rlx_wino_conv needs for `threads` threads (64-byte aligned base), or -1. */
int64_t rlx_wino_scratch_nbytes(const int64_t *dims, int threads) {
    job_t j;
    if (plan(&j, dims, threads) != 0) return -1;
    return j.per_thread * threads * (int64_t)sizeof(float);
}

/* The conv (called through ctypes, which releases the GIL). u: the transformed weights, 36 x
 * (k / 64) x c x 64 (rlx_cpu.winograd packs them); res may be NULL; scratch: as
 * rlx_wino_scratch_nbytes says, 64-byte aligned. Returns 0, or -1 with nothing written. */
int rlx_wino_conv(const float *x, const float *u, const float *bias, const float *res, float *y, float *scratch,
                  const int64_t *dims, float lo, float hi, void *gomp_parallel, void *thread_num,
                  void *num_threads, int threads) {
    job_t j;
    memset(&j, 0, sizeof j);
    if (plan(&j, dims, threads) != 0) return -1;
    int best = best_isa();
    int isa = j.d[D_ISA] == ISA_AUTO ? best : (int)j.d[D_ISA];
    if (isa == ISA_GENERIC && j.d[D_ISA] == ISA_AUTO) return -1;
    if ((isa != ISA_GENERIC && isa != ISA_AVX512) || isa > best) return -1;
    if (((uintptr_t)scratch & 63) != 0) return -1;
    j.x = x, j.u = u, j.bias = bias, j.res = res, j.y = y, j.scratch = scratch, j.lo = lo, j.hi = hi;
    j.thread_num = (omp_int_fn)thread_num;
    j.num_threads = (omp_int_fn)num_threads;
    void (*fn)(void *) = work_generic;
#ifdef HAVE_X86
    if (isa == ISA_AVX512) fn = work_avx512;
#endif
    ((gomp_parallel_fn)gomp_parallel)(fn, &j, (unsigned)threads, 0);
    return 0;
}

static PyObject *addresses(PyObject *self, PyObject *unused) {
    return Py_BuildValue("(KK)", (unsigned long long)(uintptr_t)rlx_wino_conv,
                         (unsigned long long)(uintptr_t)rlx_wino_scratch_nbytes);
}

static PyObject *isa(PyObject *self, PyObject *unused) {
    static const char *names[] = {"", "generic", "", "avx512"};
    return PyUnicode_FromString(names[best_isa()]);
}

static PyMethodDef methods[] = {
    {"addresses", addresses, METH_NOARGS, "(rlx_wino_conv, rlx_wino_scratch_nbytes): addresses, for ctypes."},
    {"isa", isa, METH_NOARGS, "The code this CPU runs: 'avx512', or 'generic' (tests only)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "rlx_cpu._winograd",
                                    "3x3 convolutions as Winograd's F(4x4, 3x3) (see the C source).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__winograd(void) { return PyModule_Create(&module); }

/* RLX Cortex-M kernels. Integer arithmetic wraps modulo 2**32 (compile with -fwrapv); floats are
 * IEEE single precision (hardware FPU or libgcc soft-float, both correctly rounded). On cores with
 * the DSP extension (Cortex-M4/M7) int8 dot products use SXTB16/SXTAB16/SMLAD like CMSIS-NN; the
 * portable C path (Cortex-M3, or -DRLX_NO_DSP) gives the same bits. */
#include "rlx_kernels.h"

#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP && !defined(RLX_NO_DSP)
#define RLX_USE_DSP 1
#else
#define RLX_USE_DSP 0
#endif

/* ---- fixed point (TFLite / CMSIS-NN) ------------------------------------------------------- */

int32_t rlx_saturating_rounding_doubling_high_mul(int32_t a, int32_t b)
{
    if (a == b && a == INT32_MIN_) return INT32_MAX_;
    const int64_t ab = (int64_t)a * (int64_t)b;
    const int64_t nudge = ab >= 0 ? (int64_t)(1 << 30) : (int64_t)(1 - (1 << 30));
    return (int32_t)((ab + nudge) / ((int64_t)1 << 31));
}

int32_t rlx_rounding_divide_by_pot(int32_t x, int32_t exponent)
{
    const int32_t mask = (int32_t)(((int64_t)1 << exponent) - 1);
    const int32_t remainder = x & mask;
    const int32_t threshold = (mask >> 1) + (x < 0 ? 1 : 0);
    return (x >> exponent) + (remainder > threshold ? 1 : 0);
}

int32_t rlx_multiply_by_quantized_multiplier(int32_t x, int32_t multiplier, int32_t shift)
{
    const int32_t left = shift > 0 ? shift : 0;
    const int32_t right = shift > 0 ? 0 : -shift;
    const int32_t shifted = (int32_t)((uint32_t)x << left);
    return rlx_rounding_divide_by_pot(rlx_saturating_rounding_doubling_high_mul(shifted, multiplier), right);
}

/* ---- int8 dot product ------------------------------------------------------------------------ */

#if RLX_USE_DSP
static inline uint32_t rlx_read_u32(const int8_t *p)
{
    uint32_t v;
    __builtin_memcpy(&v, p, 4); /* an unaligned LDR on ARMv7E-M */
    return v;
}
static inline uint32_t rlx_sxtb16(uint32_t x)
{
    uint32_t r;
    __asm__("sxtb16 %0, %1" : "=r"(r) : "r"(x));
    return r;
}
static inline uint32_t rlx_sxtb16_ror8(uint32_t x)
{
    uint32_t r;
    __asm__("sxtb16 %0, %1, ror #8" : "=r"(r) : "r"(x));
    return r;
}
static inline uint32_t rlx_sxtab16(uint32_t a, uint32_t x)
{
    uint32_t r;
    __asm__("sxtab16 %0, %1, %2" : "=r"(r) : "r"(a), "r"(x));
    return r;
}
static inline uint32_t rlx_sxtab16_ror8(uint32_t a, uint32_t x)
{
    uint32_t r;
    __asm__("sxtab16 %0, %1, %2, ror #8" : "=r"(r) : "r"(a), "r"(x));
    return r;
}
static inline int32_t rlx_smlad(uint32_t a, uint32_t b, int32_t acc)
{
    int32_t r;
    __asm__("smlad %0, %1, %2, %3" : "=r"(r) : "r"(a), "r"(b), "r"(acc));
    return r;
}
#endif

/* acc + sum_i (x[i] + x_offset) * w[i]; x + x_offset fits int16 (it is in [-255, 255]). */
static inline int32_t rlx_dot_s8(const int8_t *x, const int8_t *w, int32_t k, int32_t x_offset, int32_t acc)
{
    int32_t i = 0;
#if RLX_USE_DSP
    const uint32_t off2 = ((uint32_t)(uint16_t)x_offset) | ((uint32_t)(uint16_t)x_offset << 16);
    for (; i + 4 <= k; i += 4) {
        const uint32_t xv = rlx_read_u32(x + i);
        const uint32_t wv = rlx_read_u32(w + i);
        acc = rlx_smlad(rlx_sxtab16(off2, xv), rlx_sxtb16(wv), acc);             /* lanes 0 and 2 */
        acc = rlx_smlad(rlx_sxtab16_ror8(off2, xv), rlx_sxtb16_ror8(wv), acc);   /* lanes 1 and 3 */
    }
#endif
    for (; i < k; i++) acc += ((int32_t)x[i] + x_offset) * (int32_t)w[i];
    return acc;
}

/* ---- quantize / dequantize ------------------------------------------------------------------- */

/* rint(v) with ties to even, for any float (clamped to +-32768 first: the int8 clamp follows). */
static inline int32_t rlx_round_even(float v)
{
    if (v >= 32768.0f) return 32768;
    if (v <= -32768.0f) return -32768;
    int32_t t = (int32_t)v;        /* toward zero */
    const float f = v - (float)t;  /* exact: |v| < 2**24 */
    if (f > 0.5f || (f == 0.5f && (t & 1))) t += 1;
    else if (f < -0.5f || (f == -0.5f && (t & 1))) t -= 1;
    return t;
}

void rlx_quantize_f32_s8(const float *x, int8_t *y, int32_t n, float scale, int32_t zero_point)
{
    for (int32_t i = 0; i < n; i++) {
        int32_t q = rlx_round_even(x[i] / scale) + zero_point;
        q = q < -128 ? -128 : (q > 127 ? 127 : q);
        y[i] = (int8_t)q;
    }
}

void rlx_dequantize_s8_f32(const int8_t *x, float *y, int32_t n, float scale, int32_t zero_point)
{
    for (int32_t i = 0; i < n; i++) y[i] = (float)((int32_t)x[i] - zero_point) * scale;
}

/* ---- fully connected, convolutions ----------------------------------------------------------- */

void rlx_fully_connected_s8(const int8_t *x, const int8_t *w, const int32_t *bias, int32_t *y,
                            int32_t m, int32_t n, int32_t k, int32_t x_offset)
{
    for (int32_t r = 0; r < m; r++) {
        const int8_t *row = x + r * k;
        int32_t *out = y + r * n;
        for (int32_t c = 0; c < n; c++) out[c] = rlx_dot_s8(row, w + c * k, k, x_offset, bias[c]);
    }
}

void rlx_convolve_s8(const int8_t *x, const int8_t *w, const int32_t *bias, int32_t *y,
                     const rlx_conv_params_t *p)
{
    const int32_t cg = p->c / p->groups, og = p->o / p->groups;
    for (int32_t b = 0; b < p->n; b++) {
        for (int32_t oh = 0; oh < p->ho; oh++) {
            for (int32_t ow = 0; ow < p->wo; ow++) {
                int32_t *out = y + ((b * p->ho + oh) * p->wo + ow) * p->o;
                for (int32_t oc = 0; oc < p->o; oc++) {
                    const int32_t g = oc / og;
                    const int8_t *wk = w + oc * p->kh * p->kw * cg;
                    int32_t acc = bias[oc];
                    for (int32_t i = 0; i < p->kh; i++) {
                        const int32_t ih = oh * p->sh - p->pt + i * p->dh;
                        if (ih < 0 || ih >= p->h) continue;
                        for (int32_t j = 0; j < p->kw; j++) {
                            const int32_t iw = ow * p->sw - p->pl + j * p->dw;
                            if (iw < 0 || iw >= p->w) continue;
                            acc = rlx_dot_s8(x + ((b * p->h + ih) * p->w + iw) * p->c + g * cg,
                                             wk + (i * p->kw + j) * cg, cg, p->x_offset, acc);
                        }
                    }
                    out[oc] = acc;
                }
            }
        }
    }
}

void rlx_depthwise_conv_s8(const int8_t *x, const int8_t *w, const int32_t *bias, int32_t *y,
                           const rlx_conv_params_t *p)
{
    const int32_t mult = p->o / p->c;
    for (int32_t b = 0; b < p->n; b++) {
        for (int32_t oh = 0; oh < p->ho; oh++) {
            for (int32_t ow = 0; ow < p->wo; ow++) {
                int32_t *out = y + ((b * p->ho + oh) * p->wo + ow) * p->o;
                for (int32_t oc = 0; oc < p->o; oc++) out[oc] = bias[oc];
                for (int32_t i = 0; i < p->kh; i++) {
                    const int32_t ih = oh * p->sh - p->pt + i * p->dh;
                    if (ih < 0 || ih >= p->h) continue;
                    for (int32_t j = 0; j < p->kw; j++) {
                        const int32_t iw = ow * p->sw - p->pl + j * p->dw;
                        if (iw < 0 || iw >= p->w) continue;
                        const int8_t *px = x + ((b * p->h + ih) * p->w + iw) * p->c;
                        const int8_t *pw = w + i * p->kw + j;
                        for (int32_t oc = 0; oc < p->o; oc++)
                            out[oc] += ((int32_t)px[oc / mult] + p->x_offset) * (int32_t)pw[oc * p->kh * p->kw];
                    }
                }
            }
        }
    }
}

/* ---- requantize ------------------------------------------------------------------------------ */

void rlx_requantize_s32_s8(const int32_t *x, const int32_t *multiplier, const int32_t *shift, int8_t *y,
                           int32_t n, int32_t multiplier_period, int32_t shift_period, int32_t zero_point,
                           int32_t act_min, int32_t act_max)
{
    int32_t im = 0, is = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t v = rlx_multiply_by_quantized_multiplier(x[i], multiplier[im], shift[is]);
        v = (int32_t)((uint32_t)v + (uint32_t)zero_point);
        v = v < act_min ? act_min : (v > act_max ? act_max : v);
        y[i] = (int8_t)v;
        if (++im == multiplier_period) im = 0;
        if (++is == shift_period) is = 0;
    }
}

/* ---- pooling --------------------------------------------------------------------------------- */

void rlx_max_pool_s8(const int8_t *x, int8_t *y, const rlx_pool_params_t *p)
{
    for (int32_t b = 0; b < p->n; b++) {
        for (int32_t oh = 0; oh < p->ho; oh++) {
            for (int32_t ow = 0; ow < p->wo; ow++) {
                int8_t *out = y + ((b * p->ho + oh) * p->wo + ow) * p->c;
                for (int32_t c = 0; c < p->c; c++) out[c] = -128;
                for (int32_t i = 0; i < p->kh; i++) {
                    const int32_t ih = oh * p->sh - p->pt + i;
                    if (ih < 0 || ih >= p->h) continue;
                    for (int32_t j = 0; j < p->kw; j++) {
                        const int32_t iw = ow * p->sw - p->pl + j;
                        if (iw < 0 || iw >= p->w) continue;
                        const int8_t *px = x + ((b * p->h + ih) * p->w + iw) * p->c;
                        for (int32_t c = 0; c < p->c; c++)
                            if (px[c] > out[c]) out[c] = px[c];
                    }
                }
            }
        }
    }
}

void rlx_avg_pool_s8(const int8_t *x, int8_t *y, const rlx_pool_params_t *p)
{
    for (int32_t b = 0; b < p->n; b++) {
        for (int32_t oh = 0; oh < p->ho; oh++) {
            for (int32_t ow = 0; ow < p->wo; ow++) {
                int8_t *out = y + ((b * p->ho + oh) * p->wo + ow) * p->c;
                for (int32_t c = 0; c < p->c; c++) {
                    int32_t sum = 0, count = 0;
                    for (int32_t i = 0; i < p->kh; i++) {
                        const int32_t ih = oh * p->sh - p->pt + i;
                        if (ih < 0 || ih >= p->h) continue;
                        for (int32_t j = 0; j < p->kw; j++) {
                            const int32_t iw = ow * p->sw - p->pl + j;
                            if (iw < 0 || iw >= p->w) continue;
                            sum += x[((b * p->h + ih) * p->w + iw) * p->c + c];
                            count++;
                        }
                    }
                    /* TFLite / CMSIS-NN: round half away from zero */
                    sum = sum > 0 ? (sum + count / 2) / count : (sum - count / 2) / count;
                    out[c] = (int8_t)sum;
                }
            }
        }
    }
}

/* ---- softmax, argmax ------------------------------------------------------------------------- */

void rlx_softmax_s8(const int8_t *x, int8_t *y, int32_t outer, int32_t len, int32_t inner,
                    const int32_t *lut)
{
    for (int32_t o = 0; o < outer; o++) {
        for (int32_t in = 0; in < inner; in++) {
            const int8_t *px = x + o * len * inner + in;
            int8_t *py = y + o * len * inner + in;
            int32_t mx = -128;
            for (int32_t j = 0; j < len; j++)
                if (px[j * inner] > mx) mx = px[j * inner];
            uint32_t sum = 0;
            for (int32_t j = 0; j < len; j++) sum += (uint32_t)lut[mx - px[j * inner]];
            const uint32_t half = sum >> 1;
            for (int32_t j = 0; j < len; j++) {
                const uint32_t e = (uint32_t)lut[mx - px[j * inner]];
                int32_t q = (int32_t)((e * 256u + half) / sum) - 128;
                py[j * inner] = (int8_t)(q > 127 ? 127 : q);
            }
        }
    }
}

void rlx_argmax_s8(const int8_t *x, int64_t *y, int32_t outer, int32_t len, int32_t inner)
{
    for (int32_t o = 0; o < outer; o++) {
        for (int32_t in = 0; in < inner; in++) {
            const int8_t *px = x + o * len * inner + in;
            int32_t best = 0;
            for (int32_t j = 1; j < len; j++)
                if (px[j * inner] > px[best * inner]) best = j;
            y[o * inner + in] = best;
        }
    }
}

/* ---- elementwise with broadcasting, data movement -------------------------------------------- */

#define RLX_BCAST_LOOP(BODY)                                                   \
    do {                                                                       \
        int32_t idx[RLX_MAX_RANK];                                             \
        int32_t ia = 0, ib = 0;                                                \
        for (int32_t d = 0; d < bc->rank; d++) idx[d] = 0;                     \
        for (int32_t i = 0; i < bc->n; i++) {                                  \
            BODY;                                                              \
            for (int32_t d = bc->rank - 1; d >= 0; d--) {                      \
                ia += bc->sa[d];                                               \
                ib += bc->sb[d];                                               \
                if (++idx[d] < bc->shape[d]) break;                            \
                ia -= bc->sa[d] * bc->shape[d];                                \
                ib -= bc->sb[d] * bc->shape[d];                                \
                idx[d] = 0;                                                    \
            }                                                                  \
        }                                                                      \
    } while (0)

void rlx_maximum_s8(const int8_t *a, const int8_t *b, int8_t *y, const rlx_bcast_t *bc)
{
    RLX_BCAST_LOOP(y[i] = a[ia] > b[ib] ? a[ia] : b[ib]);
}

void rlx_add_f32(const float *a, const float *b, float *y, const rlx_bcast_t *bc)
{
    RLX_BCAST_LOOP(y[i] = a[ia] + b[ib]);
}

void rlx_transpose(const void *x, void *y, int32_t elem_size, const rlx_transpose_t *t)
{
    int32_t idx[RLX_MAX_RANK];
    int32_t src = 0;
    for (int32_t d = 0; d < t->rank; d++) idx[d] = 0;
    for (int32_t i = 0; i < t->n; i++) {
        switch (elem_size) {
        case 1: ((uint8_t *)y)[i] = ((const uint8_t *)x)[src]; break;
        case 2: ((uint16_t *)y)[i] = ((const uint16_t *)x)[src]; break;
        case 4: ((uint32_t *)y)[i] = ((const uint32_t *)x)[src]; break;
        default: ((uint64_t *)y)[i] = ((const uint64_t *)x)[src]; break;
        }
        for (int32_t d = t->rank - 1; d >= 0; d--) {
            src += t->stride[d];
            if (++idx[d] < t->shape[d]) break;
            src -= t->stride[d] * t->shape[d];
            idx[d] = 0;
        }
    }
}

void rlx_copy(const void *x, void *y, uint32_t nbytes)
{
    const uint8_t *s = (const uint8_t *)x;
    uint8_t *d = (uint8_t *)y;
    if (s == d) return;
    for (uint32_t i = 0; i < nbytes; i++) d[i] = s[i];
}

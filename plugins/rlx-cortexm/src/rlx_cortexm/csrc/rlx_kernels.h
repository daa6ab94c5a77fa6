/* RLX Cortex-M kernels: CMSIS-NN-style int8 inference (NHWC activations, OHWI weights, TFLite
 * requantization), no heap, no C library. Every kernel reads its inputs and writes its output
 * through pointers into the static arena (or const weights in flash); sizes come from the caller. */
#ifndef RLX_KERNELS_H
#define RLX_KERNELS_H
#include "rlx_types.h"

#define RLX_MAX_RANK 8

typedef struct {
    int32_t n, h, w, c;            /* input NHWC */
    int32_t o, kh, kw;             /* output channels and kernel size (weights OHWI) */
    int32_t sh, sw, pt, pl, dh, dw;
    int32_t ho, wo, groups;
    int32_t x_offset;              /* -(input zero point) */
} rlx_conv_params_t;

typedef struct {
    int32_t n, h, w, c, kh, kw, sh, sw, pt, pl, ho, wo;
} rlx_pool_params_t;

typedef struct {
    int32_t rank, n;               /* output rank and element count */
    int32_t shape[RLX_MAX_RANK];   /* output shape */
    int32_t sa[RLX_MAX_RANK];      /* element strides of a per output axis (0 = broadcast) */
    int32_t sb[RLX_MAX_RANK];
} rlx_bcast_t;

typedef struct {
    int32_t rank, n;
    int32_t shape[RLX_MAX_RANK];   /* output shape */
    int32_t stride[RLX_MAX_RANK];  /* element stride in the input of each output axis */
} rlx_transpose_t;

void rlx_quantize_f32_s8(const float *x, int8_t *y, int32_t n, float scale, int32_t zero_point);
void rlx_dequantize_s8_f32(const int8_t *x, float *y, int32_t n, float scale, int32_t zero_point);
void rlx_fully_connected_s8(const int8_t *x, const int8_t *w, const int32_t *bias, int32_t *y,
                            int32_t m, int32_t n, int32_t k, int32_t x_offset);
void rlx_convolve_s8(const int8_t *x, const int8_t *w, const int32_t *bias, int32_t *y,
                     const rlx_conv_params_t *p);
void rlx_depthwise_conv_s8(const int8_t *x, const int8_t *w, const int32_t *bias, int32_t *y,
                           const rlx_conv_params_t *p);
void rlx_requantize_s32_s8(const int32_t *x, const int32_t *multiplier, const int32_t *shift, int8_t *y,
                           int32_t n, int32_t multiplier_period, int32_t shift_period, int32_t zero_point,
                           int32_t act_min, int32_t act_max);
void rlx_max_pool_s8(const int8_t *x, int8_t *y, const rlx_pool_params_t *p);
void rlx_avg_pool_s8(const int8_t *x, int8_t *y, const rlx_pool_params_t *p);
void rlx_softmax_s8(const int8_t *x, int8_t *y, int32_t outer, int32_t len, int32_t inner,
                    const int32_t *lut);
void rlx_argmax_s8(const int8_t *x, int64_t *y, int32_t outer, int32_t len, int32_t inner);
void rlx_maximum_s8(const int8_t *a, const int8_t *b, int8_t *y, const rlx_bcast_t *bc);
void rlx_add_f32(const float *a, const float *b, float *y, const rlx_bcast_t *bc);
void rlx_transpose(const void *x, void *y, int32_t elem_size, const rlx_transpose_t *t);
void rlx_copy(const void *x, void *y, uint32_t nbytes);

/* The integer rules, exposed for tests and custom kernels. */
int32_t rlx_saturating_rounding_doubling_high_mul(int32_t a, int32_t b);
int32_t rlx_rounding_divide_by_pot(int32_t x, int32_t exponent);
int32_t rlx_multiply_by_quantized_multiplier(int32_t x, int32_t multiplier, int32_t shift);
#endif

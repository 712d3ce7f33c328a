/*
 * Fused bfloat16 element-wise ops of a decoder layer, for CPUs.
 *
 * Each replaces a chain of torch ops (a dozen for RMSNorm with its residual add) with one
 * pass over the data, and reproduces the torch chain's roundings: every value torch would
 * round to bfloat16 between two ops is rounded here too, so the results equal the torch
 * ops' up to float32 summation order and libm. Rows are spread over OpenMP threads when
 * there are enough of them to pay for it.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "kernels.h"



#define PARALLEL_ROWS 32

/* torch's tanh approximation of GELU: 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))). */
static inline float gelu_tanh(float g) {
    const float beta = 0.7978845608028654f, kappa = 0.044715f;
    return 0.5f * g * (1.f + tanhf(beta * (g + kappa * g * g * g)));
}

/* residual [T, H] float32 becomes x + residual (x itself when has_residual is 0); out [T, H]
 * = weight * bf16(residual / sqrt(mean(residual^2) + eps)), rounded to bfloat16. */
void add_rms_norm_bf16(int64_t T, int64_t H, const uint16_t *x, int64_t x_stride,
                       float *residual, int32_t has_residual, const uint16_t *weight,
                       uint16_t *out, float eps) {
#pragma omp parallel for if (T >= PARALLEL_ROWS)
    for (int64_t t = 0; t < T; t++) {
        const uint16_t *xt = x + t * x_stride;
        float *r = residual + t * H;
        float sum = 0.f;
        if (has_residual) {
            for (int64_t j = 0; j < H; j++) { r[j] += bf16_to_float(xt[j]); sum += r[j] * r[j]; }
        } else {
            for (int64_t j = 0; j < H; j++) { r[j] = bf16_to_float(xt[j]); sum += r[j] * r[j]; }
        }
        const float inv = 1.f / sqrtf(sum / (float)H + eps);
        uint16_t *o = out + t * H;
        for (int64_t j = 0; j < H; j++)
            o[j] = float_to_bf16(bf16_to_float(weight[j]) * round_bf16(r[j] * inv));
    }
}

/* As add_rms_norm_bf16 for LayerNorm (GPT-2, OPT): out = bf16((residual - mean) / sqrt(var +
 * eps) * weight + bias), statistics over the row in float32; `bias` may be NULL. */
void add_layer_norm_bf16(int64_t T, int64_t H, const uint16_t *x, int64_t x_stride,
                         float *residual, int32_t has_residual, const uint16_t *weight,
                         const uint16_t *bias, uint16_t *out, float eps) {
#pragma omp parallel for if (T >= PARALLEL_ROWS)
    for (int64_t t = 0; t < T; t++) {
        const uint16_t *xt = x + t * x_stride;
        float *r = residual + t * H;
        float sum = 0.f;
        for (int64_t j = 0; j < H; j++) {
            r[j] = bf16_to_float(xt[j]) + (has_residual ? r[j] : 0.f);
            sum += r[j];
        }
        const float mean = sum / (float)H;
        float squares = 0.f;
        for (int64_t j = 0; j < H; j++) squares += (r[j] - mean) * (r[j] - mean);
        const float inv = 1.f / sqrtf(squares / (float)H + eps);
        uint16_t *o = out + t * H;
        for (int64_t j = 0; j < H; j++) {
            const float b = bias == NULL ? 0.f : bf16_to_float(bias[j]);
            o[j] = float_to_bf16((r[j] - mean) * inv * bf16_to_float(weight[j]) + b);
        }
    }
}

/* CLIP's quick GELU as torch computes x * torch.sigmoid(1.702 * x) in bfloat16: each of the
 * three ops' results rounded to bfloat16. */
static inline uint16_t quick_gelu_bf16(float v) {
    const float sig = round_bf16(1.f / (1.f + expf(-round_bf16(1.702f * v))));
    return float_to_bf16(v * sig);
}

/* out [T, d] = act(x) of a plain MLP's hidden rows (x_stride apart): STACK_GELU_TANH
 * (GPT-2's gelu_new), STACK_RELU (OPT) or STACK_QUICK_GELU (CLIP's vision tower). */
void activation_bf16(int64_t kind, int64_t T, int64_t d, const uint16_t *x, int64_t x_stride,
                     uint16_t *out) {
#pragma omp parallel for if (T >= PARALLEL_ROWS)
    for (int64_t t = 0; t < T; t++) {
        const uint16_t *xt = x + t * x_stride;
        uint16_t *o = out + t * d;
        if (kind == STACK_QUICK_GELU) { /* a loop of its own: it vectorizes (expf too) */
            for (int64_t j = 0; j < d; j++) o[j] = quick_gelu_bf16(bf16_to_float(xt[j]));
            continue;
        }
        for (int64_t j = 0; j < d; j++) {
            const float v = bf16_to_float(xt[j]);
            o[j] = kind == STACK_RELU ? (v > 0.f ? xt[j] : 0) : float_to_bf16(gelu_tanh(v));
        }
    }
}

/* x [T, 2d] (gate | up, rows x_stride apart) → out [T, d] = bf16(act(gate)) * up, act
 * STACK_SILU or STACK_GELU_TANH; inlined with a constant `kind` into each entry point below. */
static inline void gated_and_mul(int64_t kind, int64_t T, int64_t d, const uint16_t *x,
                                 int64_t x_stride, uint16_t *out) {
#pragma omp parallel for if (T >= PARALLEL_ROWS)
    for (int64_t t = 0; t < T; t++) {
        const uint16_t *gate = x + t * x_stride, *up = gate + d;
        uint16_t *o = out + t * d;
        /* A loop per kind: OpenMP's outlined body sees `kind` as a variable, and one loop
         * with a select would be if-converted to compute both activations. */
        if (kind == STACK_SILU) {
            for (int64_t j = 0; j < d; j++) {
                const float g = bf16_to_float(gate[j]);
                o[j] = float_to_bf16(round_bf16(g / (1.f + expf(-g))) * bf16_to_float(up[j]));
            }
        } else {
            for (int64_t j = 0; j < d; j++) {
                const float g = bf16_to_float(gate[j]);
                o[j] = float_to_bf16(round_bf16(gelu_tanh(g)) * bf16_to_float(up[j]));
            }
        }
    }
}

/* out [T, d] = silu(gate) * up. */
void silu_and_mul_bf16(int64_t T, int64_t d, const uint16_t *x, int64_t x_stride,
                       uint16_t *out) {
    gated_and_mul(STACK_SILU, T, d, x, x_stride, out);
}

/* out [T, d] = gelu_tanh(gate) * up (GeGLU: Gemma's gelu_pytorch_tanh), torch's formula
 * 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))). */
void gelu_tanh_and_mul_bf16(int64_t T, int64_t d, const uint16_t *x, int64_t x_stride,
                            uint16_t *out) {
    gated_and_mul(STACK_GELU_TANH, T, d, x, x_stride, out);
}

/* Neox-style RoPE in place on x [T, heads, head_size] (tokens x_stride apart, heads
 * head_size apart): the first rot_dim / 2 dims of a head pair with the next rot_dim / 2.
 * cos_sin [max_position, rot_dim] float32 holds (cos | sin) per position. */
void rope_neox_bf16(int64_t T, int64_t heads, int64_t head_size, int64_t rot_dim,
                    uint16_t *x, int64_t x_stride, const int64_t *positions,
                    const float *cos_sin) {
    const int64_t half = rot_dim / 2;
#pragma omp parallel for if (T >= PARALLEL_ROWS)
    for (int64_t t = 0; t < T; t++) {
        const float *cs = cos_sin + positions[t] * rot_dim;
        for (int64_t h = 0; h < heads; h++) {
            uint16_t *a = x + t * x_stride + h * head_size, *b = a + half;
            for (int64_t i = 0; i < half; i++) {
                const float c = round_bf16(cs[i]), s = round_bf16(cs[half + i]);
                const float x1 = bf16_to_float(a[i]), x2 = bf16_to_float(b[i]);
                a[i] = float_to_bf16(round_bf16(x1 * c) - round_bf16(x2 * s));
                b[i] = float_to_bf16(round_bf16(x2 * c) + round_bf16(x1 * s));
            }
        }
    }
}

/* finite[t] = 1 when row t of x [T, H] (rows x_stride apart) holds no NaN or infinity, else
 * 0; returns how many rows do. The exponent bits are tested (-ffast-math would fold isfinite
 * away): all ones is an infinity or a NaN. */
int64_t finite_rows_bf16(int64_t T, int64_t H, const uint16_t *x, int64_t x_stride,
                         uint8_t *finite) {
    int64_t bad = 0;
    for (int64_t t = 0; t < T; t++) {
        const uint16_t *xt = x + t * x_stride;
        int special = 0;
        for (int64_t j = 0; j < H; j++) special |= (xt[j] & 0x7F80) == 0x7F80;
        finite[t] = (uint8_t)!special;
        bad += special;
    }
    return bad;
}

/*
 * The reference implementation of isa.h in plain C: one value at a time, in the order the
 * vector versions use (lanes side by side, groups and keys one after another), with explicit
 * fused multiply-adds. It defines the arithmetic the other ISA sources must reproduce, and it
 * is the library of CPUs no other variant fits (compiled for the architecture's baseline).
 */
#include <math.h>
#include <string.h>

#include "bf16.h"
#include "isa.h"

const char ISA_NAME[] = "scalar";
const int ISA_TILE_TOKENS = 1;
_Static_assert(Q8_BLOCK_TOKENS % 1 == 0, "a tile's tokens lie in one block (isa.h)");
const int ISA_BF16_TOKENS = 1, ISA_BF16_PANELS = 1;

void isa_quantize_q8_bf16(const Q8Activations *a, const uint16_t *x, int64_t t, int halves) {
    for (int64_t g = 0; g < a->G; g++) {
        float amaxes[2] = {0.f, 0.f}, v[Q8_GROUP];
        int32_t sums[2];
        for (int i = 0; i < Q8_GROUP; i++) {
            v[i] = bf16_to_float(x[g * Q8_GROUP + i]);
            amaxes[i / Q8_HALF] = fabsf(v[i]) > amaxes[i / Q8_HALF] ? fabsf(v[i]) : amaxes[i / Q8_HALF];
        }
        q8_share_amax(amaxes, halves);
        for (int h = 0; h < 2; h++) {
            const float inv = q8_inverse_step(amaxes[h]);
            int8_t *q = a->xq + q8_entry(a, t, g) * Q8_GROUP + h * Q8_HALF;
            int32_t sum = 0;
            for (int i = 0; i < Q8_HALF; i++) {
                q[i] = (int8_t)nearbyintf(v[h * Q8_HALF + i] * inv); /* half to even */
                sum += q[i];
            }
            sums[h] = sum;
        }
        q8_record_group(a, t, g, amaxes, sums, halves);
    }
}

/* Code k (0..31) of panel row `lane` in one group's bytes (see w4a8.c for the layout). */
static inline int code_at(int int8, const uint8_t *group, int lane, int k) {
    if (int8) return group[(k / 4) * 64 + lane * 4 + k % 4];
    return (group[((k % 16) / 4) * 64 + lane * 4 + k % 4] >> (4 * (k / 16))) & 0x0F;
}

/* Scale i of dm, float16 or float32 by the format. */
static inline float scale_at(int format, const void *dm, int64_t i) {
    if (FMT_HALF_SCALES(format)) return half_to_float(((const uint16_t *)dm)[i]);
    return ((const float *)dm)[i];
}

void isa_byte_dot_tile(int format, const Q8Activations *a, int64_t t, int rows,
                       const uint8_t *codes, const void *dm, uint16_t *out,
                       int64_t out_stride, int lanes) {
    const int int8 = format == FMT_INT8, implied_min = FMT_DM_STRIDE(format) == PANEL_ROWS;
    const int64_t group_bytes = int8 ? 512 : 256, dm_stride = FMT_DM_STRIDE(format);
    for (int r = 0; r < rows; r++) {
        const int64_t row = t + r;
        float acc[PANEL_ROWS] = {0.f};
        for (int64_t g = 0; g < a->G; g++) {
            const int64_t e = q8_entry(a, row, g);
            const int8_t *xq = a->xq + e * Q8_GROUP;
            const float *dx = a->dx + e * 2, c = a->c[e];
            for (int lane = 0; lane < lanes; lane++) {
                int32_t dot[2] = {0, 0};
                for (int k = 0; k < Q8_GROUP; k++)
                    dot[k / Q8_HALF] += code_at(int8, codes + g * group_bytes, lane, k) * xq[k];
                const float d = scale_at(format, dm, g * dm_stride + lane);
                const float m = implied_min
                                    ? FMT_MIN_FACTOR(format) * d
                                    : scale_at(format, dm, g * dm_stride + PANEL_ROWS + lane);
                if (int8) { /* one scale per group */
                    acc[lane] = fmaf((float)(dot[0] + dot[1]), d * dx[0], acc[lane]);
                } else {
                    acc[lane] = fmaf((float)dot[0], d * dx[0], acc[lane]);
                    acc[lane] = fmaf((float)dot[1], d * dx[1], acc[lane]);
                }
                acc[lane] = fmaf(m, c, acc[lane]);
            }
        }
        for (int lane = 0; lane < lanes; lane++) out[r * out_stride + lane] = float_to_bf16(acc[lane]);
    }
}

void isa_attn_scores_4(const float *q, int64_t D, const float *tile_t, float *s,
                       int64_t s_stride) {
    for (int r = 0; r < 4; r++) {
        float acc[KEY_TILE] = {0.f};
        for (int64_t j = 0; j < D; j++)
            for (int t = 0; t < KEY_TILE; t++)
                acc[t] = fmaf(q[r * D + j], tile_t[j * KEY_TILE + t], acc[t]);
        memcpy(s + r * s_stride, acc, sizeof acc);
    }
}

void isa_attn_weighted_sum(float *acc, int64_t D, const float *w, const float *tile, int64_t n) {
    for (int64_t t = 0; t < n; t++)
        for (int64_t j = 0; j < D; j++) acc[j] = fmaf(w[t], tile[t * D + j], acc[j]);
}

void isa_attn_key_scores(const float *q, int64_t rows, int64_t D, const float *tile,
                         int64_t kt, float *s, int64_t s_stride) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t t = 0; t < kt; t++) {
            float a = 0.f;
            for (int64_t j = 0; j < D; j++) a = fmaf(q[r * D + j], tile[t * D + j], a);
            s[r * s_stride + t] = a;
        }
}

void isa_int8_row_to_float(float *dst, const int8_t *row, int64_t D) {
    for (int64_t g = 0; g < D / 16; g++) {
        float scale;
        memcpy(&scale, row + D + 4 * g, sizeof scale);
        for (int j = 0; j < 16; j++) dst[16 * g + j] = (float)row[16 * g + j] * scale;
    }
}

void isa_attn_weighted_sum_rows(float *acc, int64_t rows, int64_t D, const float *w,
                                int64_t w_stride, const float *tile, int64_t n) {
    for (int64_t r = 0; r < rows; r++) isa_attn_weighted_sum(acc + r * D, D, w + r * w_stride, tile, n);
}

/* One token x one panel: each row's pairs in vdpbf16ps's order (isa.h). */
void isa_bf16_tile(const uint16_t *x, int64_t x_stride, int rows, const uint16_t *panels,
                   int count, int64_t K, uint16_t *out, int64_t out_stride, int lanes) {
    (void)x_stride, (void)rows, (void)count, (void)out_stride;
    for (int i = 0; i < lanes; i++) {
        float acc = 0.f;
        for (int64_t j = 0; j < K / 2; j++) {
            const uint16_t *w = panels + j * 2 * PANEL_ROWS + 2 * i;
            acc = fmaf(bf16_to_float(w[1]), bf16_to_float(x[2 * j + 1]), acc);
            acc = fmaf(bf16_to_float(w[0]), bf16_to_float(x[2 * j]), acc);
        }
        out[i] = float_to_bf16(acc);
    }
}

/* Decode scores over a bfloat16 cache: through a float32 tile. */
ISA_KEY_SCORES_BF16_THROUGH_A_TILE

/*
 * int4 or int8 weights x int8 activations on CPU: the matmul of bfloat16 models with quantized
 * weights, for steps of any size. This file holds the layout, the threading and the memory;
 * the products themselves are the ISA source's (isa.h: isa_quantize_q8_bf16, isa_byte_dot_tile).
 *
 * Weights are stored in panels of 16 output rows; a panel is a run of groups of 32 input
 * values. Byte dot-product instructions (vpdpbusd, vpmaddubsw, vdotq) multiply, per 32-bit
 * lane, 4 consecutive weight bytes by 4 activation bytes, so a group's codes are kept as
 * quads: quad j holds inputs 4j..4j+3 of the panel's 16 rows, 64 bytes, row by row.
 *  - int4 (GGUF Q4_1's form, w = d * q + m, q in 0..15): 256 bytes per group, 4 blocks of
 *    64 bytes, block b holding quad b in its low nibbles and quad b + 4 in its high ones;
 *    dm [panels, groups, 2, 16] float32: the 16 rows' scales d, then their minimums m;
 *    or float16 (w4a8_f16_matmul_bf16), when every d and m is a float16 (GGUF Q4_0 / Q4_1
 *    scales are): 64 bytes of scales a group instead of 128, the same products; or, when
 *    every m is -8 d (Q4_0), d alone [panels, groups, 16] float16 (w4a8_sym_f16_matmul_bf16).
 *  - int8 (GGUF Q8_0's form, w = d * q, q in -127..127): q + 128 (unsigned) as 8 quads,
 *    512 bytes per group; dm [panels, groups, 16] float32: d only, the minimum is -128 d.
 * Activations are quantized per token to int8 with their own step dx, per 16 values for int4
 * weights (llama.cpp uses 32 for its 4-bit dot products; isa.h says why 16) and per 32 for
 * int8 ones; c = the sum over the halves of dx * sum(xq) carries the minimums' share:
 *   sum_i w_i x_i = d (dx_0 sum_{i<16} q_i xq_i + dx_1 sum_{i>=16} q_i xq_i) + m c.
 * A tile is up to ISA_TILE_TOKENS tokens x one panel. The output rows of a token do not
 * depend on the other tokens of the call, nor on the ISA (isa.h fixes the order of every
 * float operation). OpenMP threads take panels; the last panel may be partly padding (rows
 * beyond N are never stored).
 */
#include <stdint.h>
#include <stdlib.h>

#include "isa.h"
#include "kernels.h"

const char *pagedllm_isa(void) { return ISA_NAME; }

/* out [M, N] bfloat16 (rows out_stride apart) = x [M, K] bfloat16 (rows x_stride apart) @ W^T
 * for W in any layout (FMT_BF16: bf16_matmul.c's). Returns 1 when K is not a multiple of 32
 * (odd for FMT_BF16), 2 when out of memory. */
int byte_dot_matmul(int format, int64_t M, int64_t N, int64_t K, const uint16_t *x,
                           int64_t x_stride, const uint8_t *codes, const void *dm,
                           uint16_t *out, int64_t out_stride) {
    if (format == FMT_BF16) /* dense weights: no scales, no quantized activations */
        return bf16_matmul_bf16(M, N, K, x, x_stride, (const uint16_t *)codes, out, out_stride);
    if (K % Q8_GROUP != 0) return 1;
    const int INT8 = format == FMT_INT8;
    /* dm's element size: float16 scales are two bytes */
    const size_t dm_bytes = FMT_HALF_SCALES(format) ? 2 : 4;
    const int64_t G = K / Q8_GROUP, panels = (N + PANEL_ROWS - 1) / PANEL_ROWS;
    const int64_t group_bytes = INT8 ? 512 : 256, dm_stride = FMT_DM_STRIDE(format);
    /* codes xq [entries, 32]; dx [entries, 2], c [entries] and sums [entries, 2] in one
     * allocation (4-byte values): an entry per token and group in q8_entry's order, for
     * whole blocks of Q8_BLOCK_TOKENS tokens (isa.h's layout) */
    const int64_t padded = (M + Q8_BLOCK_TOKENS - 1) / Q8_BLOCK_TOKENS * Q8_BLOCK_TOKENS;
    Q8Activations a = {K, G, malloc((size_t)(padded * K)),
                       malloc(sizeof(float) * (size_t)(5 * padded * G)), NULL, NULL};
    if (a.xq == NULL || a.dx == NULL) { free(a.xq); free(a.dx); return 2; }
    a.c = a.dx + 2 * padded * G;
    a.sums = (int32_t *)(a.c + padded * G);
    #pragma omp parallel
    {
        #pragma omp for schedule(static)
        for (int64_t t = 0; t < M; t++) isa_quantize_q8_bf16(&a, x + t * x_stride, t, !INT8);
        #pragma omp for schedule(static)
        for (int64_t p = 0; p < panels; p++) {
            const int lanes = N - p * PANEL_ROWS < PANEL_ROWS ? (int)(N - p * PANEL_ROWS) : PANEL_ROWS;
            for (int64_t t = 0; t < M; t += ISA_TILE_TOKENS) {
                const int rows = M - t < ISA_TILE_TOKENS ? (int)(M - t) : ISA_TILE_TOKENS;
                isa_byte_dot_tile(format, &a, t, rows, codes + p * G * group_bytes,
                                  (const char *)dm + p * G * dm_stride * dm_bytes,
                                  out + t * out_stride + p * PANEL_ROWS,
                                  out_stride, lanes);
            }
        }
    }
    free(a.xq);
    free(a.dx);
    return 0;
}

int w4a8_matmul_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *x, int64_t x_stride,
                     const uint8_t *qs, const float *dm, uint16_t *out, int64_t out_stride) {
    return byte_dot_matmul(FMT_INT4, M, N, K, x, x_stride, qs, dm, out, out_stride);
}

int w4a8_f16_matmul_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *x, int64_t x_stride,
                         const uint8_t *qs, const uint16_t *dm, uint16_t *out,
                         int64_t out_stride) {
    return byte_dot_matmul(FMT_INT4_F16, M, N, K, x, x_stride, qs, dm, out, out_stride);
}

int w4a8_sym_f16_matmul_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *x,
                             int64_t x_stride, const uint8_t *qs, const uint16_t *d,
                             uint16_t *out, int64_t out_stride) {
    return byte_dot_matmul(FMT_INT4_SYM_F16, M, N, K, x, x_stride, qs, d, out, out_stride);
}

int w8a8_matmul_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *x, int64_t x_stride,
                     const uint8_t *qs, const float *dm, uint16_t *out, int64_t out_stride) {
    return byte_dot_matmul(FMT_INT8, M, N, K, x, x_stride, qs, dm, out, out_stride);
}

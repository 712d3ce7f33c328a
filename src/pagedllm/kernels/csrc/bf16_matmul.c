/*
 * Dense bfloat16 weights x bfloat16 activations on CPU: the matmul of bfloat16 models whose
 * weights are not quantized, for steps of any size. This file holds the layout and the
 * threading; the products are the ISA source's (isa.h: isa_bf16_tile, whose arithmetic is
 * vdpbf16ps's, emulated exactly where the CPU lacks it).
 *
 * Weights are stored in panels of 16 output rows, a panel being K / 2 pairs of inputs: pair j
 * holds W[16 p + i][2 j] and W[16 p + i][2 j + 1] for its 16 rows i, 64 bytes side by side
 * (one AVX-512 vector: lane i multiplies the activation pair 2j, 2j + 1 broadcast to every
 * lane). The last panel is padded with zero rows. An output row depends on its own token's
 * activations only, in the same order whatever the step's size or vector ISA, so a token's
 * result is the same alone or in any batch.
 *
 * Where the variant has matrix units (amx_bf16.c) the whole step runs on them instead, in
 * their own order (not vdpbf16ps's; batch-invariant too).
 * Otherwise a tile is up to ISA_BF16_PANELS panels x ISA_BF16_TOKENS tokens, its accumulators
 * all in registers. OpenMP threads take runs of panels; large steps go through in chunks of tokens
 * whose activations stay in the core's cache while every panel passes over them.
 */
#include <stdint.h>

#include "isa.h"
#include "kernels.h"

/* Tokens per chunk of a large step: 256 x K bfloat16 values (288 KB at K = 576). */
#define TOKEN_CHUNK 256

int bf16_matmul_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *x, int64_t x_stride,
                     const uint16_t *panels, uint16_t *out, int64_t out_stride) {
    if (K % 2 != 0) return 1;
    if (bf16_matrix_matmul(M, N, K, x, x_stride, panels, out, out_stride) == 0) return 0;
    const int64_t num_panels = (N + PANEL_ROWS - 1) / PANEL_ROWS;
    const int64_t units = (num_panels + ISA_BF16_PANELS - 1) / ISA_BF16_PANELS;
    const int64_t panel_size = K * PANEL_ROWS;
    #pragma omp parallel
    for (int64_t chunk = 0; chunk < M; chunk += TOKEN_CHUNK) {
        const int64_t end = M - chunk < TOKEN_CHUNK ? M : chunk + TOKEN_CHUNK;
        #pragma omp for schedule(static)
        for (int64_t u = 0; u < units; u++) {
            const int64_t first = u * ISA_BF16_PANELS;
            const int count = num_panels - first < ISA_BF16_PANELS ? (int)(num_panels - first)
                                                                   : ISA_BF16_PANELS;
            /* rows of the unit's last panel that exist (the matrix's last may be partial) */
            const int64_t last_rows = N - (first + count - 1) * PANEL_ROWS;
            const int lanes = last_rows < PANEL_ROWS ? (int)last_rows : PANEL_ROWS;
            for (int64_t t = chunk; t < end; t += ISA_BF16_TOKENS) {
                const int rows = end - t < ISA_BF16_TOKENS ? (int)(end - t) : ISA_BF16_TOKENS;
                isa_bf16_tile(x + t * x_stride, x_stride, rows, panels + first * panel_size,
                              count, K, out + t * out_stride + first * PANEL_ROWS, out_stride,
                              lanes);
            }
        }
    }
    return 0;
}

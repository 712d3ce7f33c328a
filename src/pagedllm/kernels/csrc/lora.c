/*
 * Multi-LoRA deltas on CPU (punica's bgmv idea): every token adds its own adapter's
 * low-rank update to a linear layer's bfloat16 output, in one call for the whole step.
 *
 * A layer's output is `subs` sub-outputs side by side (q, k, v; gate, up; or one), sub j
 * of width n_j at column offset o_j. For the adapter in slot s:
 *
 *   A[s]  [subs * R, K] bfloat16: rows j*R .. j*R+R-1 are sub j's lora_A (zero-padded rank);
 *   B[s]  per sub j, [R, n_j] bfloat16 (lora_B^T, scale folded in) at R * o_j of the
 *         slot's R * N values: only the sub's own columns, no block of zeros.
 *
 * Token t (rows of x and out `*_stride` apart) with slot s adds
 * (x_t . A[s]^T) . B[s] to out_t, the shrink and the sum kept in float32 and rounded to
 * bfloat16 once. `order` lists the tokens that have an adapter, grouped by slot (so a
 * tile of up to 8 tokens of one slot converts each weight row once), `order_slots` their
 * slots. Ranks
 * whose shrink is exactly zero (padding) are skipped.
 */
#include <stdint.h>
#include <stdlib.h>

#include "bf16.h"
#include "kernels.h"

#define PARALLEL_TOKENS 4
/* Tokens of one slot processed together: each weight row is converted once per tile. */
#define LORA_TILE 8

/* One tile: tokens order[0..n) all of slot s. */
static void lora_tile(int64_t n, int64_t K, int64_t N, const uint16_t *x, int64_t x_stride,
                      uint16_t *out, int64_t out_stride, const int32_t *order, int64_t s,
                      int64_t subs, const int64_t *sub_offsets, int64_t R, const uint16_t *A,
                      const uint16_t *B, float *buf) {
    const int64_t W = subs * R;
    float *xf = buf, *row = xf + LORA_TILE * K, *shrink = row + (K > N ? K : N);
    float *acc = shrink + LORA_TILE * W;
    for (int64_t i = 0; i < n; i++) {
        const uint16_t *xt = x + order[i] * x_stride;
        for (int64_t k = 0; k < K; k++) xf[i * K + k] = bf16_to_float(xt[k]);
    }
    const uint16_t *a = A + s * W * K;
    for (int64_t w = 0; w < W; w++) {
        for (int64_t k = 0; k < K; k++) row[k] = bf16_to_float(a[w * K + k]);
        for (int64_t i = 0; i < n; i++) {
            const float *xi = xf + i * K;
            float sum = 0.f;
            for (int64_t k = 0; k < K; k++) sum += xi[k] * row[k];
            shrink[i * W + w] = sum;
        }
    }
    for (int64_t i = 0; i < n * N; i++) acc[i] = 0.f;
    const uint16_t *b = B + s * R * N;
    for (int64_t j = 0; j < subs; j++) {
        const int64_t first = sub_offsets[j], width = sub_offsets[j + 1] - first;
        for (int64_t r = 0; r < R; r++) {
            int any = 0;
            for (int64_t i = 0; i < n; i++) any |= shrink[i * W + j * R + r] != 0.f;
            if (!any) continue; /* a padding rank */
            const uint16_t *brow = b + R * first + r * width;
            for (int64_t c = 0; c < width; c++) row[c] = bf16_to_float(brow[c]);
            for (int64_t i = 0; i < n; i++) {
                const float coef = shrink[i * W + j * R + r];
                float *acci = acc + i * N + first;
                for (int64_t c = 0; c < width; c++) acci[c] += coef * row[c];
            }
        }
    }
    for (int64_t i = 0; i < n; i++) {
        uint16_t *ot = out + order[i] * out_stride;
        const float *acci = acc + i * N;
        for (int64_t c = 0; c < N; c++) ot[c] = float_to_bf16(bf16_to_float(ot[c]) + acci[c]);
    }
}

int lora_add_bf16(int64_t num, int64_t K, int64_t N, const uint16_t *x, int64_t x_stride,
                  uint16_t *out, int64_t out_stride, const int32_t *order,
                  const int32_t *order_slots, int64_t subs, const int64_t *sub_offsets,
                  int64_t R, const uint16_t *A, const uint16_t *B) {
    if (num <= 0) return 0;
    /* Tiles: runs of up to LORA_TILE consecutive tokens of one slot. */
    int64_t *starts = malloc(sizeof(int64_t) * (num + 1));
    if (starts == NULL) return 2;
    int64_t tiles = 0;
    for (int64_t i = 0; i < num; i++)
        if (i == 0 || order_slots[i] != order_slots[i - 1] || i - starts[tiles - 1] == LORA_TILE)
            starts[tiles++] = i;
    starts[tiles] = num;
    const int64_t W = subs * R;
    const size_t floats = LORA_TILE * (K + W + N) + (K > N ? K : N);
    int failed = 0;
#pragma omp parallel if (num >= PARALLEL_TOKENS)
    {
        float *buf = malloc(sizeof(float) * floats);
        if (buf == NULL) {
#pragma omp atomic write
            failed = 2;
        }
#pragma omp for schedule(static)
        for (int64_t tile = 0; tile < tiles; tile++) {
            if (buf == NULL) continue;
            const int64_t first = starts[tile];
            lora_tile(starts[tile + 1] - first, K, N, x, x_stride, out, out_stride,
                      order + first, order_slots[first], subs, sub_offsets, R, A, B, buf);
        }
        free(buf);
    }
    free(starts);
    return failed;
}

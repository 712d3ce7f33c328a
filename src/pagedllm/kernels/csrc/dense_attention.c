/*
 * Bidirectional attention over dense bfloat16 tensors, for CPUs: a vision tower's image
 * tokens, each attending to every token of its own image (no cache, no mask).
 *
 * q, k, v and out are [B, N, H, D] (a linear layer's output viewed as heads: token-major,
 * the heads of a token side by side). Work items are (image, head, block of
 * DENSE_QUERY_BLOCK query rows), spread over OpenMP threads. An item scores its rows
 * against KEY_TILE keys at a time with isa_attn_key_scores_bf16 (vdpbf16ps on the keys as
 * they lie where the CPU has it), takes exp(s - max) in float32, and sums the values with
 * isa_attn_weighted_sum_rows (each value tile widened to float32 once for the block's rows);
 * each output value is rounded to bfloat16 once. A row's result does not depend on the
 * batch or the threads. torch's scaled_dot_product_attention ran these shapes (197 tokens,
 * 12 heads of 64) at ~140 GFLOP/s on a 2-core AVX-512 BF16 CPU.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "isa.h"
#include "kernels.h"
#include "softmax.h"

#define DENSE_QUERY_BLOCK 16

/* One item: query rows i0 .. i0 + rows - 1 of image b, head h. `work` holds the scores
 * [rows][N], the rows' float32 queries (times scale), accumulators and a value tile. */
static void dense_item(int64_t N, int64_t H, int64_t D, const uint16_t *q, const uint16_t *k,
                       const uint16_t *v, uint16_t *out, float scale, int64_t b, int64_t h,
                       int64_t i0, int64_t rows, float *work, uint16_t *q_rows) {
    float *s = work, *qf = s + DENSE_QUERY_BLOCK * N, *acc = qf + DENSE_QUERY_BLOCK * D;
    float *tile = acc + DENSE_QUERY_BLOCK * D;
    const int64_t token_stride = H * D;
    const uint16_t *qb = q + ((b * N + i0) * H + h) * D;
    const uint16_t *kb = k + (b * N * H + h) * D, *vb = v + (b * N * H + h) * D;
    for (int64_t r = 0; r < rows; r++) /* the block's query rows, D apart */
        for (int64_t j = 0; j < D; j++) {
            q_rows[r * D + j] = qb[r * token_stride + j];
            qf[r * D + j] = bf16_to_float(q_rows[r * D + j]) * scale;
        }
    for (int64_t k0 = 0; k0 < N; k0 += KEY_TILE) {
        const int64_t kt = N - k0 < KEY_TILE ? N - k0 : KEY_TILE;
        const uint16_t *keys[KEY_TILE];
        for (int64_t t = 0; t < kt; t++) keys[t] = kb + (k0 + t) * token_stride;
        isa_attn_key_scores_bf16(q_rows, qf, scale, rows, D, keys, kt, s + k0, N);
    }
    float sums[DENSE_QUERY_BLOCK];
    for (int64_t r = 0; r < rows; r++) {
        float mx;
        sums[r] = exp_minus_max(s + r * N, N, &mx);
    }
    memset(acc, 0, sizeof(float) * (size_t)(rows * D));
    for (int64_t k0 = 0; k0 < N; k0 += KEY_TILE) {
        const int64_t kt = N - k0 < KEY_TILE ? N - k0 : KEY_TILE;
        for (int64_t t = 0; t < kt; t++)
            bf16_row_to_float(tile + t * D, vb + (k0 + t) * token_stride, D);
        isa_attn_weighted_sum_rows(acc, rows, D, s + k0, N, tile, kt);
    }
    for (int64_t r = 0; r < rows; r++) {
        const float inv = 1.f / sums[r];
        uint16_t *o = out + ((b * N + i0 + r) * H + h) * D;
        for (int64_t j = 0; j < D; j++) o[j] = float_to_bf16(acc[r * D + j] * inv);
    }
}

int dense_attention_bf16(int64_t B, int64_t N, int64_t H, int64_t D, const uint16_t *q,
                         const uint16_t *k, const uint16_t *v, uint16_t *out, float scale) {
    const int64_t blocks = (N + DENSE_QUERY_BLOCK - 1) / DENSE_QUERY_BLOCK;
    const int64_t items = B * H * blocks;
    int failed = 0;
    #pragma omp parallel
    {
        float *work = malloc(sizeof(float) *
                             (size_t)(DENSE_QUERY_BLOCK * (N + 2 * D) + KEY_TILE * D));
        uint16_t *q_rows = malloc(sizeof(uint16_t) * (size_t)(DENSE_QUERY_BLOCK * D));
        if (work == NULL || q_rows == NULL) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < items; item++) {
            if (work == NULL || q_rows == NULL) continue;
            const int64_t block = item % blocks, bh = item / blocks;
            const int64_t i0 = block * DENSE_QUERY_BLOCK;
            const int64_t rows = N - i0 < DENSE_QUERY_BLOCK ? N - i0 : DENSE_QUERY_BLOCK;
            dense_item(N, H, D, q, k, v, out, scale, bh / H, bh % H, i0, rows, work, q_rows);
        }
        free(work);
        free(q_rows);
    }
    return failed;
}

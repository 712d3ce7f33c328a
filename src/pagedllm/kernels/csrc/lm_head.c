/*
 * The LM head's greedy tail on CPU: each row's best logits shortlisted from the quantized
 * vocabulary matmul, then recomputed in float32 from the dense bfloat16 weight.
 *
 * A 4-bit (or 8-bit) head ranks the vocabulary closely but not exactly: bfloat16 logits keep
 * 8 significant bits, so near candidates tie or swap. layers/embedding.py therefore takes
 * each row's top k logits and recomputes those k in float32 (x . w over the dense row), which
 * decides as a float32 head would. In torch that tail is a top-k over the whole vocabulary, a
 * gather, a batched matmul and an argmax: a few tenths of a millisecond a step, run right
 * after the matmul has evicted the caches, for what is a few microseconds of work here.
 *
 *   refine_top_bf16:  logits (any source) -> the top k ids and their float32 logits
 *   greedy_head_bf16: the head's matmul, the same refinement, the argmax -> one token a row
 *                     (the logits in the caller's scratch when it gives one),
 *                     or -1 where the row's hidden state holds a NaN or infinity (the
 *                     sampler fails that request; the check here spares it a pass of its own)
 *
 * Ties: the top k keep the lower token id among equal logits and are ordered by logit, then
 * id; the argmax of the refined values keeps the first of equal ones in that order. Rows are
 * independent (a row's result never depends on the others in the call). The float32 dot
 * products sum in a fixed order (16 lanes, then a fixed tree), with fused multiply-adds.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "bf16.h"
#include "kernels.h"

#define SCAN_CHUNK 64
#define DOT_LANES 16
#define PARALLEL_ROWS 4

/* Insert (value, id) into the sorted top list (vals descending, ids ascending among equal
 * values) of `filled` entries out of k; later ids never displace an equal earlier one. */
static void insert_candidate(float value, int64_t id, float *vals, int64_t *ids, int64_t k,
                             int64_t *filled) {
    int64_t at = *filled < k ? *filled : k - 1;
    if (*filled == k && !(value > vals[k - 1])) return;
    while (at > 0 && value > vals[at - 1]) {
        vals[at] = vals[at - 1];
        ids[at] = ids[at - 1];
        at--;
    }
    vals[at] = value;
    ids[at] = id;
    if (*filled < k) (*filled)++;
}

/* The top k of a row's N bfloat16 logits (k <= N). Chunks whose maximum cannot enter the
 * list are skipped after one vectorizable pass over them. */
static void top_candidates(const uint16_t *logits, int64_t N, int64_t k, float *vals,
                           int64_t *ids) {
    int64_t filled = 0;
    for (int64_t j = 0; j < k; j++) { /* valid ids whatever the values (NaN rows) */
        ids[j] = j;
        vals[j] = -FLT_MAX;
    }
    int64_t i = 0;
    for (; i < k; i++) insert_candidate(bf16_to_float(logits[i]), i, vals, ids, k, &filled);
    for (; i < N; i += SCAN_CHUNK) {
        const int64_t end = N - i < SCAN_CHUNK ? N : i + SCAN_CHUNK;
        float best = -FLT_MAX;
        for (int64_t j = i; j < end; j++) {
            const float v = bf16_to_float(logits[j]);
            best = v > best ? v : best;
        }
        if (!(best > vals[k - 1])) continue;
        for (int64_t j = i; j < end; j++)
            insert_candidate(bf16_to_float(logits[j]), j, vals, ids, k, &filled);
    }
}

/* x . w over K values in float32: lane j sums the values j, j + 16, ... with fused
 * multiply-adds, then the lanes are summed pairwise (fixed order). */
static float dot_f32_bf16(const float *x, const uint16_t *w, int64_t K) {
    float lanes[DOT_LANES] = {0.f};
    int64_t i = 0;
    for (; i + DOT_LANES <= K; i += DOT_LANES)
        for (int j = 0; j < DOT_LANES; j++)
            lanes[j] = fmaf(x[i + j], bf16_to_float(w[i + j]), lanes[j]);
    for (int j = 0; i + j < K; j++) lanes[j] = fmaf(x[i + j], bf16_to_float(w[i + j]), lanes[j]);
    for (int width = DOT_LANES / 2; width > 0; width /= 2)
        for (int j = 0; j < width; j++) lanes[j] += lanes[j + width];
    return lanes[0];
}

/* One row: its top k ids and their float32 logits against the dense weight [N, K]; `xf`
 * holds K floats of scratch. */
static void refine_row(const uint16_t *logits, int64_t N, int64_t K, const uint16_t *x,
                       const uint16_t *weight, int64_t k, int64_t *ids, float *exact,
                       float *xf) {
    top_candidates(logits, N, k, exact, ids);
    bf16_row_to_float(xf, x, K);
    for (int64_t c = 0; c < k; c++) exact[c] = dot_f32_bf16(xf, weight + ids[c] * K, K);
}

int refine_top_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *logits,
                    int64_t logits_stride, const uint16_t *x, int64_t x_stride,
                    const uint16_t *weight, int64_t k, int64_t *ids, float *exact) {
    if (k < 1 || k > N) return 1;
    float *xf = malloc(sizeof(float) * (size_t)(K * M));
    if (xf == NULL) return 2;
#pragma omp parallel for if (M >= PARALLEL_ROWS)
    for (int64_t t = 0; t < M; t++)
        refine_row(logits + t * logits_stride, N, K, x + t * x_stride, weight, k, ids + t * k,
                   exact + t * k, xf + t * K);
    free(xf);
    return 0;
}

/* Whether K bfloat16 values are all finite (exponent bits not all ones). */
static int finite_bf16(const uint16_t *x, int64_t K) {
    uint16_t nonfinite = 0;
    for (int64_t j = 0; j < K; j++) nonfinite |= (uint16_t)((x[j] & 0x7F80) == 0x7F80);
    return !nonfinite;
}

int greedy_head_bf16(const StackMatrix *head, int64_t M, int64_t N, int64_t K,
                     const uint16_t *x, int64_t x_stride, const uint16_t *weight, int64_t k,
                     int64_t *tokens, uint16_t *scratch) {
    if (k < 1 || k > N) return 1;
    /* the logits, and a second part's product where the head is split in two: in the
     * caller's scratch when given (a buffer kept across steps: at a 262k vocabulary a
     * 64-row step's logits are 33.5 MB, above glibc's largest mmap threshold, so a malloc
     * per call mapped fresh pages and faulted on every one of them) */
    const int64_t parts = head->parts[1].codes != NULL ? 2 : 1;
    uint16_t *logits = scratch != NULL ? scratch
                                       : malloc(sizeof(uint16_t) * (size_t)(parts * M * N));
    float *exact = malloc(sizeof(float) * (size_t)(M * k));
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)(M * k));
    int failed = logits == NULL || exact == NULL || ids == NULL ? 2 : 0;
    if (!failed) failed = stack_matmul(head, M, N, K, x, x_stride, logits, N, logits + M * N);
    if (!failed) failed = refine_top_bf16(M, N, K, logits, N, x, x_stride, weight, k, ids, exact);
    for (int64_t t = 0; !failed && t < M; t++) {
        int64_t best = 0; /* the first of equal refined values */
        for (int64_t c = 1; c < k; c++)
            if (exact[t * k + c] > exact[t * k + best]) best = c;
        tokens[t] = finite_bf16(x + t * x_stride, K) ? ids[t * k + best] : -1;
    }
    if (logits != scratch) free(logits);
    free(exact);
    free(ids);
    return failed;
}

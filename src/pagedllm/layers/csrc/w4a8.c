/*
 * int4 weights x int8 activations for small CPU steps (decode), with AVX-512 VNNI.
 *
 * Weights: groups of 32 input values per output row, w = d * q + m with q in 0..15 (GGUF
 * Q4_1's own form). Two consecutive groups share 32 bytes: byte i holds q[i] of the first
 * in its low nibble and q[i] of the second in its high nibble, so one load, a mask and a
 * shift give both groups' 32 codes in input order. d and m are float32, [N, 2, groups]:
 * each row's scales, then its minimums.
 *
 * Activations are quantized per token and group of 32 to int8 with their own scale
 * (x ~ dx * xq), as llama.cpp does for its 4-bit dot products. Per group:
 *   sum_i w_i x_i = d dx sum_i q_i xq_i + m dx sum_i xq_i,
 * the first sum one unsigned-by-signed byte dot product instruction. Rows are spread over
 * OpenMP threads in blocks of 4, whose accumulators are independent chains.
 *
 * The int8 variant (w8a8_matmul_bf16, GGUF Q8_0's form w = d * q, q in -127..127) stores
 * q + 128 as 32 unsigned bytes per group and only d ([N, groups]): the minimum is -128 d.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "kernels.h"

#define GROUP 32
#define MAX_TOKENS 16


/* x [M, K] bfloat16 → xq [M, K] int8, dx [M, G] (the step) and c [M, G] (dx * sum xq). */
static void quantize_activations(int64_t M, int64_t K, const uint16_t *x, int64_t x_stride,
                                 int8_t *xq, float *dx, float *c) {
    const int64_t G = K / GROUP;
    for (int64_t t = 0; t < M; t++) {
        for (int64_t g = 0; g < G; g++) {
            const uint16_t *src = x + t * x_stride + g * GROUP;
            float v[GROUP], amax = 0.f;
            for (int i = 0; i < GROUP; i++) {
                v[i] = bf16_to_float(src[i]);
                amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
            }
            const float step = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
            int sum = 0;
            int8_t *q = xq + t * K + g * GROUP;
            for (int i = 0; i < GROUP; i++) {
                q[i] = (int8_t)nearbyintf(v[i] * inv);
                sum += q[i];
            }
            dx[t * G + g] = step;
            c[t * G + g] = step * (float)sum;
        }
    }
}

/* sum_g m[g] * c[g]: the group minimums' share of a row's dot product. */
static inline float min_term(int64_t G, const float *m, const float *c) {
    float total = 0.f;
    for (int64_t g = 0; g < G; g++) total += m[g] * c[g];
    return total;
}

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#include <immintrin.h>

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* R consecutive output rows for one token: the token's codes and steps are loaded once
 * for all R rows, and the R rows' accumulators are independent dependency chains.
 * LOAD_PAIR(row, g, wa, wb) gives the unsigned codes of groups g and g + 1 of a row. */
#define DEFINE_ROWS(NAME, R, ROW_BYTES, LOAD_PAIR, DM_STRIDE, MIN_TERM)                      \
static inline void NAME(int64_t K, const uint8_t *qs, const float *dm, const int8_t *xq,    \
                        const float *dx, const float *c, float *result) {                   \
    const int64_t G = K / GROUP;                                                            \
    const __m256i low = _mm256_set1_epi8(0x0F), zero = _mm256_setzero_si256();             \
    (void)low;                                                                              \
    __m256 acc[R];                                                                          \
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();                               \
    for (int64_t g = 0; g < G; g += 2) {                                                    \
        const __m256i xa = _mm256_loadu_si256((const __m256i *)(xq + g * GROUP));           \
        const __m256i xb = _mm256_loadu_si256((const __m256i *)(xq + (g + 1) * GROUP));     \
        const __m256 sa = _mm256_set1_ps(dx[g]), sb = _mm256_set1_ps(dx[g + 1]);            \
        for (int r = 0; r < R; r++) {                                                       \
            const uint8_t *row = qs + r * (ROW_BYTES);                                      \
            __m256i wa, wb;                                                                 \
            LOAD_PAIR(row, g, wa, wb);                                                      \
            const float *d = dm + r * (DM_STRIDE) + g;                                      \
            const __m256 pa = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(zero, wa, xa));        \
            const __m256 pb = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(zero, wb, xb));        \
            acc[r] = _mm256_fmadd_ps(pa, _mm256_mul_ps(_mm256_set1_ps(d[0]), sa), acc[r]);  \
            acc[r] = _mm256_fmadd_ps(pb, _mm256_mul_ps(_mm256_set1_ps(d[1]), sb), acc[r]);  \
        }                                                                                   \
    }                                                                                       \
    for (int r = 0; r < R; r++)                                                             \
        result[r] = hsum256(acc[r]) + MIN_TERM(G, dm + r * (DM_STRIDE), c);                 \
}

/* int4: two groups' nibbles share 32 bytes. int8: a group's 32 codes are q + 128. */
#define LOAD_PAIR_INT4(row, g, wa, wb)                                                       \
    do { const __m256i p_ = _mm256_loadu_si256((const __m256i *)((row) + (g) * 16));        \
         wa = _mm256_and_si256(p_, low);                                                    \
         wb = _mm256_and_si256(_mm256_srli_epi16(p_, 4), low); } while (0)
#define LOAD_PAIR_INT8(row, g, wa, wb)                                                       \
    do { wa = _mm256_loadu_si256((const __m256i *)((row) + (g) * GROUP));                   \
         wb = _mm256_loadu_si256((const __m256i *)((row) + ((g) + 1) * GROUP)); } while (0)
#else
/* Portable version: the same arithmetic without VNNI. CODE(row, g, i) is code i of group g. */
#define DEFINE_ROWS(NAME, R, ROW_BYTES, CODE, DM_STRIDE, MIN_TERM)                           \
static inline void NAME(int64_t K, const uint8_t *qs, const float *dm, const int8_t *xq,    \
                        const float *dx, const float *c, float *result) {                   \
    const int64_t G = K / GROUP;                                                            \
    for (int r = 0; r < R; r++) {                                                           \
        const uint8_t *row = qs + r * (ROW_BYTES);                                          \
        float total = 0.f;                                                                  \
        for (int64_t g = 0; g < G; g++) {                                                   \
            int dot = 0;                                                                    \
            for (int i = 0; i < GROUP; i++) dot += CODE(row, g, i) * xq[g * GROUP + i];     \
            total += dm[r * (DM_STRIDE) + g] * dx[g] * (float)dot;                          \
        }                                                                                   \
        result[r] = total + MIN_TERM(G, dm + r * (DM_STRIDE), c);                           \
    }                                                                                       \
}
#define LOAD_PAIR_INT4(row, g, i) (((row)[((g) / 2) * 32 + (i)] >> (((g) % 2) * 4)) & 0x0F)
#define LOAD_PAIR_INT8(row, g, i) ((row)[(g) * GROUP + (i)])
#endif
/* int4 rows: scales then minimums per row ([N, 2, G]); int8 rows: scales only ([N, G]),
 * the minimum being -128 * scale (the codes are offset by 128 to be unsigned). */
#define MIN_TERM_INT4(G, dm, c) min_term(G, (dm) + (G), c)
#define MIN_TERM_INT8(G, dm, c) (-128.f * min_term(G, dm, c))
DEFINE_ROWS(rows_dot_4, 4, K / 2, LOAD_PAIR_INT4, 2 * G, MIN_TERM_INT4)
DEFINE_ROWS(rows_dot_1, 1, K / 2, LOAD_PAIR_INT4, 2 * G, MIN_TERM_INT4)
DEFINE_ROWS(rows_dot8_4, 4, K, LOAD_PAIR_INT8, G, MIN_TERM_INT8)
DEFINE_ROWS(rows_dot8_1, 1, K, LOAD_PAIR_INT8, G, MIN_TERM_INT8)

/* out [M, N] bfloat16 (rows out_stride apart) = x [M, K] bfloat16 @ W^T, for one weight
 * format (ROWS4 / ROWS1 its row kernels, ROW_BYTES and DM_STRIDE its row sizes). Returns 1
 * when M is too large or K not a multiple of 64 (the caller must not use the kernel then). */
#define DEFINE_MATMUL(NAME, ROWS4, ROWS1, ROW_BYTES, DM_STRIDE)                              \
int NAME(int64_t M, int64_t N, int64_t K, const uint16_t *x, int64_t x_stride,              \
         const uint8_t *qs, const float *dm, uint16_t *out, int64_t out_stride) {           \
    if (M > MAX_TOKENS || K % (2 * GROUP) != 0) return 1;                                   \
    const int64_t G = K / GROUP;                                                            \
    int8_t *xq = malloc((size_t)(M * K));                                                   \
    float *dx = malloc(sizeof(float) * (size_t)(2 * M * G));                                \
    if (xq == NULL || dx == NULL) { free(xq); free(dx); return 2; }                         \
    float *c = dx + M * G;                                                                  \
    quantize_activations(M, K, x, x_stride, xq, dx, c);                                     \
    const int64_t blocks = (N + 3) / 4;                                                     \
    _Pragma("omp parallel for schedule(static)")                                            \
    for (int64_t b = 0; b < blocks; b++) {                                                  \
        const int64_t n = b * 4, rows = N - n < 4 ? N - n : 4;                              \
        for (int64_t t = 0; t < M; t++) {                                                   \
            float result[4];                                                                \
            const int8_t *xt = xq + t * K;                                                  \
            const float *dxt = dx + t * G, *ct = c + t * G;                                 \
            if (rows == 4) {                                                                \
                ROWS4(K, qs + n * (ROW_BYTES), dm + n * (DM_STRIDE), xt, dxt, ct, result);  \
            } else {                                                                        \
                for (int64_t r = 0; r < rows; r++)                                          \
                    ROWS1(K, qs + (n + r) * (ROW_BYTES), dm + (n + r) * (DM_STRIDE), xt,    \
                          dxt, ct, result + r);                                             \
            }                                                                               \
            for (int64_t r = 0; r < rows; r++)                                              \
                out[t * out_stride + n + r] = float_to_bf16(result[r]);                     \
        }                                                                                   \
    }                                                                                       \
    free(xq);                                                                               \
    free(dx);                                                                               \
    return 0;                                                                               \
}

DEFINE_MATMUL(w4a8_matmul_bf16, rows_dot_4, rows_dot_1, K / 2, 2 * G)
DEFINE_MATMUL(w8a8_matmul_bf16, rows_dot8_4, rows_dot8_1, K, G)

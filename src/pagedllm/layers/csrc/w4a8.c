/*
 * int4 or int8 weights x int8 activations on CPU (AVX-512 VNNI): the matmul of bfloat16
 * models with quantized weights, for steps of any size.
 *
 * Weights are stored in panels of 16 output rows (the 16 lanes of a vector); a panel is a
 * run of groups of 32 input values. The byte dot-product instruction (vpdpbusd) multiplies,
 * in each lane, 4 consecutive unsigned weight bytes by 4 signed activation bytes, so a
 * group's codes are kept as quads: quad j holds inputs 4j..4j+3 of the panel's 16 rows,
 * 64 bytes, lane by lane.
 *  - int4 (GGUF Q4_1's form, w = d * q + m, q in 0..15): 256 bytes per group, 4 blocks of
 *    64 bytes, block b holding quad b in its low nibbles and quad b + 4 in its high ones;
 *    dm [panels, groups, 2, 16] float32: the 16 rows' scales d, then their minimums m.
 *  - int8 (GGUF Q8_0's form, w = d * q, q in -127..127): q + 128 (unsigned) as 8 quads,
 *    512 bytes per group; dm [panels, groups, 16] float32: d only, the minimum is -128 d.
 * Activations are quantized per token and group of 32 to int8 with their own step dx, as
 * llama.cpp does for its 4-bit dot products; c = dx * sum(xq) carries the minimums' share:
 *   sum_i w_i x_i = d dx sum_i q_i xq_i + m c.
 * A tile is up to 8 tokens x one panel: a group's codes are unpacked once for all its tokens,
 * each token's 8 dot products form one chain, and the tokens' chains are independent. The
 * output rows of a token do not depend on the other tokens of the call. OpenMP threads take
 * panels; the last panel may be partly padding (rows beyond N are never stored).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "kernels.h"

#define GROUP 32
#define PANEL 16
#define TILE_TOKENS 8
#define INT4_GROUP_BYTES 256
#define INT8_GROUP_BYTES 512

/* The int8 activations of a call: xq [M, K], and per token and group dx and c [M, G]. */
typedef struct {
    int64_t K, G;
    int8_t *xq;
    float *dx, *c;
} Activations;

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>

/* Token t of x (bfloat16) → its int8 codes and per-group dx and c. */
static void quantize_token(const Activations *a, const uint16_t *x, int64_t t) {
    for (int64_t g = 0; g < a->G; g++) {
        const uint16_t *src = x + g * GROUP;
        const __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)src)), 16));
        const __m512 hi = _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + 16))), 16));
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
        const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
        /* Rounds to nearest even, as nearbyintf does. */
        const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inv));
        const __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inv));
        int8_t *q = a->xq + t * a->K + g * GROUP;
        _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(qlo));
        _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(qhi));
        const float step = amax / 127.f;
        a->dx[t * a->G + g] = step;
        a->c[t * a->G + g] = step * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi));
    }
}

/* 16 float32 → bfloat16 (round to nearest even, as float_to_bf16), the first `lanes` stored. */
static inline void store_bf16(uint16_t *dst, __m512 v, int lanes) {
    __m512i bits = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    bits = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd));
    const __m256i half = _mm512_cvtepi32_epi16(_mm512_srli_epi32(bits, 16));
    if (lanes == PANEL)
        _mm256_storeu_si256((__m256i *)dst, half);
    else
        _mm256_mask_storeu_epi16(dst, (__mmask16)((1u << lanes) - 1), half);
}

/* Tokens t .. t + R - 1 of `a` times one panel (codes, dm) → out rows (16 columns each).
 * R and INT8 are constants at every call site, so each variant is fully unrolled. */
static inline __attribute__((always_inline)) void tile(
    const int R, const int INT8, const Activations *a, int64_t t, const uint8_t *codes,
    const float *dm, uint16_t *out, int64_t out_stride, int lanes) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    const int64_t group_bytes = INT8 ? INT8_GROUP_BYTES : INT4_GROUP_BYTES;
    const int64_t dm_stride = INT8 ? PANEL : 2 * PANEL;
    __m512 acc[TILE_TOKENS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < a->G; g++) {
        const uint8_t *group = codes + g * group_bytes;
        __m512i w[8];
        if (INT8) {
            for (int j = 0; j < 8; j++) w[j] = _mm512_loadu_si512(group + j * 64);
        } else {
            for (int b = 0; b < 4; b++) {
                const __m512i raw = _mm512_loadu_si512(group + b * 64);
                w[b] = _mm512_and_si512(raw, low);
                w[b + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
            }
        }
        const __m512 d = _mm512_loadu_ps(dm + g * dm_stride);
        const __m512 m = INT8 ? _mm512_mul_ps(d, _mm512_set1_ps(-128.f))
                              : _mm512_loadu_ps(dm + g * dm_stride + PANEL);
        for (int r = 0; r < R; r++) {
            const int64_t row = t + r;
            const int32_t *quads = (const int32_t *)(a->xq + row * a->K + g * GROUP);
            __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], _mm512_set1_epi32(quads[0]));
            for (int j = 1; j < 8; j++)
                dot = _mm512_dpbusd_epi32(dot, w[j], _mm512_set1_epi32(quads[j]));
            const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(a->dx[row * a->G + g]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[r]);
            acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(a->c[row * a->G + g]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) store_bf16(out + r * out_stride, acc[r], lanes);
}
#else
/* Portable version: the same layout and arithmetic, one value at a time. */
static void quantize_token(const Activations *a, const uint16_t *x, int64_t t) {
    for (int64_t g = 0; g < a->G; g++) {
        float v[GROUP], amax = 0.f;
        for (int i = 0; i < GROUP; i++) {
            v[i] = bf16_to_float(x[g * GROUP + i]);
            amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
        }
        const float inv = amax > 0.f ? 127.f / amax : 0.f;
        int sum = 0;
        int8_t *q = a->xq + t * a->K + g * GROUP;
        for (int i = 0; i < GROUP; i++) {
            q[i] = (int8_t)nearbyintf(v[i] * inv);
            sum += q[i];
        }
        const float step = amax / 127.f;
        a->dx[t * a->G + g] = step;
        a->c[t * a->G + g] = step * (float)sum;
    }
}

/* Code k (0..31) of lane `lane` in a group's bytes. */
static inline int code_at(int INT8, const uint8_t *group, int lane, int k) {
    if (INT8) return group[(k / 4) * 64 + lane * 4 + k % 4];
    return (group[((k % 16) / 4) * 64 + lane * 4 + k % 4] >> (4 * (k / 16))) & 0x0F;
}

static void tile(const int R, const int INT8, const Activations *a, int64_t t,
                 const uint8_t *codes, const float *dm, uint16_t *out, int64_t out_stride,
                 int lanes) {
    const int64_t group_bytes = INT8 ? INT8_GROUP_BYTES : INT4_GROUP_BYTES;
    const int64_t dm_stride = INT8 ? PANEL : 2 * PANEL;
    for (int r = 0; r < R; r++) {
        const int64_t row = t + r;
        for (int lane = 0; lane < lanes; lane++) {
            float total = 0.f;
            for (int64_t g = 0; g < a->G; g++) {
                const int8_t *xq = a->xq + row * a->K + g * GROUP;
                int dot = 0;
                for (int k = 0; k < GROUP; k++)
                    dot += code_at(INT8, codes + g * group_bytes, lane, k) * xq[k];
                const float d = dm[g * dm_stride + lane];
                const float m = INT8 ? -128.f * d : dm[g * dm_stride + PANEL + lane];
                total += (float)dot * (d * a->dx[row * a->G + g]) + m * a->c[row * a->G + g];
            }
            out[r * out_stride + lane] = float_to_bf16(total);
        }
    }
}
#endif

/* Tokens t .. t + rows - 1 (rows <= TILE_TOKENS) times one panel, dispatched to the tile
 * variant for that many tokens. */
static void panel_tokens(int INT8, const Activations *a, int64_t t, int rows,
                         const uint8_t *codes, const float *dm, uint16_t *out,
                         int64_t out_stride, int lanes) {
#define TILE_CASE(R)                                                                         \
    case R:                                                                                  \
        if (INT8) tile(R, 1, a, t, codes, dm, out, out_stride, lanes);                       \
        else tile(R, 0, a, t, codes, dm, out, out_stride, lanes);                            \
        break;
    switch (rows) {
        TILE_CASE(8) TILE_CASE(7) TILE_CASE(6) TILE_CASE(5)
        TILE_CASE(4) TILE_CASE(3) TILE_CASE(2) TILE_CASE(1)
    }
#undef TILE_CASE
}

/* out [M, N] bfloat16 (rows out_stride apart) = x [M, K] bfloat16 (rows x_stride apart) @ W^T
 * for W in either layout. Returns 1 when K is not a multiple of 32, 2 when out of memory. */
static int byte_dot_matmul(int INT8, int64_t M, int64_t N, int64_t K, const uint16_t *x,
                           int64_t x_stride, const uint8_t *codes, const float *dm,
                           uint16_t *out, int64_t out_stride) {
    if (K % GROUP != 0) return 1;
    const int64_t G = K / GROUP, panels = (N + PANEL - 1) / PANEL;
    const int64_t group_bytes = INT8 ? INT8_GROUP_BYTES : INT4_GROUP_BYTES;
    const int64_t dm_stride = INT8 ? PANEL : 2 * PANEL;
    Activations a = {K, G, malloc((size_t)(M * K)), malloc(sizeof(float) * (size_t)(2 * M * G)), NULL};
    if (a.xq == NULL || a.dx == NULL) { free(a.xq); free(a.dx); return 2; }
    a.c = a.dx + M * G;
    #pragma omp parallel
    {
        #pragma omp for schedule(static)
        for (int64_t t = 0; t < M; t++) quantize_token(&a, x + t * x_stride, t);
        #pragma omp for schedule(static)
        for (int64_t p = 0; p < panels; p++) {
            const int lanes = N - p * PANEL < PANEL ? (int)(N - p * PANEL) : PANEL;
            for (int64_t t = 0; t < M; t += TILE_TOKENS) {
                const int rows = M - t < TILE_TOKENS ? (int)(M - t) : TILE_TOKENS;
                panel_tokens(INT8, &a, t, rows, codes + p * G * group_bytes, dm + p * G * dm_stride,
                             out + t * out_stride + p * PANEL, out_stride, lanes);
            }
        }
    }
    free(a.xq);
    free(a.dx);
    return 0;
}

int w4a8_matmul_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *x, int64_t x_stride,
                     const uint8_t *qs, const float *dm, uint16_t *out, int64_t out_stride) {
    return byte_dot_matmul(0, M, N, K, x, x_stride, qs, dm, out, out_stride);
}

int w8a8_matmul_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *x, int64_t x_stride,
                     const uint8_t *qs, const float *dm, uint16_t *out, int64_t out_stride) {
    return byte_dot_matmul(1, M, N, K, x, x_stride, qs, dm, out, out_stride);
}

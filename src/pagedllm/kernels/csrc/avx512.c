/*
 * isa.h on AVX-512 (F, BW, VL, DQ) with VNNI: a panel's 16 output rows are the 16 lanes of
 * one vector, and vpdpbusd multiplies 4 unsigned weight bytes by 4 signed activation bytes
 * per lane, 64 multiply-adds per instruction. A tile is up to 8 tokens: a group's codes are
 * unpacked once into 8 registers for all of them; a token's dot products are one chain of 8
 * (int8) or two of 4, one per half-group with its own activation scale (int4).
 * bfloat16 weights: vdpbf16ps when built with AVX-512 BF16 (the avx512_bf16 variant), else
 * its two fused multiply-adds per pair, the pair's halves widened to float32 by shifts.
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "avx512_bf16_store.h"
#include "bf16.h"
#include "isa.h"

#if defined(ISA_AMX_BF16)
const char ISA_NAME[] = "amx_bf16"; /* avx512_bf16 + dense bf16 matmuls on AMX (amx_bf16.c) */
/* 24 accumulators, 3 weight vectors and the broadcast activation pair: 28 registers */
const int ISA_BF16_TOKENS = 8, ISA_BF16_PANELS = 3;
#elif defined(__AVX512BF16__)
const char ISA_NAME[] = "avx512_bf16";
/* 24 accumulators, 3 weight vectors and the broadcast activation pair: 28 registers */
const int ISA_BF16_TOKENS = 8, ISA_BF16_PANELS = 3;
#else
const char ISA_NAME[] = "avx512";
/* 12 accumulators, each panel's odd and even halves, the activation's: 20 registers */
const int ISA_BF16_TOKENS = 4, ISA_BF16_PANELS = 3;
#endif
const int ISA_TILE_TOKENS = 8;
_Static_assert(Q8_BLOCK_TOKENS % 8 == 0, "a tile's tokens lie in one block (isa.h)");

static inline int32_t load_i32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __m512 load_bf16x16(const uint16_t *p) {
    const __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

void isa_quantize_q8_bf16(const Q8Activations *a, const uint16_t *x, int64_t t, int halves) {
    for (int64_t g = 0; g < a->G; g++) {
        const __m512 v[2] = {load_bf16x16(x + g * Q8_GROUP), load_bf16x16(x + g * Q8_GROUP + 16)};
        float amax[2] = {_mm512_reduce_max_ps(_mm512_abs_ps(v[0])),
                         _mm512_reduce_max_ps(_mm512_abs_ps(v[1]))};
        q8_share_amax(amax, halves);
        int32_t sums[2];
        for (int h = 0; h < 2; h++) { /* one vector per half-group of 16 */
            const __m512 inv = _mm512_set1_ps(q8_inverse_step(amax[h]));
            /* Rounds half to even (the default MXCSR mode), as nearbyintf does. */
            const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(v[h], inv));
            _mm_storeu_si128((__m128i *)(a->xq + q8_entry(a, t, g) * Q8_GROUP + h * Q8_HALF),
                             _mm512_cvtepi32_epi8(q));
            sums[h] = _mm512_reduce_add_epi32(q);
        }
        q8_record_group(a, t, g, amax, sums, halves);
    }
}

/* 16 scales at dm + i, float16 or float32 by the format (the conversion is exact). */
static inline __m512 load_scales(const int FMT, const void *dm, int64_t i) {
    if (FMT_HALF_SCALES(FMT))
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)dm + i)));
    return _mm512_loadu_ps((const float *)dm + i);
}

/* R and FMT are constants at every call site, so each variant is fully unrolled. */
static inline __attribute__((always_inline)) void tile(
    const int R, const int FMT, const Q8Activations *a, int64_t t, const uint8_t *codes,
    const void *dm, uint16_t *out, int64_t out_stride, int lanes) {
    const int INT8 = FMT == FMT_INT8, IMPLIED_MIN = FMT_DM_STRIDE(FMT) == PANEL_ROWS;
    const __m512i low = _mm512_set1_epi8(0x0F);
    const int64_t group_bytes = INT8 ? 512 : 256, dm_stride = FMT_DM_STRIDE(FMT);
    __m512 acc[MAX_TILE_TOKENS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    /* token r's group g is entry first + 8 g + r: the tile lies in one block (isa.h) */
    const int64_t first = q8_entry(a, t, 0);
    for (int64_t g = 0; g < a->G; g++) {
        const uint8_t *group = codes + g * group_bytes;
        if (t == 0) stream_ahead(group, group_bytes);
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
        const __m512 d = load_scales(FMT, dm, g * dm_stride);
        const __m512 m = IMPLIED_MIN ? _mm512_mul_ps(d, _mm512_set1_ps(FMT_MIN_FACTOR(FMT)))
                                     : load_scales(FMT, dm, g * dm_stride + PANEL_ROWS);
        _Pragma("GCC unroll 8") /* gcc kept the accumulators in memory, not registers */
        for (int r = 0; r < R; r++) {
            const int64_t e = first + g * Q8_BLOCK_TOKENS + r;
            const int8_t *xq = a->xq + e * Q8_GROUP;
            const float *dx = a->dx + e * 2;
            if (INT8) { /* one activation scale per group: one chain of 8 */
                __m512i dot = _mm512_setzero_si512();
                for (int j = 0; j < 8; j++)
                    dot = _mm512_dpbusd_epi32(dot, w[j], _mm512_set1_epi32(load_i32(xq + 4 * j)));
                const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(dx[0]));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[r]);
            } else { /* a scale per half-group: quads 0-3 are the first 16 inputs */
                __m512i dot0 = _mm512_setzero_si512(), dot1 = _mm512_setzero_si512();
                for (int j = 0; j < 4; j++) {
                    dot0 = _mm512_dpbusd_epi32(dot0, w[j], _mm512_set1_epi32(load_i32(xq + 4 * j)));
                    dot1 = _mm512_dpbusd_epi32(dot1, w[j + 4],
                                               _mm512_set1_epi32(load_i32(xq + 16 + 4 * j)));
                }
                const __m512 scale0 = _mm512_mul_ps(d, _mm512_set1_ps(dx[0]));
                const __m512 scale1 = _mm512_mul_ps(d, _mm512_set1_ps(dx[1]));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot0), scale0, acc[r]);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot1), scale1, acc[r]);
            }
            acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(a->c[e]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) store_bf16x16(out + r * out_stride, acc[r], lanes);
}

void isa_byte_dot_tile(int format, const Q8Activations *a, int64_t t, int rows,
                       const uint8_t *codes, const void *dm, uint16_t *out,
                       int64_t out_stride, int lanes) {
    switch (rows) {
        ISA_TILE_CASE(8) ISA_TILE_CASE(7) ISA_TILE_CASE(6) ISA_TILE_CASE(5)
        ISA_TILE_CASE(4) ISA_TILE_CASE(3) ISA_TILE_CASE(2) ISA_TILE_CASE(1)
    }
}

/* Four query rows share each load of the transposed tile: four independent fma chains. */
void isa_attn_scores_4(const float *q, int64_t D, const float *tile_t, float *s,
                       int64_t s_stride) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t j = 0; j < D; j++) {
        const __m512 k = _mm512_loadu_ps(tile_t + j * KEY_TILE);
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(q[j]), k, a0);
        a1 = _mm512_fmadd_ps(_mm512_set1_ps(q[D + j]), k, a1);
        a2 = _mm512_fmadd_ps(_mm512_set1_ps(q[2 * D + j]), k, a2);
        a3 = _mm512_fmadd_ps(_mm512_set1_ps(q[3 * D + j]), k, a3);
    }
    _mm512_storeu_ps(s, a0);
    _mm512_storeu_ps(s + s_stride, a1);
    _mm512_storeu_ps(s + 2 * s_stride, a2);
    _mm512_storeu_ps(s + 3 * s_stride, a3);
}

void isa_attn_weighted_sum(float *acc, int64_t D, const float *w, const float *tile, int64_t n) {
    int64_t j = 0;
    for (; j + 16 <= D; j += 64) { /* up to 64 values in four registers at a time */
        const int vectors = (int)((D - j) / 16 < 4 ? (D - j) / 16 : 4);
        __m512 a[4];
        for (int v = 0; v < vectors; v++) a[v] = _mm512_loadu_ps(acc + j + 16 * v);
        for (int64_t t = 0; t < n; t++) {
            const __m512 wt = _mm512_set1_ps(w[t]);
            for (int v = 0; v < vectors; v++)
                a[v] = _mm512_fmadd_ps(wt, _mm512_loadu_ps(tile + t * D + j + 16 * v), a[v]);
        }
        for (int v = 0; v < vectors; v++) _mm512_storeu_ps(acc + j + 16 * v, a[v]);
        if (vectors < 4) { j += 16 * vectors; break; }
    }
    for (; j < D; j++) /* a tail of fewer than 16 values */
        for (int64_t t = 0; t < n; t++) acc[j] = fmaf(w[t], tile[t * D + j], acc[j]);
}

/* One vector of 16 partial sums of q . k (lane l: the products at j = l mod 16, in j
 * order); a tail shorter than 16 is masked. */
static inline __attribute__((always_inline)) __m512 dot_partials(const float *q,
                                                                 const float *k, int64_t D) {
    __m512 a = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= D; j += 16)
        a = _mm512_fmadd_ps(_mm512_loadu_ps(q + j), _mm512_loadu_ps(k + j), a);
    if (j < D) {
        const __mmask16 m = (__mmask16)((1u << (D - j)) - 1);
        a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + j), _mm512_maskz_loadu_ps(m, k + j), a);
    }
    return a;
}

/* Lane t of the result is the sum of v[t]'s 16 lanes: four rounds of shuffles and adds
 * halve the vectors each time (46 instructions for 16 sums, against 16 horizontal sums of
 * about 8 each), then one permutation puts the sums in order. */
static inline __m512 sum_lanes_16(const __m512 v[16]) {
    __m512 a[8], b[4], c[2];
    for (int i = 0; i < 8; i++) /* 256-bit halves: v[i]'s 8 partials | v[i + 8]'s */
        a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[i], v[i + 8], 0x44),
                             _mm512_shuffle_f32x4(v[i], v[i + 8], 0xEE));
    for (int i = 0; i < 4; i++) /* 128-bit lanes: v[i], v[i + 8], v[i + 4], v[i + 12] */
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[i], a[i + 4], 0x88),
                             _mm512_shuffle_f32x4(a[i], a[i + 4], 0xDD));
    for (int i = 0; i < 2; i++) /* each lane: two partials of two vectors, interleaved */
        c[i] = _mm512_add_ps(_mm512_unpacklo_ps(b[i], b[i + 2]),
                             _mm512_unpackhi_ps(b[i], b[i + 2]));
    const __m512 d = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x44),
                                   _mm512_shuffle_ps(c[0], c[1], 0xEE));
    /* d holds v0 v2 v1 v3 | v8 v10 v9 v11 | v4 v6 v5 v7 | v12 v14 v13 v15 */
    const __m512i order = _mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15);
    return _mm512_permutexvar_ps(order, d);
}

static inline __attribute__((always_inline)) void key_scores(const float *q, int64_t rows,
                                                             int64_t D, const float *tile,
                                                             int64_t kt, float *s,
                                                             int64_t s_stride) {
    const __mmask16 keep = (__mmask16)((1u << kt) - 1);
    for (int64_t r = 0; r < rows; r++) {
        __m512 v[16];
        for (int t = 0; t < 16; t++)
            v[t] = t < kt ? dot_partials(q + r * D, tile + t * D, D) : _mm512_setzero_ps();
        _mm512_mask_storeu_ps(s + r * s_stride, keep, sum_lanes_16(v));
    }
}

void isa_attn_key_scores(const float *q, int64_t rows, int64_t D, const float *tile,
                         int64_t kt, float *s, int64_t s_stride) {
    /* a constant D unrolls the products: at 64, q's 4 vectors stay in registers */
    if (D == 64) key_scores(q, rows, 64, tile, kt, s, s_stride);
    else if (D == 128) key_scores(q, rows, 128, tile, kt, s, s_stride);
    else key_scores(q, rows, D, tile, kt, s, s_stride);
}

void isa_int8_row_to_float(float *dst, const int8_t *row, int64_t D) {
    for (int64_t g = 0; g < D / 16; g++) {
        float scale;
        memcpy(&scale, row + D + 4 * g, sizeof scale);
        const __m512i codes = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row + 16 * g)));
        _mm512_storeu_ps(dst + 16 * g,
                         _mm512_mul_ps(_mm512_cvtepi32_ps(codes), _mm512_set1_ps(scale)));
    }
}

/* R rows' V vectors of output values (acc rows D apart, tile rows D apart, w rows w_stride
 * apart): the accumulators stay in registers over the n keys and each key's values are
 * loaded once for all R rows. */
static inline __attribute__((always_inline)) void weighted_sum_block(
        int R, int V, float *acc, int64_t D, const float *w, int64_t w_stride,
        const float *tile, int64_t n) {
    __m512 a[4][4];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < V; v++) a[r][v] = _mm512_loadu_ps(acc + r * D + 16 * v);
    for (int64_t t = 0; t < n; t++) {
        __m512 k[4];
        for (int v = 0; v < V; v++) k[v] = _mm512_loadu_ps(tile + t * D + 16 * v);
        for (int r = 0; r < R; r++) {
            const __m512 wt = _mm512_set1_ps(w[r * w_stride + t]);
            for (int v = 0; v < V; v++) a[r][v] = _mm512_fmadd_ps(wt, k[v], a[r][v]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < V; v++) _mm512_storeu_ps(acc + r * D + 16 * v, a[r][v]);
}

void isa_attn_weighted_sum_rows(float *acc, int64_t rows, int64_t D, const float *w,
                                int64_t w_stride, const float *tile, int64_t n) {
    for (int64_t r0 = 0; r0 < rows; r0 += 4) {
        const int R = rows - r0 < 4 ? (int)(rows - r0) : 4;
        float *a = acc + r0 * D;
        const float *wr = w + r0 * w_stride;
        int64_t j = 0;
        for (; j + 64 <= D; j += 64) /* 4 rows x 4 vectors: 16 accumulators */
            switch (R) {
            case 4: weighted_sum_block(4, 4, a + j, D, wr, w_stride, tile + j, n); break;
            case 3: weighted_sum_block(3, 4, a + j, D, wr, w_stride, tile + j, n); break;
            case 2: weighted_sum_block(2, 4, a + j, D, wr, w_stride, tile + j, n); break;
            default: weighted_sum_block(1, 4, a + j, D, wr, w_stride, tile + j, n);
            }
        for (; j + 16 <= D; j += 16) weighted_sum_block(R, 1, a + j, D, wr, w_stride, tile + j, n);
        for (int r = 0; r < R; r++) /* a tail of fewer than 16 values */
            for (int64_t jj = j; jj < D; jj++)
                for (int64_t t = 0; t < n; t++)
                    a[r * D + jj] = fmaf(wr[r * w_stride + t], tile[t * D + jj], a[r * D + jj]);
    }
}

#if defined(__AVX512BF16__)
/* Query row q's scores against up to 16 bfloat16 keys: one vector of partial sums per key
 * (vdpbf16ps over pairs, 32 values an instruction, the tail masked), summed across. */
static inline __attribute__((always_inline)) __m512 bf16_key_scores_row(
        const uint16_t *q, int64_t D, const uint16_t *const *keys, int64_t kt) {
    __m512 v[16];
    for (int t = 0; t < 16; t++) {
        __m512 a = _mm512_setzero_ps();
        if (t < kt)
            for (int64_t j = 0; j < D; j += 32) {
                const __mmask32 m = D - j >= 32 ? (__mmask32)0xFFFFFFFFu
                                                : (__mmask32)((1u << (D - j)) - 1);
                a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_maskz_loadu_epi16(m, q + j),
                                     (__m512bh)_mm512_maskz_loadu_epi16(m, keys[t] + j));
            }
        v[t] = a;
    }
    return sum_lanes_16(v);
}

static inline __attribute__((always_inline)) void bf16_key_scores(
        const uint16_t *q, float scale, int64_t rows, int64_t D, const uint16_t *const *keys,
        int64_t kt, float *s, int64_t s_stride) {
    const __mmask16 keep = (__mmask16)((1u << kt) - 1);
    const __m512 sc = _mm512_set1_ps(scale);
    for (int64_t r = 0; r < rows; r++)
        _mm512_mask_storeu_ps(s + r * s_stride, keep,
                              _mm512_mul_ps(bf16_key_scores_row(q + r * D, D, keys, kt), sc));
}

void isa_attn_key_scores_bf16(const uint16_t *q, const float *qf, float scale, int64_t rows,
                              int64_t D, const uint16_t *const *keys, int64_t kt, float *s,
                              int64_t s_stride) {
    (void)qf;
    if (D == 64) bf16_key_scores(q, scale, rows, 64, keys, kt, s, s_stride);
    else if (D == 128) bf16_key_scores(q, scale, rows, 128, keys, kt, s, s_stride);
    else bf16_key_scores(q, scale, rows, D, keys, kt, s, s_stride);
}
#else
ISA_KEY_SCORES_BF16_THROUGH_A_TILE
#endif

/* A pair of bfloat16 values per 32-bit lane: the odd (high) and even (low) one as float32. */
static inline __m512 odd_bf16(__m512i pairs) {
    return _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32((int)0xFFFF0000u)));
}
static inline __m512 even_bf16(__m512i pairs) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
}

/* P panels x R tokens (constants at every call site: fully unrolled). */
static inline __attribute__((always_inline)) void bf16_tile(
    const int P, const int R, const uint16_t *x, int64_t x_stride, const uint16_t *panels,
    int64_t K, uint16_t *out, int64_t out_stride, int lanes) {
    __m512 acc[MAX_BF16_PANELS][MAX_BF16_TOKENS];
    for (int p = 0; p < P; p++)
        for (int r = 0; r < R; r++) acc[p][r] = _mm512_setzero_ps();
    const int64_t panel_size = K * PANEL_ROWS;
    for (int64_t j = 0; j < K / 2; j++) {
        __m512i w[MAX_BF16_PANELS];
        for (int p = 0; p < P; p++)
            w[p] = _mm512_loadu_si512(panels + p * panel_size + j * 2 * PANEL_ROWS);
#if defined(__AVX512BF16__)
        for (int r = 0; r < R; r++) {
            const __m512bh pair =
                (__m512bh)_mm512_set1_epi32((int)bf16_pair(x + r * x_stride + 2 * j));
            for (int p = 0; p < P; p++)
                acc[p][r] = _mm512_dpbf16_ps(acc[p][r], (__m512bh)w[p], pair);
        }
#else
        __m512 odd[MAX_BF16_PANELS], even[MAX_BF16_PANELS];
        for (int p = 0; p < P; p++) {
            odd[p] = odd_bf16(w[p]);
            even[p] = even_bf16(w[p]);
        }
        for (int r = 0; r < R; r++) {
            const __m512i pair = _mm512_set1_epi32((int)bf16_pair(x + r * x_stride + 2 * j));
            const __m512 x_odd = odd_bf16(pair), x_even = even_bf16(pair);
            for (int p = 0; p < P; p++) {
                acc[p][r] = _mm512_fmadd_ps(odd[p], x_odd, acc[p][r]);
                acc[p][r] = _mm512_fmadd_ps(even[p], x_even, acc[p][r]);
            }
        }
#endif
    }
    for (int p = 0; p < P; p++)
        for (int r = 0; r < R; r++)
            store_bf16x16(out + r * out_stride + p * PANEL_ROWS, acc[p][r],
                          p == P - 1 ? lanes : PANEL_ROWS);
}

void isa_bf16_tile(const uint16_t *x, int64_t x_stride, int rows, const uint16_t *panels,
                   int count, int64_t K, uint16_t *out, int64_t out_stride, int lanes) {
#if defined(__AVX512BF16__)
    ISA_BF16_ROWS_8(3) ISA_BF16_ROWS_8(2) ISA_BF16_ROWS_8(1)
#else
    ISA_BF16_ROWS_4(3) ISA_BF16_ROWS_4(2) ISA_BF16_ROWS_4(1)
#endif
    abort(); /* a tile larger than this ISA declares: bf16_matmul.c never asks for one */
}

/*
 * isa.h on AVX2 + FMA, with or without AVX-VNNI (built with -mavxvnni when the CPU has it).
 *
 * A 16-row panel is two halves of 8 rows, one 256-bit vector of int32 lanes each; a quad of a
 * group (4 input bytes per row) is 32 bytes per half. The integer dot products per lane:
 *  - AVX-VNNI: vpdpbusd, as on AVX-512 (unsigned weight bytes x signed activations).
 *  - Otherwise vpmaddubsw (u8 x s8 pairs summed to int16, saturating) and vpmaddwd against
 *    ones (int16 pairs to int32). int4 codes are at most 15, so 8 quads of pair sums stay
 *    within int16 (8 x 2 x 15 x 127 = 30480) and one vpmaddwd per half-group suffices. int8
 *    codes (q + 128) would saturate, so they are made signed (q) and multiplied as |q| x
 *    (x with q's sign) (at most 2 x 127 x 127 per pair); the dot of q + 128 is then that
 *    sum plus 128 x sum(x), exactly.
 * A tile is 4 tokens with AVX-VNNI, 2 without (16 vector registers hold a token's pair sums,
 * dot sums and accumulator, the codes and the scales).
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "isa.h"

#if defined(__AVXVNNI__)
const char ISA_NAME[] = "avx2_vnni";
#else
const char ISA_NAME[] = "avx2";
#endif
/* Tokens per tile: without VNNI each token keeps two int16 pair sums besides its dot sums
 * and accumulator, and a third token already spills registers (measured: 40% slower). */
/* bfloat16 tiles: one panel (two vectors of 8 rows) x 4 tokens, 8 accumulators */
const int ISA_BF16_TOKENS = 4, ISA_BF16_PANELS = 1;
#if defined(__AVXVNNI__)
const int ISA_TILE_TOKENS = 4;
_Static_assert(Q8_BLOCK_TOKENS % 4 == 0, "a tile's tokens lie in one block (isa.h)");
#else
const int ISA_TILE_TOKENS = 2;
_Static_assert(Q8_BLOCK_TOKENS % 2 == 0, "a tile's tokens lie in one block (isa.h)");
#endif

static inline int32_t load_i32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __m256 load_bf16x8(const uint16_t *p) {
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

static inline int32_t hsum8_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

void isa_quantize_q8_bf16(const Q8Activations *a, const uint16_t *x, int64_t t, int halves) {
    const __m256 sign = _mm256_set1_ps(-0.f);
    for (int64_t g = 0; g < a->G; g++) {
        __m256 v[4];
        float amax[2];
        for (int h = 0; h < 2; h++) { /* two vectors per half-group of 16 */
            v[2 * h] = load_bf16x8(x + g * Q8_GROUP + h * Q8_HALF);
            v[2 * h + 1] = load_bf16x8(x + g * Q8_GROUP + h * Q8_HALF + 8);
            amax[h] = hmax8(_mm256_max_ps(_mm256_andnot_ps(sign, v[2 * h]),
                                          _mm256_andnot_ps(sign, v[2 * h + 1])));
        }
        q8_share_amax(amax, halves);
        __m256i q[4];
        int32_t sums[2];
        for (int h = 0; h < 2; h++) {
            const __m256 inv = _mm256_set1_ps(q8_inverse_step(amax[h]));
            q[2 * h] = _mm256_cvtps_epi32(_mm256_mul_ps(v[2 * h], inv));
            q[2 * h + 1] = _mm256_cvtps_epi32(_mm256_mul_ps(v[2 * h + 1], inv));
            sums[h] = hsum8_epi32(_mm256_add_epi32(q[2 * h], q[2 * h + 1]));
        }
        /* Narrow to bytes: the packs work per 128-bit lane, the permute restores the order. */
        const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                                 _mm256_packs_epi32(q[2], q[3]));
        const __m256i ordered =
            _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(a->xq + q8_entry(a, t, g) * Q8_GROUP), ordered);
        q8_record_group(a, t, g, amax, sums, halves);
    }
}

/* 8 float32 → bfloat16 (round to nearest even), the first `lanes` stored; NaNs as in
 * avx512_bf16_store.h's store_bf16x16. */
static inline void store_bf16x8(uint16_t *dst, __m256 v, int lanes) {
    __m256i bits = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    bits = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd));
    bits = _mm256_srli_epi32(bits, 16);
    const __m128i half =
        _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
    if (lanes == 8) {
        _mm_storeu_si128((__m128i *)dst, half);
    } else {
        uint16_t tmp[8];
        _mm_storeu_si128((__m128i *)tmp, half);
        memcpy(dst, tmp, sizeof(uint16_t) * (size_t)lanes);
    }
}

#if defined(__AVXVNNI__)
#define DOT_ADD(acc, w, x) _mm256_dpbusd_avx_epi32((acc), (w), (x))
#endif

/* The int32 dot products of R tokens with one half-panel's group (8 rows x 32 inputs): int4,
 * per half-group: dot0 over the first 16 inputs (quads 0-3), dot1 over the last 16; int8,
 * over the whole group in dot0 (one activation scale). sums[2 r + h] is token r's code sum
 * over half-group h. */
static inline __attribute__((always_inline)) void group_dots(
    const int R, const int INT8, const uint8_t *group, int half, const int8_t *const *xq,
    const int32_t *sums, __m256i *dot0, __m256i *dot1) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int r = 0; r < R; r++) dot0[r] = dot1[r] = _mm256_setzero_si256();
#if defined(__AVXVNNI__)
    (void)sums;
    for (int b = 0; b < 4; b++) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(group + b * 64 + half * 32));
        const __m256i first = INT8 ? raw : _mm256_and_si256(raw, low);
        const __m256i second = INT8
            ? _mm256_loadu_si256((const __m256i *)(group + (b + 4) * 64 + half * 32))
            : _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
        __m256i *second_dot = INT8 ? dot0 : dot1;
        for (int r = 0; r < R; r++) {
            dot0[r] = DOT_ADD(dot0[r], first, _mm256_set1_epi32(load_i32(xq[r] + 4 * b)));
            second_dot[r] = DOT_ADD(second_dot[r], second,
                                    _mm256_set1_epi32(load_i32(xq[r] + 16 + 4 * b)));
        }
    }
#else
    const __m256i ones = _mm256_set1_epi16(1);
    if (INT8) {
        const __m256i flip = _mm256_set1_epi8((char)0x80);
        for (int j = 0; j < 8; j++) {
            const __m256i q = _mm256_xor_si256(
                _mm256_loadu_si256((const __m256i *)(group + j * 64 + half * 32)), flip);
            const __m256i magnitude = _mm256_sign_epi8(q, q);
            for (int r = 0; r < R; r++) {
                const __m256i x = _mm256_sign_epi8(_mm256_set1_epi32(load_i32(xq[r] + 4 * j)), q);
                dot0[r] = _mm256_add_epi32(
                    dot0[r], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, x), ones));
            }
        }
        for (int r = 0; r < R; r++) /* the codes' +128 offset, added back exactly */
            dot0[r] = _mm256_add_epi32(dot0[r],
                                       _mm256_set1_epi32(128 * (sums[2 * r] + sums[2 * r + 1])));
    } else {
        __m256i pairs0[MAX_TILE_TOKENS], pairs1[MAX_TILE_TOKENS];
        for (int r = 0; r < R; r++) pairs0[r] = pairs1[r] = _mm256_setzero_si256();
        for (int b = 0; b < 4; b++) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(group + b * 64 + half * 32));
            const __m256i lo = _mm256_and_si256(raw, low);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
            for (int r = 0; r < R; r++) {
                const __m256i xlo = _mm256_set1_epi32(load_i32(xq[r] + 4 * b));
                const __m256i xhi = _mm256_set1_epi32(load_i32(xq[r] + 4 * b + 16));
                pairs0[r] = _mm256_add_epi16(pairs0[r], _mm256_maddubs_epi16(lo, xlo));
                pairs1[r] = _mm256_add_epi16(pairs1[r], _mm256_maddubs_epi16(hi, xhi));
            }
        }
        for (int r = 0; r < R; r++) {
            dot0[r] = _mm256_madd_epi16(pairs0[r], ones);
            dot1[r] = _mm256_madd_epi16(pairs1[r], ones);
        }
    }
#endif
}

/* 8 scales at dm + i, float16 or float32 by the format (the conversion is exact). */
static inline __m256 load_scales(const int FMT, const void *dm, int64_t i) {
    if (FMT_HALF_SCALES(FMT))
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)dm + i)));
    return _mm256_loadu_ps((const float *)dm + i);
}

/* Tokens t .. t + R - 1 times rows 8 * half .. 8 * half + 7 of a panel. */
static inline __attribute__((always_inline)) void half_tile(
    const int R, const int FMT, const Q8Activations *a, int64_t t, const uint8_t *codes,
    const void *dm, uint16_t *out, int64_t out_stride, int lanes, int half) {
    const int INT8 = FMT == FMT_INT8, IMPLIED_MIN = FMT_DM_STRIDE(FMT) == PANEL_ROWS;
    const int64_t group_bytes = INT8 ? 512 : 256, dm_stride = FMT_DM_STRIDE(FMT);
    __m256 acc[MAX_TILE_TOKENS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    /* token r's group g is entry first + 8 g + r: the tile lies in one block (isa.h) */
    const int64_t first = q8_entry(a, t, 0);
    for (int64_t g = 0; g < a->G; g++) {
        const int8_t *xq[MAX_TILE_TOKENS];
        int32_t sums[2 * MAX_TILE_TOKENS];
        for (int r = 0; r < R; r++) {
            const int64_t e = first + g * Q8_BLOCK_TOKENS + r;
            xq[r] = a->xq + e * Q8_GROUP;
            sums[2 * r] = a->sums[e * 2];
            sums[2 * r + 1] = a->sums[e * 2 + 1];
        }
        /* the first half reads the panel from memory; the second finds it in L1 */
        if (t == 0 && half == 0) stream_ahead(codes + g * group_bytes, group_bytes);
        __m256i dot0[MAX_TILE_TOKENS], dot1[MAX_TILE_TOKENS];
        group_dots(R, INT8, codes + g * group_bytes, half, xq, sums, dot0, dot1);
        const __m256 d = load_scales(FMT, dm, g * dm_stride + 8 * half);
        const __m256 m = IMPLIED_MIN
                             ? _mm256_mul_ps(d, _mm256_set1_ps(FMT_MIN_FACTOR(FMT)))
                             : load_scales(FMT, dm, g * dm_stride + PANEL_ROWS + 8 * half);
        for (int r = 0; r < R; r++) {
            const int64_t e = first + g * Q8_BLOCK_TOKENS + r;
            const float *dx = a->dx + e * 2;
            const __m256 scale0 = _mm256_mul_ps(d, _mm256_set1_ps(dx[0]));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot0[r]), scale0, acc[r]);
            if (!INT8) {
                const __m256 scale1 = _mm256_mul_ps(d, _mm256_set1_ps(dx[1]));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot1[r]), scale1, acc[r]);
            }
            acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(a->c[e]), acc[r]);
        }
    }
    const int half_lanes = lanes - 8 * half < 8 ? lanes - 8 * half : 8;
    for (int r = 0; r < R; r++) store_bf16x8(out + r * out_stride + 8 * half, acc[r], half_lanes);
}

static inline __attribute__((always_inline)) void tile(
    const int R, const int FMT, const Q8Activations *a, int64_t t, const uint8_t *codes,
    const void *dm, uint16_t *out, int64_t out_stride, int lanes) {
    half_tile(R, FMT, a, t, codes, dm, out, out_stride, lanes, 0);
    if (lanes > 8) half_tile(R, FMT, a, t, codes, dm, out, out_stride, lanes, 1);
}

void isa_byte_dot_tile(int format, const Q8Activations *a, int64_t t, int rows,
                       const uint8_t *codes, const void *dm, uint16_t *out,
                       int64_t out_stride, int lanes) {
    switch (rows) { ISA_TILE_CASE(4) ISA_TILE_CASE(3) ISA_TILE_CASE(2) ISA_TILE_CASE(1) }
}

/* Four query rows against the 16 keys of a tile: two vectors of 8 keys per row. */
void isa_attn_scores_4(const float *q, int64_t D, const float *tile_t, float *s,
                       int64_t s_stride) {
    __m256 lo[4], hi[4];
    for (int r = 0; r < 4; r++) lo[r] = hi[r] = _mm256_setzero_ps();
    for (int64_t j = 0; j < D; j++) {
        const __m256 k0 = _mm256_loadu_ps(tile_t + j * KEY_TILE);
        const __m256 k1 = _mm256_loadu_ps(tile_t + j * KEY_TILE + 8);
        for (int r = 0; r < 4; r++) {
            const __m256 qr = _mm256_set1_ps(q[r * D + j]);
            lo[r] = _mm256_fmadd_ps(qr, k0, lo[r]);
            hi[r] = _mm256_fmadd_ps(qr, k1, hi[r]);
        }
    }
    for (int r = 0; r < 4; r++) {
        _mm256_storeu_ps(s + r * s_stride, lo[r]);
        _mm256_storeu_ps(s + r * s_stride + 8, hi[r]);
    }
}

void isa_attn_weighted_sum(float *acc, int64_t D, const float *w, const float *tile, int64_t n) {
    int64_t j = 0;
    for (; j + 8 <= D; j += 32) { /* up to 32 values in four registers at a time */
        const int vectors = (int)((D - j) / 8 < 4 ? (D - j) / 8 : 4);
        __m256 a[4];
        for (int v = 0; v < vectors; v++) a[v] = _mm256_loadu_ps(acc + j + 8 * v);
        for (int64_t t = 0; t < n; t++) {
            const __m256 wt = _mm256_set1_ps(w[t]);
            for (int v = 0; v < vectors; v++)
                a[v] = _mm256_fmadd_ps(wt, _mm256_loadu_ps(tile + t * D + j + 8 * v), a[v]);
        }
        for (int v = 0; v < vectors; v++) _mm256_storeu_ps(acc + j + 8 * v, a[v]);
        if (vectors < 4) { j += 8 * vectors; break; }
    }
    for (; j < D; j++)
        for (int64_t t = 0; t < n; t++) acc[j] = fmaf(w[t], tile[t * D + j], acc[j]);
}

/* One vector of 8 partial sums of q . k (lane l: the products at j = l mod 8, in j order);
 * a tail shorter than 8 is masked. */
static inline __attribute__((always_inline)) __m256 dot_partials(const float *q,
                                                                 const float *k, int64_t D) {
    __m256 a = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= D; j += 8)
        a = _mm256_fmadd_ps(_mm256_loadu_ps(q + j), _mm256_loadu_ps(k + j), a);
    if (j < D) {
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(D - j)),
                                             _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        a = _mm256_fmadd_ps(_mm256_maskload_ps(q + j, m), _mm256_maskload_ps(k + j, m), a);
    }
    return a;
}

/* Lane t of the result is the sum of v[t]'s 8 lanes: two rounds of horizontal adds, then
 * the 128-bit halves added across (9 instructions for 8 sums). */
static inline __m256 sum_lanes_8(const __m256 v[8]) {
    const __m256 x = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    const __m256 y = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(x, y, 0x20), _mm256_permute2f128_ps(x, y, 0x31));
}

static inline __attribute__((always_inline)) void key_scores(const float *q, int64_t rows,
                                                             int64_t D, const float *tile,
                                                             int64_t kt, float *s,
                                                             int64_t s_stride) {
    for (int64_t r = 0; r < rows; r++) {
        for (int half = 0; half < 2 && 8 * half < kt; half++) {
            __m256 v[8];
            for (int t = 0; t < 8; t++)
                v[t] = 8 * half + t < kt ? dot_partials(q + r * D, tile + (8 * half + t) * D, D)
                                         : _mm256_setzero_ps();
            const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)kt - 8 * half),
                                                    _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            _mm256_maskstore_ps(s + r * s_stride + 8 * half, keep, sum_lanes_8(v)); /* t < kt */
        }
    }
}

void isa_attn_key_scores(const float *q, int64_t rows, int64_t D, const float *tile,
                         int64_t kt, float *s, int64_t s_stride) {
    if (D == 64) key_scores(q, rows, 64, tile, kt, s, s_stride); /* the products unrolled */
    else if (D == 128) key_scores(q, rows, 128, tile, kt, s, s_stride);
    else key_scores(q, rows, D, tile, kt, s, s_stride);
}

void isa_int8_row_to_float(float *dst, const int8_t *row, int64_t D) {
    for (int64_t g = 0; g < D / 16; g++) {
        float scale;
        memcpy(&scale, row + D + 4 * g, sizeof scale);
        const __m256 s = _mm256_set1_ps(scale);
        for (int half = 0; half < 2; half++) {
            const __m128i c = _mm_loadl_epi64((const __m128i *)(row + 16 * g + 8 * half));
            _mm256_storeu_ps(dst + 16 * g + 8 * half,
                             _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c)), s));
        }
    }
}

/* R rows' V vectors of output values (acc rows D apart, tile rows D apart, w rows w_stride
 * apart): the accumulators stay in registers over the n keys and each key's values are
 * loaded once for all R rows (at most 2 x 4 accumulators: AVX2 has 16 registers). */
static inline __attribute__((always_inline)) void weighted_sum_block(
        int R, int V, float *acc, int64_t D, const float *w, int64_t w_stride,
        const float *tile, int64_t n) {
    __m256 a[2][4];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < V; v++) a[r][v] = _mm256_loadu_ps(acc + r * D + 8 * v);
    for (int64_t t = 0; t < n; t++) {
        __m256 k[4];
        for (int v = 0; v < V; v++) k[v] = _mm256_loadu_ps(tile + t * D + 8 * v);
        for (int r = 0; r < R; r++) {
            const __m256 wt = _mm256_set1_ps(w[r * w_stride + t]);
            for (int v = 0; v < V; v++) a[r][v] = _mm256_fmadd_ps(wt, k[v], a[r][v]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < V; v++) _mm256_storeu_ps(acc + r * D + 8 * v, a[r][v]);
}

void isa_attn_weighted_sum_rows(float *acc, int64_t rows, int64_t D, const float *w,
                                int64_t w_stride, const float *tile, int64_t n) {
    for (int64_t r0 = 0; r0 < rows; r0 += 2) {
        const int R = rows - r0 < 2 ? 1 : 2;
        float *a = acc + r0 * D;
        const float *wr = w + r0 * w_stride;
        int64_t j = 0;
        for (; j + 32 <= D; j += 32)
            if (R == 2) weighted_sum_block(2, 4, a + j, D, wr, w_stride, tile + j, n);
            else weighted_sum_block(1, 4, a + j, D, wr, w_stride, tile + j, n);
        for (; j + 8 <= D; j += 8) weighted_sum_block(R, 1, a + j, D, wr, w_stride, tile + j, n);
        for (int r = 0; r < R; r++) /* a tail of fewer than 8 values */
            for (int64_t jj = j; jj < D; jj++)
                for (int64_t t = 0; t < n; t++)
                    a[r * D + jj] = fmaf(wr[r * w_stride + t], tile[t * D + jj], a[r * D + jj]);
    }
}

/* A pair of bfloat16 values per 32-bit lane: the odd (high) and even (low) one as float32. */
static inline __m256 odd_bf16(__m256i pairs) {
    return _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32((int)0xFFFF0000u)));
}
static inline __m256 even_bf16(__m256i pairs) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
}

/* One panel (P is 1: its two halves of 8 rows) x R tokens, vdpbf16ps's order (isa.h). */
static inline __attribute__((always_inline)) void bf16_tile(
    const int P, const int R, const uint16_t *x, int64_t x_stride, const uint16_t *panels,
    int64_t K, uint16_t *out, int64_t out_stride, int lanes) {
    (void)P;
    __m256 acc[2][MAX_BF16_TOKENS];
    for (int h = 0; h < 2; h++)
        for (int r = 0; r < R; r++) acc[h][r] = _mm256_setzero_ps();
    for (int64_t j = 0; j < K / 2; j++) {
        __m256 odd[2], even[2];
        for (int h = 0; h < 2; h++) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(panels + j * 2 * PANEL_ROWS + h * 16));
            odd[h] = odd_bf16(w);
            even[h] = even_bf16(w);
        }
        for (int r = 0; r < R; r++) {
            const __m256i pair = _mm256_set1_epi32((int)bf16_pair(x + r * x_stride + 2 * j));
            const __m256 x_odd = odd_bf16(pair), x_even = even_bf16(pair);
            for (int h = 0; h < 2; h++) {
                acc[h][r] = _mm256_fmadd_ps(odd[h], x_odd, acc[h][r]);
                acc[h][r] = _mm256_fmadd_ps(even[h], x_even, acc[h][r]);
            }
        }
    }
    for (int r = 0; r < R; r++) {
        store_bf16x8(out + r * out_stride, acc[0][r], lanes < 8 ? lanes : 8);
        if (lanes > 8) store_bf16x8(out + r * out_stride + 8, acc[1][r], lanes - 8);
    }
}

void isa_bf16_tile(const uint16_t *x, int64_t x_stride, int rows, const uint16_t *panels,
                   int count, int64_t K, uint16_t *out, int64_t out_stride, int lanes) {
    ISA_BF16_ROWS_4(1)
    abort(); /* a tile larger than this ISA declares: bf16_matmul.c never asks for one */
}

/* Decode scores over a bfloat16 cache: through a float32 tile. */
ISA_KEY_SCORES_BF16_THROUGH_A_TILE

/*
 * isa.h on Arm NEON (AArch64), with or without the dot-product extension (ARMv8.2 dotprod,
 * built with +dotprod when the CPU has it).
 *
 * A 16-row panel is four chunks of 4 rows, one 128-bit vector of int32 lanes each; a quad of
 * a group is 16 bytes per chunk. vdotq_laneq_s32 multiplies the 4 bytes of each lane by the
 * 4 bytes of one lane of the activations (signed x signed), so int4 codes (0..15) are used as
 * they are and int8 codes (q + 128) are made signed (q); the dot of q + 128 is then that sum
 * plus 128 x sum(x), exactly. Without dotprod, widening multiplies and pairwise adds give the
 * same integers. A tile is up to 4 tokens.
 */
#include <arm_neon.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "isa.h"

#if defined(__ARM_FEATURE_DOTPROD)
const char ISA_NAME[] = "neon_dotprod";
#else
const char ISA_NAME[] = "neon";
#endif
const int ISA_TILE_TOKENS = 4;
_Static_assert(Q8_BLOCK_TOKENS % 4 == 0, "a tile's tokens lie in one block (isa.h)");
/* bfloat16 tiles: one panel (four vectors of 4 rows) x 4 tokens, 16 accumulators */
const int ISA_BF16_TOKENS = 4, ISA_BF16_PANELS = 1;

static inline float32x4_t load_bf16x4(const uint16_t *p) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}

void isa_quantize_q8_bf16(const Q8Activations *a, const uint16_t *x, int64_t t, int halves) {
    for (int64_t g = 0; g < a->G; g++) {
        float32x4_t values[2][4];
        float amaxes[2];
        for (int h = 0; h < 2; h++) { /* four vectors per half-group of 16 */
            float32x4_t amax4 = vdupq_n_f32(0.f);
            for (int i = 0; i < 4; i++) {
                values[h][i] = load_bf16x4(x + g * Q8_GROUP + h * Q8_HALF + 4 * i);
                amax4 = vmaxq_f32(amax4, vabsq_f32(values[h][i]));
            }
            amaxes[h] = vmaxvq_f32(amax4);
        }
        q8_share_amax(amaxes, halves);
        int32_t sums[2];
        for (int h = 0; h < 2; h++) {
            const float32x4_t *v = values[h];
            const float inv = q8_inverse_step(amaxes[h]);
            int8_t *q = a->xq + q8_entry(a, t, g) * Q8_GROUP + h * Q8_HALF;
            int32x4_t total = vdupq_n_s32(0);
            for (int i = 0; i < 4; i += 2) {
                /* vcvtnq rounds half to even, as nearbyintf does. */
                const int32x4_t q0 = vcvtnq_s32_f32(vmulq_n_f32(v[i], inv));
                const int32x4_t q1 = vcvtnq_s32_f32(vmulq_n_f32(v[i + 1], inv));
                total = vaddq_s32(total, vaddq_s32(q0, q1));
                const int16x8_t narrow = vcombine_s16(vmovn_s32(q0), vmovn_s32(q1));
                vst1_s8(q + 4 * i, vmovn_s16(narrow));
            }
            sums[h] = vaddvq_s32(total);
        }
        q8_record_group(a, t, g, amaxes, sums, halves);
    }
}

/* 4 float32 → bfloat16 (round to nearest even), the first `lanes` stored; NaNs as in
 * avx512_bf16_store.h's store_bf16x16. */
static inline void store_bf16x4(uint16_t *dst, float32x4_t v, int lanes) {
    uint32x4_t bits = vreinterpretq_u32_f32(v);
    const uint32x4_t odd = vandq_u32(vshrq_n_u32(bits, 16), vdupq_n_u32(1));
    bits = vaddq_u32(bits, vaddq_u32(vdupq_n_u32(0x7FFF), odd));
    const uint16x4_t half = vshrn_n_u32(bits, 16);
    if (lanes == 4) {
        vst1_u16(dst, half);
    } else {
        uint16_t tmp[4];
        vst1_u16(tmp, half);
        memcpy(dst, tmp, sizeof(uint16_t) * (size_t)lanes);
    }
}

/* dot + the 4 lane-wise dot products of w (4 rows x 4 bytes) with the 4 bytes `quad`. */
static inline int32x4_t dot_quad(int32x4_t dot, int8x16_t w, int8x16_t x, int lane_pair_base,
                                 int32_t quad) {
#if defined(__ARM_FEATURE_DOTPROD)
    (void)quad;
    switch (lane_pair_base) { /* the lane index must be a constant */
    case 0: return vdotq_laneq_s32(dot, w, x, 0);
    case 1: return vdotq_laneq_s32(dot, w, x, 1);
    case 2: return vdotq_laneq_s32(dot, w, x, 2);
    default: return vdotq_laneq_s32(dot, w, x, 3);
    }
#else
    (void)x;
    (void)lane_pair_base;
    const int8x16_t xb = vreinterpretq_s8_s32(vdupq_n_s32(quad));
    const int32x4_t lo = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(xb)));
    const int32x4_t hi = vpaddlq_s16(vmull_s8(vget_high_s8(w), vget_high_s8(xb)));
    return vaddq_s32(dot, vpaddq_s32(lo, hi));
#endif
}

/* 4 scales at dm + i, float16 or float32 by the format (the conversion is exact). */
static inline float32x4_t load_scales(const int FMT, const void *dm, int64_t i) {
    if (FMT_HALF_SCALES(FMT))
        return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)dm + i)));
    return vld1q_f32((const float *)dm + i);
}

/* Tokens t .. t + R - 1 times rows 4 * chunk .. 4 * chunk + 3 of a panel. */
static inline __attribute__((always_inline)) void chunk_tile(
    const int R, const int FMT, const Q8Activations *a, int64_t t, const uint8_t *codes,
    const void *dm, uint16_t *out, int64_t out_stride, int lanes, int chunk) {
    const int INT8 = FMT == FMT_INT8, IMPLIED_MIN = FMT_DM_STRIDE(FMT) == PANEL_ROWS;
    const int64_t group_bytes = INT8 ? 512 : 256, dm_stride = FMT_DM_STRIDE(FMT);
    float32x4_t acc[MAX_TILE_TOKENS];
    for (int r = 0; r < R; r++) acc[r] = vdupq_n_f32(0.f);
    /* token r's group g is entry first + 8 g + r: the tile lies in one block (isa.h) */
    const int64_t first = q8_entry(a, t, 0);
    for (int64_t g = 0; g < a->G; g++) {
        const uint8_t *group = codes + g * group_bytes + 16 * chunk;
        int8x16_t w[8];
        if (INT8) {
            for (int j = 0; j < 8; j++)
                w[j] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(group + j * 64), vdupq_n_u8(0x80)));
        } else {
            for (int b = 0; b < 4; b++) {
                const uint8x16_t raw = vld1q_u8(group + b * 64);
                w[b] = vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0F)));
                w[b + 4] = vreinterpretq_s8_u8(vshrq_n_u8(raw, 4));
            }
        }
        const float32x4_t d = load_scales(FMT, dm, g * dm_stride + 4 * chunk);
        const float32x4_t m = IMPLIED_MIN
                                  ? vmulq_n_f32(d, FMT_MIN_FACTOR(FMT))
                                  : load_scales(FMT, dm, g * dm_stride + PANEL_ROWS + 4 * chunk);
        for (int r = 0; r < R; r++) {
            const int64_t e = first + g * Q8_BLOCK_TOKENS + r;
            const int8_t *xq = a->xq + e * Q8_GROUP;
            const int8x16_t x0 = vld1q_s8(xq), x1 = vld1q_s8(xq + 16);
            int32_t quads[8];
            memcpy(quads, xq, sizeof quads);
            int32x4_t dot0 = vdupq_n_s32(0), dot1 = vdupq_n_s32(0);
            for (int j = 0; j < 4; j++) dot0 = dot_quad(dot0, w[j], x0, j, quads[j]);
            for (int j = 4; j < 8; j++) dot1 = dot_quad(dot1, w[j], x1, j - 4, quads[j]);
            const int32_t *sums = a->sums + e * 2;
            const float *dx = a->dx + e * 2;
            if (INT8) { /* one scale per group; the codes' +128 offset added back exactly */
                const int32x4_t dot = vaddq_s32(vaddq_s32(dot0, dot1),
                                                vdupq_n_s32(128 * (sums[0] + sums[1])));
                acc[r] = vfmaq_f32(acc[r], vcvtq_f32_s32(dot), vmulq_n_f32(d, dx[0]));
            } else {
                acc[r] = vfmaq_f32(acc[r], vcvtq_f32_s32(dot0), vmulq_n_f32(d, dx[0]));
                acc[r] = vfmaq_f32(acc[r], vcvtq_f32_s32(dot1), vmulq_n_f32(d, dx[1]));
            }
            acc[r] = vfmaq_f32(acc[r], m, vdupq_n_f32(a->c[e]));
        }
    }
    const int chunk_lanes = lanes - 4 * chunk < 4 ? lanes - 4 * chunk : 4;
    for (int r = 0; r < R; r++) store_bf16x4(out + r * out_stride + 4 * chunk, acc[r], chunk_lanes);
}

static inline __attribute__((always_inline)) void tile(
    const int R, const int FMT, const Q8Activations *a, int64_t t, const uint8_t *codes,
    const void *dm, uint16_t *out, int64_t out_stride, int lanes) {
    for (int chunk = 0; chunk < 4 && 4 * chunk < lanes; chunk++)
        chunk_tile(R, FMT, a, t, codes, dm, out, out_stride, lanes, chunk);
}

void isa_byte_dot_tile(int format, const Q8Activations *a, int64_t t, int rows,
                       const uint8_t *codes, const void *dm, uint16_t *out,
                       int64_t out_stride, int lanes) {
    switch (rows) { ISA_TILE_CASE(4) ISA_TILE_CASE(3) ISA_TILE_CASE(2) ISA_TILE_CASE(1) }
}

void isa_attn_scores_4(const float *q, int64_t D, const float *tile_t, float *s,
                       int64_t s_stride) {
    float32x4_t acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int v = 0; v < 4; v++) acc[r][v] = vdupq_n_f32(0.f);
    for (int64_t j = 0; j < D; j++) {
        float32x4_t k[4];
        for (int v = 0; v < 4; v++) k[v] = vld1q_f32(tile_t + j * KEY_TILE + 4 * v);
        for (int r = 0; r < 4; r++) {
            const float32x4_t qr = vdupq_n_f32(q[r * D + j]);
            for (int v = 0; v < 4; v++) acc[r][v] = vfmaq_f32(acc[r][v], qr, k[v]);
        }
    }
    for (int r = 0; r < 4; r++)
        for (int v = 0; v < 4; v++) vst1q_f32(s + r * s_stride + 4 * v, acc[r][v]);
}

void isa_attn_weighted_sum(float *acc, int64_t D, const float *w, const float *tile, int64_t n) {
    int64_t j = 0;
    for (; j + 4 <= D; j += 16) { /* up to 16 values in four registers at a time */
        const int vectors = (int)((D - j) / 4 < 4 ? (D - j) / 4 : 4);
        float32x4_t a[4];
        for (int v = 0; v < vectors; v++) a[v] = vld1q_f32(acc + j + 4 * v);
        for (int64_t t = 0; t < n; t++) {
            const float32x4_t wt = vdupq_n_f32(w[t]);
            for (int v = 0; v < vectors; v++)
                a[v] = vfmaq_f32(a[v], wt, vld1q_f32(tile + t * D + j + 4 * v));
        }
        for (int v = 0; v < vectors; v++) vst1q_f32(acc + j + 4 * v, a[v]);
        if (vectors < 4) { j += 4 * vectors; break; }
    }
    for (; j < D; j++)
        for (int64_t t = 0; t < n; t++) acc[j] = fmaf(w[t], tile[t * D + j], acc[j]);
}

/* A key's 4 partial sums in one register, added across once. */
void isa_attn_key_scores(const float *q, int64_t rows, int64_t D, const float *tile,
                         int64_t kt, float *s, int64_t s_stride) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t t = 0; t < kt; t++) {
            const float *qr = q + r * D, *k = tile + t * D;
            float32x4_t a = vdupq_n_f32(0.f);
            int64_t j = 0;
            for (; j + 4 <= D; j += 4) a = vfmaq_f32(a, vld1q_f32(qr + j), vld1q_f32(k + j));
            float sum = vaddvq_f32(a);
            for (; j < D; j++) sum = fmaf(qr[j], k[j], sum);
            s[r * s_stride + t] = sum;
        }
}

/* A group's 16 codes widened in registers (8 → 16 → 32 bits), converted and scaled. */
void isa_int8_row_to_float(float *dst, const int8_t *row, int64_t D) {
    for (int64_t g = 0; g < D / 16; g++) {
        float scale;
        memcpy(&scale, row + D + 4 * g, sizeof scale);
        const int8x16_t codes = vld1q_s8(row + 16 * g);
        const int16x8_t halves[2] = {vmovl_s8(vget_low_s8(codes)), vmovl_s8(vget_high_s8(codes))};
        for (int h = 0; h < 2; h++) {
            vst1q_f32(dst + 16 * g + 8 * h,
                      vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(halves[h]))), scale));
            vst1q_f32(dst + 16 * g + 8 * h + 4,
                      vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(halves[h]))), scale));
        }
    }
}

void isa_attn_weighted_sum_rows(float *acc, int64_t rows, int64_t D, const float *w,
                                int64_t w_stride, const float *tile, int64_t n) {
    for (int64_t r = 0; r < rows; r++) isa_attn_weighted_sum(acc + r * D, D, w + r * w_stride, tile, n);
}

/* A pair of bfloat16 values per 32-bit lane: the odd (high) and even (low) one as float32. */
static inline float32x4_t odd_bf16(uint32x4_t pairs) {
    return vreinterpretq_f32_u32(vandq_u32(pairs, vdupq_n_u32(0xFFFF0000u)));
}
static inline float32x4_t even_bf16(uint32x4_t pairs) {
    return vreinterpretq_f32_u32(vshlq_n_u32(pairs, 16));
}

/* One panel (P is 1: four quarters of 4 rows) x R tokens, vdpbf16ps's order (isa.h). */
static inline __attribute__((always_inline)) void bf16_tile(
    const int P, const int R, const uint16_t *x, int64_t x_stride, const uint16_t *panels,
    int64_t K, uint16_t *out, int64_t out_stride, int lanes) {
    (void)P;
    float32x4_t acc[4][MAX_BF16_TOKENS];
    for (int q = 0; q < 4; q++)
        for (int r = 0; r < R; r++) acc[q][r] = vdupq_n_f32(0.f);
    for (int64_t j = 0; j < K / 2; j++) {
        float32x4_t odd[4], even[4];
        for (int q = 0; q < 4; q++) {
            const uint32x4_t w = vreinterpretq_u32_u16(vld1q_u16(panels + j * 2 * PANEL_ROWS + q * 8));
            odd[q] = odd_bf16(w);
            even[q] = even_bf16(w);
        }
        for (int r = 0; r < R; r++) {
            const uint32x4_t pair = vdupq_n_u32(bf16_pair(x + r * x_stride + 2 * j));
            const float32x4_t x_odd = odd_bf16(pair), x_even = even_bf16(pair);
            for (int q = 0; q < 4; q++) {
                acc[q][r] = vfmaq_f32(acc[q][r], odd[q], x_odd);
                acc[q][r] = vfmaq_f32(acc[q][r], even[q], x_even);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int q = 0; q < 4 && q * 4 < lanes; q++)
            store_bf16x4(out + r * out_stride + q * 4, acc[q][r], lanes - q * 4 < 4 ? lanes - q * 4 : 4);
}

void isa_bf16_tile(const uint16_t *x, int64_t x_stride, int rows, const uint16_t *panels,
                   int count, int64_t K, uint16_t *out, int64_t out_stride, int lanes) {
    ISA_BF16_ROWS_4(1)
    abort(); /* a tile larger than this ISA declares: bf16_matmul.c never asks for one */
}

/* Decode scores over a bfloat16 cache: through a float32 tile. */
ISA_KEY_SCORES_BF16_THROUGH_A_TILE

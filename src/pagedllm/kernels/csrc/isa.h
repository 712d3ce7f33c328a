/*
 * The primitives that differ per instruction set. Each ISA source defines all of them:
 *
 *   scalar.c   plain C, the reference that defines the arithmetic
 *   avx512.c   AVX-512 F/BW/VL/DQ with VNNI (vpdpbusd on 16 lanes); with BF16's vdpbf16ps
 *              when built with it (__AVX512BF16__: the avx512_bf16 variant)
 *   avx2.c     AVX2 + FMA: AVX-VNNI's 256-bit vpdpbusd when built with it (__AVXVNNI__),
 *              else vpmaddubsw + vpmaddwd (the pair llama.cpp uses for Q4 x Q8 on AVX2)
 *   neon.c     Arm NEON: vdotq_s32 with the dot-product extension (__ARM_FEATURE_DOTPROD),
 *              else widening multiplies
 *
 * A variant's library is the common sources (w4a8.c, paged_attention.c, cpu_ops.c,
 * decode_stack.c) plus one ISA source, all compiled with that variant's flags
 * (kernels/variants.py). The common sources hold the loops, threading and memory layout;
 * only these functions touch vector registers.
 *
 * Byte dot products must give the same bits on every ISA: the integer sums are exact, and
 * the float steps are done in one order everywhere.
 *
 * int4 weights (W4A8): activations are quantized per token and half-group h of 16 values
 * (a weight group's first and last 16 inputs, its low and high nibbles in the layout):
 * amax = max |x|, q = round_half_even(x * (127 / amax)), dx_h = amax * (1 / 127),
 * s_h = sum(q), c = fma(dx_1, s_1, dx_0 * s_0). Per output row and group g, with dot_h the
 * integer dot of the half-group's codes:
 *   acc = fma((float)dot_0, d_g * dx_0, acc);  acc = fma((float)dot_1, d_g * dx_1, acc);
 *   acc = fma(m_g, c_g, acc)
 * int8 weights (W8A8, the LM head): one scale per group of 32 (amax over the group, so
 * dx_0 = dx_1 = dx), c = dx * (s_0 + s_1), dot the integer dot over the group, m = -128 d:
 *   acc = fma((float)dot, d_g * dx, acc);  acc = fma(m_g, c_g, acc)
 * (half-groups cut the W4A8 error against float32 by a fifth and cost the int4 kernel ~9%;
 * the LM head's error hardly matters and its int8 kernel would lose more, so it keeps 32.)
 * Either way acc is then rounded to bfloat16 (nearest even).
 *
 * bfloat16 weights (bf16_matmul.c) multiply bfloat16 activations as they are, in the order of
 * AVX-512 BF16's vdpbf16ps (on every variant but amx_bf16, whose matrix units sum in their
 * own order: amx_bf16.c): per output row, over the input pairs j in order,
 *   acc = fma(w[2j + 1], x[2j + 1], acc);  acc = fma(w[2j], x[2j], acc)
 * from acc = 0, then rounded to bfloat16. The product of two bfloat16 values is exact in
 * float32, so each step is one rounding, as the instruction's; it also treats denormal
 * inputs and results as zero, which the emulations do not (values below 1e-38 only). The prefill's attention
 * primitives sum in one order too (fma over the head dimension per key, over keys per output
 * value), so they match up to libm's expf; the decode's key scores add a key's products in
 * the ISA's own order (partial sums a vector wide), so decode attention agrees across ISAs
 * to float32 rounding, not bit for bit.
 */
#ifndef PAGEDLLM_ISA_H
#define PAGEDLLM_ISA_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h" /* the weight formats FMT_* */

/* Built for AMX's bfloat16 tiles (the amx_bf16 variant; gcc and clang name the macros
 * differently). */
#if (defined(__AMX_TILE__) || defined(__AMXTILE__)) && \
    (defined(__AMX_BF16__) || defined(__AMXBF16__))
#define ISA_AMX_BF16 1
#endif

/* Inputs per quantization group, and output rows per weight panel of the byte dot-product
 * layouts (an ISA-neutral choice: one AVX-512 vector, two AVX2 vectors, four NEON ones). */
#define Q8_GROUP 32
#define PANEL_ROWS 16
/* Most tokens any ISA's tile takes; each ISA declares its own ISA_TILE_TOKENS <= this. */
#define MAX_TILE_TOKENS 8
/* The most panels and tokens any ISA's bfloat16 tile takes (isa_bf16_tile). */
#define MAX_BF16_PANELS 4
#define MAX_BF16_TOKENS 8
/* Keys per tile of the prefill attention kernel (its transposed tiles are [D][KEY_TILE]). */
#define KEY_TILE 16

/* Activation values per scale: half of a weight group. */
#define Q8_HALF 16

/* The int8 activations of one matmul call, one entry per token and group (q8_entry's order):
 * codes xq [entry, 32]; per half-group the step dx and the integer sum of the codes
 * [entry, 2]; c [entry]. */
typedef struct {
    int64_t K, G;
    int8_t *xq;
    float *dx, *c;
    int32_t *sums;
} Q8Activations;

/* Tokens per block of the activations' layout: within a block the entries are group-major,
 * so a tile's tokens sit side by side for each group, one stream for the whole tile instead of
 * one per token (AVX-512's tile of 8 ran out of general registers for 8 tokens' pointers).
 * Every ISA_TILE_TOKENS divides it, and w4a8.c starts tiles at multiples of ISA_TILE_TOKENS, so
 * a tile never crosses a block. */
#define Q8_BLOCK_TOKENS 8

/* The index of token `row`'s group g among the activations' entries (xq holds Q8_GROUP
 * codes an entry, dx and sums two values, c one). */
static inline int64_t q8_entry(const Q8Activations *a, int64_t row, int64_t g) {
    return ((row / Q8_BLOCK_TOKENS) * a->G + g) * Q8_BLOCK_TOKENS + row % Q8_BLOCK_TOKENS;
}

/* 127 / amax: the factor that maps a (half-)group onto -127..127 (0 for an all-zero one). */
static inline float q8_inverse_step(float amax) { return amax > 0.f ? 127.f / amax : 0.f; }

/* One scale for the whole group unless `halves`: both halves take the larger maximum. */
static inline void q8_share_amax(float amax[2], int halves) {
    if (!halves) amax[0] = amax[1] = amax[0] > amax[1] ? amax[0] : amax[1];
}

/* After token t's group g is quantized with maxima `amax` into codes summing to `sums` per
 * half: its steps dx, code sums and c, in the one order every ISA uses. */
static inline void q8_record_group(const Q8Activations *a, int64_t t, int64_t g,
                                   const float amax[2], const int32_t sums[2], int halves) {
    const float steps[2] = {amax[0] * (1.f / 127.f), amax[1] * (1.f / 127.f)};
    const int64_t e = q8_entry(a, t, g);
    for (int h = 0; h < 2; h++) {
        a->dx[e * 2 + h] = steps[h];
        a->sums[e * 2 + h] = sums[h];
    }
    a->c[e] = halves ? fmaf(steps[1], (float)sums[1], steps[0] * (float)sums[0])
                     : steps[0] * (float)(sums[0] + sums[1]);
}

/* A tile that starts a call's tokens (t == 0) reads its panel's codes from memory, once a
 * step at decode: those codes are prefetched STREAM_AHEAD_GROUPS groups ahead with the
 * non-temporal hint. Measured on Zen 5 (step_breakdown.py --single-stream): a batch-1
 * step's median 4% shorter (7% with the avx2 variant); the temporal hint made it longer.
 * The hint does not keep the rest of the step cached there: a 96 MB read with it evicts the
 * engine's Python as a plain read does (BENCHMARKS.md, "Why a streamed step's Python costs
 * what it does"), so the gain is the codes asked for early; which cache level it spares
 * was not isolated. Later tiles of the same panel find the codes in L1 (prefill steps
 * unchanged). The address is computed as an integer: past the last panel it lies outside
 * the weights, which a prefetch may name (it never faults) but a pointer may not. */
#define STREAM_AHEAD_GROUPS 16

/* always_inline: as a function of its own, gcc judges a body of prefetches free of effects
 * and drops the calls. */
static inline __attribute__((always_inline)) void stream_ahead(const uint8_t *group,
                                                               int64_t group_bytes) {
    const uintptr_t ahead = (uintptr_t)group + (uintptr_t)(STREAM_AHEAD_GROUPS * group_bytes);
    for (int64_t i = 0; i < group_bytes; i += 64)
        __builtin_prefetch((const void *)(ahead + (uintptr_t)i), 0, 0);
}

/* Scales a group of a panel holds in dm: d and m for 16 rows, or d alone (m implied). */
#define FMT_DM_STRIDE(FMT) ((FMT) == FMT_INT8 || (FMT) == FMT_INT4_SYM_F16 ? 16 : 32)
#define FMT_HALF_SCALES(FMT) ((FMT) == FMT_INT4_F16 || (FMT) == FMT_INT4_SYM_F16)
/* The implied minimum's factor (m = factor * d) of a format without stored minimums. */
#define FMT_MIN_FACTOR(FMT) ((FMT) == FMT_INT8 ? -128.f : -8.f)

/* The cases of isa_bf16_tile's switch over (count, rows): the ISA's `bf16_tile` inlined
 * with both as constants. */
#define ISA_BF16_CASE(P, R)                                                                  \
    if (count == P && rows == R) {                                                           \
        bf16_tile(P, R, x, x_stride, panels, K, out, out_stride, lanes);                    \
        return;                                                                              \
    }
/* Every row count up to 4, or up to 8, for P panels (as the ISA's ISA_BF16_TOKENS). */
#define ISA_BF16_ROWS_4(P)                                                                   \
    ISA_BF16_CASE(P, 1) ISA_BF16_CASE(P, 2) ISA_BF16_CASE(P, 3) ISA_BF16_CASE(P, 4)
#define ISA_BF16_ROWS_8(P)                                                                   \
    ISA_BF16_ROWS_4(P) ISA_BF16_CASE(P, 5) ISA_BF16_CASE(P, 6) ISA_BF16_CASE(P, 7)          \
    ISA_BF16_CASE(P, 8)

/* Inputs 2j and 2j + 1 of a bfloat16 row as one 32-bit value (the even one in the low half),
 * the pair every ISA's bfloat16 tile broadcasts. */
static inline uint32_t bf16_pair(const uint16_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* A case of isa_byte_dot_tile's switch over `rows`: the ISA's `tile` inlined with R rows and
 * the weight format as constants. */
#define ISA_TILE_CASE(R)                                                                     \
    case R:                                                                                  \
        if (format == FMT_INT8) tile(R, FMT_INT8, a, t, codes, dm, out, out_stride, lanes); \
        else if (format == FMT_INT4_F16)                                                     \
            tile(R, FMT_INT4_F16, a, t, codes, dm, out, out_stride, lanes);                  \
        else if (format == FMT_INT4_SYM_F16)                                                 \
            tile(R, FMT_INT4_SYM_F16, a, t, codes, dm, out, out_stride, lanes);              \
        else tile(R, FMT_INT4, a, t, codes, dm, out, out_stride, lanes);                     \
        break;

/* The variant's name ("scalar", "avx2", ...) and its tile height for the byte dot products. */
extern const char ISA_NAME[];
extern const int ISA_TILE_TOKENS;

/* Token t of x (bfloat16, K values) → a's codes, dx, c and sums for that token; a scale per
 * half-group when `halves` (for int4 weights), else per group (dx stored for both halves). */
void isa_quantize_q8_bf16(const Q8Activations *a, const uint16_t *x, int64_t t, int halves);

/* Tokens t .. t + rows - 1 (rows <= ISA_TILE_TOKENS) times one panel of 16 output rows:
 * int4 codes (256 bytes per group; dm = [G][2][16] float32 (FMT_INT4) or float16
 * (FMT_INT4_F16) scales then minimums, or [G][16] float16 scales (FMT_INT4_SYM_F16, m = -8 d))
 * or int8 codes stored + 128 (FMT_INT8: 512 bytes per group, dm = [G][16] float32 scales). Writes the first `lanes` columns of each token's output row
 * (rows out_stride apart) as bfloat16. */
void isa_byte_dot_tile(int format, const Q8Activations *a, int64_t t, int rows,
                       const uint8_t *codes, const void *dm, uint16_t *out,
                       int64_t out_stride, int lanes);

/* The variant's bfloat16 tile: at most ISA_BF16_TOKENS tokens x ISA_BF16_PANELS panels. */
extern const int ISA_BF16_TOKENS, ISA_BF16_PANELS;

/* Tokens x[0 .. rows - 1] (K bfloat16 values each, rows x_stride apart) times `count`
 * consecutive panels of bfloat16 weights (bf16_matmul.c's layout, K * 16 values each), by
 * the arithmetic above: out[r * out_stride + 16 p + i] for panel p's row i, every row of a
 * panel but the last one's first `lanes`. rows <= ISA_BF16_TOKENS, count <= ISA_BF16_PANELS. */
void isa_bf16_tile(const uint16_t *x, int64_t x_stride, int rows, const uint16_t *panels,
                   int count, int64_t K, uint16_t *out, int64_t out_stride, int lanes);

/* s[r * s_stride + t] = sum_j q[r * D + j] * tile_t[j * KEY_TILE + t] for r < 4, t < 16:
 * four query rows against a whole transposed key tile. */
void isa_attn_scores_4(const float *q, int64_t D, const float *tile_t, float *s,
                       int64_t s_stride);

/* dst[j] = row[j] * scale of j's group of 16, j < D (D a multiple of 16): one row of the
 * int8 KV cache (D codes, then D / 16 float32 scales, unaligned) to float32. */
void isa_int8_row_to_float(float *dst, const int8_t *row, int64_t D);

/* s[r * s_stride + t] = sum_j q[r * D + j] * tile[t * D + j] for r < rows, t < kt <= 16:
 * query rows against a tile of keys as the cache holds them (not transposed), for decode,
 * where a kv head has too few query rows to pay for a transposition. Each ISA sums a key's
 * products in its own order (partial sums a vector wide, then added across). */
void isa_attn_key_scores(const float *q, int64_t rows, int64_t D, const float *tile,
                         int64_t kt, float *s, int64_t s_stride);

/* acc[j] += sum_t w[t] * tile[t * D + j] for t < n, j < D (any D). */
void isa_attn_weighted_sum(float *acc, int64_t D, const float *w, const float *tile, int64_t n);

/* acc[r * D + j] += sum_t w[r * w_stride + t] * tile[t * D + j] for r < rows, t < n, j < D:
 * isa_attn_weighted_sum for several rows sharing the tile (each key's values loaded once for
 * a few rows), in the same order. */
void isa_attn_weighted_sum_rows(float *acc, int64_t rows, int64_t D, const float *w,
                                int64_t w_stride, const float *tile, int64_t n);

/* The scores of a tile of keys from a bfloat16 cache, read where the cache holds them
 * (keys[t], t < kt <= KEY_TILE, D values each): s[r * s_stride + t] = scale * (q_r . k_t)
 * for r < rows, with q the query rows in bfloat16 (D each) and qf the same rows times
 * scale in float32. With AVX-512 BF16, vdpbf16ps takes q and the keys as they are (exact
 * products, summed in float32 in pairs; scale applied once per score); other ISAs widen the
 * keys into a float32 tile and score qf with isa_attn_key_scores (the results agree to
 * float32 rounding). */
void isa_attn_key_scores_bf16(const uint16_t *q, const float *qf, float scale, int64_t rows,
                              int64_t D, const uint16_t *const *keys, int64_t kt, float *s,
                              int64_t s_stride);

/* isa_attn_key_scores_bf16 through a float32 tile, for an ISA without its own (its source
 * includes bf16.h). */
#define ISA_KEY_SCORES_BF16_THROUGH_A_TILE                                                   \
    void isa_attn_key_scores_bf16(const uint16_t *q, const float *qf, float scale,          \
                                  int64_t rows, int64_t D, const uint16_t *const *keys,     \
                                  int64_t kt, float *s, int64_t s_stride) {                 \
        (void)q, (void)scale;                                                               \
        float tile[KEY_TILE * D];                                                           \
        for (int64_t t = 0; t < kt; t++)                                                    \
            bf16_row_to_float(tile + t * D, keys[t], D);                                    \
        isa_attn_key_scores(qf, rows, D, tile, kt, s, s_stride);                            \
    }

#endif

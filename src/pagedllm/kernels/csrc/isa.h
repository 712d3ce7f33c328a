/*
 * The primitives that differ per instruction set. Each ISA source defines all of them:
 *
 *   scalar.c   plain C, the reference that defines the arithmetic
 *   avx512.c   AVX-512 F/BW/VL/DQ with VNNI (vpdpbusd on 16 lanes)
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
 * the float steps are done in one order everywhere, per output row and group g:
 *   acc = fma((float)dot_g, d_g * dx_g, acc);  acc = fma(m_g, c_g, acc)
 * then acc rounded to bfloat16 (nearest even). Activations are quantized per token and
 * group of 32: amax = max |x|, q = round_half_even(x * (127 / amax)), dx = amax * (1 / 127),
 * c = dx * sum(q). The attention primitives sum in one order too (fma over the head
 * dimension per key, over keys per output value), so they match up to libm's expf.
 */
#ifndef PAGEDLLM_ISA_H
#define PAGEDLLM_ISA_H

#include <stdint.h>

/* Inputs per quantization group, and output rows per weight panel of the byte dot-product
 * layouts (an ISA-neutral choice: one AVX-512 vector, two AVX2 vectors, four NEON ones). */
#define Q8_GROUP 32
#define PANEL_ROWS 16
/* Most tokens any ISA's tile takes; each ISA declares its own ISA_TILE_TOKENS <= this. */
#define MAX_TILE_TOKENS 8
/* Keys per tile of the prefill attention kernel (its transposed tiles are [D][KEY_TILE]). */
#define KEY_TILE 16

/* The int8 activations of one matmul call: codes xq [M, K]; per token and group the step
 * dx, c = dx * sum(codes) and the integer sum itself [M, G]. */
typedef struct {
    int64_t K, G;
    int8_t *xq;
    float *dx, *c;
    int32_t *sums;
} Q8Activations;

/* The variant's name ("scalar", "avx2", ...) and its tile height for the byte dot products. */
extern const char ISA_NAME[];
extern const int ISA_TILE_TOKENS;

/* Token t of x (bfloat16, K values) → a's codes, dx, c and sums for that token. */
void isa_quantize_q8_bf16(const Q8Activations *a, const uint16_t *x, int64_t t);

/* Tokens t .. t + rows - 1 (rows <= ISA_TILE_TOKENS) times one panel of 16 output rows:
 * int4 codes (int8 == 0: 256 bytes per group, dm = [G][2][16] scales then minimums) or int8
 * codes stored + 128 (int8 == 1: 512 bytes per group, dm = [G][16] scales). Writes the first
 * `lanes` columns of each token's output row (rows out_stride apart) as bfloat16. */
void isa_byte_dot_tile(int int8, const Q8Activations *a, int64_t t, int rows,
                       const uint8_t *codes, const float *dm, uint16_t *out,
                       int64_t out_stride, int lanes);

/* s[r * s_stride + t] = sum_j q[r * D + j] * tile_t[j * KEY_TILE + t] for r < 4, t < 16:
 * four query rows against a whole transposed key tile. */
void isa_attn_scores_4(const float *q, int64_t D, const float *tile_t, float *s,
                       int64_t s_stride);

/* acc[j] += sum_t w[t] * tile[t * D + j] for t < n, j < D (D a multiple of 16). */
void isa_attn_weighted_sum(float *acc, int64_t D, const float *w, const float *tile, int64_t n);

#endif

/* bfloat16 <-> float32 for the engine's C sources (csrc/ is on every build's include path). */
#ifndef PAGEDLLM_BF16_H
#define PAGEDLLM_BF16_H

#include <stdint.h>
#include <string.h>

static inline float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* f rounded to the nearest bfloat16 (ties to even). A NaN stays a NaN, quietened with its
 * sign and upper payload as VCVTNEPS2BF16 does: the rounding add alone would carry a large
 * payload out of the exponent (0x7FFFFFFF to -0) or a small one into it (0x7F800001 to
 * infinity). The test is on the bits: -ffast-math folds isnan() away. */
static inline uint16_t float_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    const uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u); /* to nearest even */
    /* Selected at 32 bits, then narrowed: a select of 16-bit values vectorizes poorly. */
    const uint32_t kept = (bits & 0x7FFFFFFFu) > 0x7F800000u ? bits | 0x00400000u : rounded;
    return (uint16_t)(kept >> 16);
}

/* n bfloat16 values widened to float32. */
static inline void bf16_row_to_float(float *dst, const uint16_t *src, int64_t n) {
    for (int64_t j = 0; j < n; j++) dst[j] = bf16_to_float(src[j]);
}

/* f rounded to bfloat16 and back: what a torch op with a bfloat16 result keeps. */
static inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

/* IEEE float16 -> float32, exactly (subnormals, infinities and NaN included), for ISAs
 * without a conversion instruction. */
static inline float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1Fu;
    uint32_t mantissa = h & 0x3FFu, bits;
    if (exponent == 0x1Fu) {
        bits = sign | 0x7F800000u | (mantissa << 13);
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        uint32_t e = 113u;
        while (!(mantissa & 0x400u)) { mantissa <<= 1; e--; }
        bits = sign | (e << 23) | ((mantissa & 0x3FFu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

#endif

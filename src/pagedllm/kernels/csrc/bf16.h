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

static inline uint16_t float_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    bits += 0x7FFFu + ((bits >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(bits >> 16);
}

/* f rounded to bfloat16 and back: what a torch op with a bfloat16 result keeps. */
static inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

#endif

/* float32 -> bfloat16 stores for the AVX-512 sources (avx512.c and amx_bf16.c's AMX path);
 * include only where AVX-512 F/BW/VL are enabled. */
#ifndef PAGEDLLM_AVX512_BF16_STORE_H
#define PAGEDLLM_AVX512_BF16_STORE_H

#include <immintrin.h>
#include <stdint.h>

#include "isa.h" /* PANEL_ROWS */

/* 16 float32 → bfloat16 (round to nearest even, as float_to_bf16), the first `lanes` stored.
 * Unlike float_to_bf16 it does not test for NaNs: a NaN whose low 16 bits are zero, as
 * every NaN from the matmuls' bfloat16 and int8 inputs is, stays a NaN anyway. */
static inline void store_bf16x16(uint16_t *dst, __m512 v, int lanes) {
    __m512i bits = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    bits = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd));
    const __m256i half = _mm512_cvtepi32_epi16(_mm512_srli_epi32(bits, 16));
    if (lanes == PANEL_ROWS)
        _mm256_storeu_si256((__m256i *)dst, half);
    else
        _mm256_mask_storeu_epi16(dst, (__mmask16)((1u << lanes) - 1), half);
}

#endif

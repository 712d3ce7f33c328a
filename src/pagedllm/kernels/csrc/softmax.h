/* The softmax steps the attention kernels share (paged_attention.c, dense_attention.c), in
 * float32, written once. */
#ifndef PAGEDLLM_SOFTMAX_H
#define PAGEDLLM_SOFTMAX_H

#include <math.h>
#include <stdint.h>

/* s[0..n) becomes exp(s - max) in place; returns their sum, *max_out the max. */
static inline float exp_minus_max(float *s, int64_t n, float *max_out) {
    float mx = -INFINITY, sum = 0.f;
    for (int64_t p = 0; p < n; p++) mx = s[p] > mx ? s[p] : mx;
    for (int64_t p = 0; p < n; p++) { s[p] = expf(s[p] - mx); sum += s[p]; }
    *max_out = mx;
    return sum;
}

/* s[0..n) becomes softmax(s[0..n)). */
static inline void softmax(float *s, int64_t n) {
    float mx;
    const float inv = 1.f / exp_minus_max(s, n, &mx);
    for (int64_t p = 0; p < n; p++) s[p] *= inv;
}

#endif

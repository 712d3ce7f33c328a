/*
 * Decode attention straight from the paged KV cache, for CPUs, and the int8 cache's writer.
 *
 * One query token per request attends to the request's whole context, read block by block
 * through its block table: no dense copy of the context is ever made. Per request the keys
 * of a position are read once for all heads (the cache stores a position's kv heads next to
 * each other), scores and softmax are kept in float32 and each output row is rounded once.
 * Requests are spread over OpenMP threads (the process's OpenMP runtime, i.e. torch's).
 *
 * Layout (see TorchPagedBackend): kv_cache [2, num_blocks, block_size, num_kv_heads, ROW],
 * query/out rows [num_tokens, num_heads, D], block_tables [num_reqs, max_blocks] int32,
 * seq_lens [num_reqs] int32 (context length including the new token), token_rows
 * [num_reqs] int32 (the request's query row in query/out).
 *
 * A cache row (one position, one kv head) is D values in the model's dtype, or in the int8
 * cache D int8 codes followed by their float32 scale (value = code * scale; D + 4 bytes).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "kernels.h" /* PagedDims */

#define INT8_SCALE_BYTES 4


/* Cache rows: ROW_BYTES(D) is the size of one, LOAD_ROW converts one to D floats. */
#define ROW_BYTES_F32(D) ((D) * 4)
#define ROW_BYTES_BF16(D) ((D) * 2)
#define ROW_BYTES_INT8(D) ((D) + INT8_SCALE_BYTES)

#define LOAD_ROW_F32(dst, row, D)                                                            \
    do { const float *r_ = (const float *)(row);                                            \
         for (int64_t j_ = 0; j_ < (D); j_++) dst[j_] = r_[j_]; } while (0)
#define LOAD_ROW_BF16(dst, row, D)                                                           \
    do { const uint16_t *r_ = (const uint16_t *)(row);                                      \
         for (int64_t j_ = 0; j_ < (D); j_++) dst[j_] = bf16_to_float(r_[j_]); } while (0)
#define LOAD_ROW_INT8(dst, row, D)                                                           \
    do { const int8_t *r_ = (const int8_t *)(row); float s_;                                \
         memcpy(&s_, r_ + (D), sizeof s_);                                                  \
         for (int64_t j_ = 0; j_ < (D); j_++) dst[j_] = (float)r_[j_] * s_; } while (0)

/* One request's attention. T is the query/output type with LOAD/STORE conversions, CACHE
 * names the cache row format; HEAD_DIM is the head size, a constant in the specialised
 * versions so the compiler unrolls the dot products. */
#define DEFINE_ONE(NAME, T, LOAD, STORE, CACHE, HEAD_DIM)                                    \
static void NAME(const PagedDims *d, const T *q, T *out, const char *keys, const char *values,   \
                 const int32_t *blocks, int64_t seq_len, float scale, float *scores,        \
                 float *qf, float *acc) {                                                   \
    const int64_t D = (HEAD_DIM), H = d->num_heads, Hkv = d->num_kv_heads;                  \
    const int64_t G = H / Hkv, bs = d->block_size, rb = ROW_BYTES_##CACHE(D);               \
    for (int64_t i = 0; i < H * D; i++) qf[i] = LOAD(q[i]) * scale;                         \
    /* scores[h * seq_len + p] = q_h . k_p (of h's kv head) */                               \
    float kv[D]; /* one kv head's row of K or V, converted to float once */                 \
    for (int64_t p = 0; p < seq_len; p++) {                                                 \
        const char *k = keys + ((int64_t)blocks[p / bs] * bs + p % bs) * Hkv * rb;          \
        for (int64_t g = 0; g < Hkv; g++) {                                                 \
            LOAD_ROW_##CACHE(kv, k + g * rb, D);                                            \
            for (int64_t h = g * G; h < (g + 1) * G; h++) {                                 \
                const float *qh = qf + h * D;                                               \
                float s = 0.f;                                                              \
                for (int64_t j = 0; j < D; j++) s += qh[j] * kv[j];                         \
                scores[h * seq_len + p] = s;                                                \
            }                                                                               \
        }                                                                                   \
    }                                                                                       \
    for (int64_t h = 0; h < H; h++) {                                                       \
        float *s = scores + h * seq_len, mx = -INFINITY, sum = 0.f;                         \
        for (int64_t p = 0; p < seq_len; p++) mx = s[p] > mx ? s[p] : mx;                   \
        for (int64_t p = 0; p < seq_len; p++) { s[p] = expf(s[p] - mx); sum += s[p]; }      \
        const float inv = 1.f / sum;                                                        \
        for (int64_t p = 0; p < seq_len; p++) s[p] *= inv;                                  \
    }                                                                                       \
    memset(acc, 0, sizeof(float) * H * D);                                                  \
    for (int64_t p = 0; p < seq_len; p++) {                                                 \
        const char *v = values + ((int64_t)blocks[p / bs] * bs + p % bs) * Hkv * rb;        \
        for (int64_t g = 0; g < Hkv; g++) {                                                 \
            LOAD_ROW_##CACHE(kv, v + g * rb, D);                                            \
            for (int64_t h = g * G; h < (g + 1) * G; h++) {                                 \
                const float w = scores[h * seq_len + p];                                    \
                float *a = acc + h * D;                                                     \
                for (int64_t j = 0; j < D; j++) a[j] += w * kv[j];                          \
            }                                                                               \
        }                                                                                   \
    }                                                                                       \
    for (int64_t i = 0; i < H * D; i++) out[i] = STORE(acc[i]);                             \
}

/* The entry point per (query type, cache format): requests spread over OpenMP threads. */
#define DEFINE_DECODE(NAME, T, LOAD, STORE, CACHE)                                           \
DEFINE_ONE(NAME##_one_64, T, LOAD, STORE, CACHE, 64)                                        \
DEFINE_ONE(NAME##_one_128, T, LOAD, STORE, CACHE, 128)                                      \
DEFINE_ONE(NAME##_one_any, T, LOAD, STORE, CACHE, d->head_size)                             \
                                                                                            \
int NAME(const PagedDims *d, const T *query, T *out, const char *kv_cache,                       \
         const int32_t *block_tables, const int32_t *seq_lens, const int32_t *token_rows,   \
         int64_t num_reqs, int64_t max_seq_len, float scale) {                              \
    const int64_t HD = d->num_heads * d->head_size;                                         \
    const char *keys = kv_cache;                                                            \
    const char *values = kv_cache + d->num_blocks * d->block_size * d->num_kv_heads         \
                                    * ROW_BYTES_##CACHE(d->head_size);                      \
    int failed = 0;                                                                         \
    _Pragma("omp parallel")                                                                 \
    {                                                                                       \
        float *scores = malloc(sizeof(float) * (d->num_heads * max_seq_len + 2 * HD));      \
        if (scores == NULL) {                                                               \
            _Pragma("omp atomic write")                                                     \
            failed = 1;                                                                     \
        }                                                                                   \
        _Pragma("omp for schedule(dynamic, 1)")                                             \
        for (int64_t r = 0; r < num_reqs; r++) {                                            \
            if (scores == NULL) continue;                                                   \
            const int64_t t = token_rows[r];                                                \
            void (*one)(const PagedDims *, const T *, T *, const char *, const char *,           \
                        const int32_t *, int64_t, float, float *, float *, float *) =       \
                d->head_size == 64 ? NAME##_one_64                                          \
                : d->head_size == 128 ? NAME##_one_128 : NAME##_one_any;                    \
            one(d, query + t * HD, out + t * HD, keys, values,                              \
                block_tables + r * d->max_blocks, seq_lens[r], scale, scores + 2 * HD,      \
                scores, scores + HD);                                                       \
        }                                                                                   \
        free(scores);                                                                       \
    }                                                                                       \
    return failed;                                                                          \
}

#define LOAD_F32(x) (x)
#define STORE_F32(x) (x)
DEFINE_DECODE(paged_decode_f32, float, LOAD_F32, STORE_F32, F32)
DEFINE_DECODE(paged_decode_bf16, uint16_t, bf16_to_float, float_to_bf16, BF16)
DEFINE_DECODE(paged_decode_f32_int8, float, LOAD_F32, STORE_F32, INT8)
DEFINE_DECODE(paged_decode_bf16_int8, uint16_t, bf16_to_float, float_to_bf16, INT8)

/* One int8 cache row from D values: scale = max |x| * (1 / 127), code = round(x * 127 /
 * max |x|), with the same float32 operations as the torch writer (kv_quant.py), so both
 * write equal rows (the scale is written as a product: -ffast-math turns a division by a
 * constant into one anyway). */
#define DEFINE_QUANTIZE_ROW(NAME, T, LOAD, STORE)                                                  \
static void NAME(T *x, int8_t *row, int64_t D, int write_back) {                                  \
    float amax = 0.f;                                                                       \
    for (int64_t j = 0; j < D; j++) { float a = fabsf(LOAD(x[j])); amax = a > amax ? a : amax; } \
    const float inv = amax > 0.f ? 127.f / amax : 0.f, s = amax * (1.f / 127.f);                    \
    for (int64_t j = 0; j < D; j++) row[j] = (int8_t)nearbyintf(LOAD(x[j]) * inv);          \
    memcpy(row + D, &s, sizeof s);                                                          \
    if (write_back) /* x becomes what the cache gives back */                               \
        for (int64_t j = 0; j < D; j++) x[j] = STORE((float)row[j] * s);                    \
}

/* Write the new tokens' K and V ([num_tokens, Hkv, D], rows `key_stride`/`value_stride`
 * elements apart) into an int8 cache at `slots`; with `write_back`, also replace them by
 * their round-tripped values (what attention reads for cached tokens). */
#define DEFINE_STORE(NAME, T, LOAD, STORE)                                                         \
DEFINE_QUANTIZE_ROW(NAME##_row, T, LOAD, STORE)                                                   \
void NAME(const PagedDims *d, int8_t *kv_cache, T *key, T *value,                                \
          int64_t key_stride, int64_t value_stride, const int64_t *slots,                   \
          int64_t num_tokens, int32_t write_back) {                                                         \
    const int64_t D = d->head_size, Hkv = d->num_kv_heads, rb = ROW_BYTES_INT8(D);          \
    int8_t *values = kv_cache + d->num_blocks * d->block_size * Hkv * rb;                   \
    _Pragma("omp parallel for if (num_tokens > 64)")                                        \
    for (int64_t t = 0; t < num_tokens; t++) {                                              \
        for (int64_t g = 0; g < Hkv; g++) {                                                 \
            const int64_t at = (slots[t] * Hkv + g) * rb;                                   \
            NAME##_row(key + t * key_stride + g * D, kv_cache + at, D, write_back);                     \
            NAME##_row(value + t * value_stride + g * D, values + at, D, write_back);                   \
        }                                                                                   \
    }                                                                                       \
}

DEFINE_STORE(store_int8_f32, float, LOAD_F32, STORE_F32)
DEFINE_STORE(store_int8_bf16, uint16_t, bf16_to_float, float_to_bf16)

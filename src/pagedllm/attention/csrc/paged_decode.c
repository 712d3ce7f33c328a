/*
 * Decode attention straight from the paged KV cache, for CPUs.
 *
 * One query token per request attends to the request's whole context, read block by block
 * through its block table: no dense copy of the context is ever made. Per request the keys
 * of a position are read once for all heads (the cache stores a position's kv heads next to
 * each other), scores and softmax are kept in float32 and each output row is rounded once.
 * Requests are spread over OpenMP threads (the process's OpenMP runtime, i.e. torch's).
 *
 * Layout (see TorchPagedBackend): kv_cache [2, num_blocks, block_size, num_kv_heads, D],
 * query/out rows [num_tokens, num_heads, D], block_tables [num_reqs, max_blocks] int32,
 * seq_lens [num_reqs] int32 (context length including the new token), token_rows
 * [num_reqs] int32 (the request's query row in query/out).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t num_blocks, block_size, num_kv_heads, num_heads, head_size, max_blocks;
} Dims;

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

/* One request's attention. T is the storage type, LOAD/STORE convert; HEAD_DIM is the head
 * size, a constant in the specialised versions so the compiler unrolls the dot products. */
#define DEFINE_ONE(NAME, T, LOAD, STORE, HEAD_DIM)                                           \
static void NAME(const Dims *d, const T *q, T *out, const T *keys, const T *values,         \
                 const int32_t *blocks, int64_t seq_len, float scale, float *scores,        \
                 float *qf, float *acc) {                                                   \
    const int64_t D = (HEAD_DIM), H = d->num_heads, Hkv = d->num_kv_heads;                  \
    const int64_t G = H / Hkv, row = Hkv * D, bs = d->block_size;                           \
    for (int64_t i = 0; i < H * D; i++) qf[i] = LOAD(q[i]) * scale;                         \
    /* scores[h * seq_len + p] = q_h . k_p (of h's kv head) */                               \
    float kv[D]; /* one kv head's row of K or V, converted to float once */            \
    for (int64_t p = 0; p < seq_len; p++) {                                                 \
        const T *k = keys + ((int64_t)blocks[p / bs] * bs + p % bs) * row;                  \
        for (int64_t g = 0; g < Hkv; g++) {                                                 \
            for (int64_t j = 0; j < D; j++) kv[j] = LOAD(k[g * D + j]);                     \
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
        const T *v = values + ((int64_t)blocks[p / bs] * bs + p % bs) * row;                \
        for (int64_t g = 0; g < Hkv; g++) {                                                 \
            for (int64_t j = 0; j < D; j++) kv[j] = LOAD(v[g * D + j]);                     \
            for (int64_t h = g * G; h < (g + 1) * G; h++) {                                 \
                const float w = scores[h * seq_len + p];                                    \
                float *a = acc + h * D;                                                     \
                for (int64_t j = 0; j < D; j++) a[j] += w * kv[j];                          \
            }                                                                               \
        }                                                                                   \
    }                                                                                       \
    for (int64_t i = 0; i < H * D; i++) out[i] = STORE(acc[i]);                             \
}

/* The entry point per element type: requests spread over OpenMP threads. */
#define DEFINE_DECODE(NAME, T, LOAD, STORE)                                                  \
DEFINE_ONE(NAME##_one_64, T, LOAD, STORE, 64)                                               \
DEFINE_ONE(NAME##_one_128, T, LOAD, STORE, 128)                                             \
DEFINE_ONE(NAME##_one_any, T, LOAD, STORE, d->head_size)                                    \
                                                                                            \
int NAME(const Dims *d, const T *query, T *out, const T *kv_cache,                          \
         const int32_t *block_tables, const int32_t *seq_lens, const int32_t *token_rows,   \
         int64_t num_reqs, int64_t max_seq_len, float scale) {                              \
    const int64_t HD = d->num_heads * d->head_size;                                         \
    const T *keys = kv_cache;                                                               \
    const T *values = kv_cache + d->num_blocks * d->block_size * d->num_kv_heads * d->head_size; \
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
            void (*one)(const Dims *, const T *, T *, const T *, const T *, const int32_t *, \
                        int64_t, float, float *, float *, float *) =                        \
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
DEFINE_DECODE(paged_decode_f32, float, LOAD_F32, STORE_F32)
DEFINE_DECODE(paged_decode_bf16, uint16_t, bf16_to_float, float_to_bf16)

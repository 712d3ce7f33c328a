/*
 * Decode and prefill attention straight from the paged KV cache, for CPUs, and the int8
 * cache's writer.
 *
 * One query token per request attends to the request's whole context, read block by block
 * through its block table: no dense copy of the context is ever made. The keys of a
 * position are read once for all heads (the cache stores a position's kv heads next to
 * each other), scores and softmax are kept in float32 and each output row is rounded once.
 * A context is cut into partitions by its own length (DEFINE_PART), so a long context is
 * shared by the threads even when it is the only request (a position's heads stay on one
 * thread: split by head, each core would pull the others' cache lines), and a request's
 * result never depends on the batch. This code is the same on every ISA (the compiler
 * vectorizes its loops for the variant's flags); the inner products, the weighted sums of
 * values and the int8 rows' conversion are isa.h's.
 *
 * Layout (see TorchPagedBackend): kv_cache [2, num_blocks, block_size, num_kv_heads, ROW],
 * query/out rows [num_tokens, num_heads, D], block_tables [num_reqs, max_blocks] int32,
 * seq_lens [num_reqs] int32 (context length including the new token), token_rows
 * [num_reqs] int32 (the request's query row in query/out).
 *
 * A cache row (one position, one kv head) is D values in the model's dtype, or in the int8
 * cache D int8 codes followed by one float32 scale per 16 of them (value = code * scale;
 * D + D / 4 bytes).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "isa.h"
#include "kernels.h" /* PagedDims */
#include "softmax.h"

#define INT8_SCALE_BYTES 4
#define INT8_GROUP 16 /* values per scale (kv_quant.GROUP) */


/* Cache rows: ROW_BYTES(D) is the size of one, LOAD_ROW converts one to D floats. */
#define ROW_BYTES_F32(D) ((D) * 4)
#define ROW_BYTES_BF16(D) ((D) * 2)
#define ROW_BYTES_INT8(D) ((D) + INT8_SCALE_BYTES * ((D) / INT8_GROUP))

#define LOAD_ROW_F32(dst, row, D)                                                            \
    do { const float *r_ = (const float *)(row);                                            \
         for (int64_t j_ = 0; j_ < (D); j_++) (dst)[j_] = r_[j_]; } while (0)
#define LOAD_ROW_BF16(dst, row, D) bf16_row_to_float((dst), (const uint16_t *)(row), (D))
/* The int8 row's codes times their group's scale: isa.h's (gcc's vectorization of this
 * loop nest depended on its surroundings: measured scalar, 3.4x slower, in some). */
#define LOAD_ROW_INT8(dst, row, D) isa_int8_row_to_float((dst), (const int8_t *)(row), (D))

/* The cache slots of positions [k0, k0 + kt), read through the block table (one division a
 * tile). */
static inline void tile_slots(const int32_t *blocks, int64_t bs, int64_t k0, int64_t kt,
                              int64_t *slots) {
    int64_t b = k0 / bs, o = k0 % bs;
    for (int64_t t = 0; t < kt; t++) {
        slots[t] = (int64_t)blocks[b] * bs + o;
        if (++o == bs) o = 0, b++;
    }
}

/* Ask for every line of kv head g's rows at `slots` (`row_bytes` each, `Hkv` a slot): read
 * one kv head at a time the rows are too far apart for the hardware's prefetcher, and a
 * tile's conversion waited on each row's first line (measured: most of its time). Asked
 * one kv head at a time too: a whole tile's lines at once overflow the misses a core
 * tracks (measured slower with a bfloat16 cache). */
static inline void prefetch_rows(const char *cache_rows, const int64_t *slots, int64_t kt,
                                 int64_t Hkv, int64_t g, int64_t row_bytes) {
    for (int64_t t = 0; t < kt; t++) {
        const char *row = cache_rows + (slots[t] * Hkv + g) * row_bytes;
        for (int64_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(row + b);
        __builtin_prefetch(row + row_bytes - 1);
    }
}

/* Kv head g's rows at `slots` (kt of them) converted to float32 into tile [kt][D]. */
#define LOAD_TILE(CACHE, tile, cache_rows, slots, Hkv, g, D, kt)                             \
    for (int64_t t_ = 0; t_ < (kt); t_++)                                                   \
        LOAD_ROW_##CACHE((tile) + t_ * (D),                                                 \
                         (cache_rows) + ((slots)[t_] * (Hkv) + (g)) * ROW_BYTES_##CACHE(D), D)

/* Kv head g's scores against a tile of keys (kt positions at `slots`), per cache format:
 * float32 and int8 rows are converted into `tile` for isa_attn_key_scores; bfloat16 rows are
 * scored where the cache holds them (isa_attn_key_scores_bf16, from the bfloat16 query q). */
#define TILE_SCORES_CONVERTED(CACHE, q, qf, scale, G, D, tile, cache_rows, slots, Hkv, g, kt, \
                              s, n)                                                         \
    do {                                                                                    \
        LOAD_TILE(CACHE, tile, cache_rows, slots, Hkv, g, D, kt);                           \
        isa_attn_key_scores(qf, G, D, tile, kt, s, n);                                      \
    } while (0)
#define TILE_SCORES_F32(...) TILE_SCORES_CONVERTED(F32, __VA_ARGS__)
#define TILE_SCORES_INT8(...) TILE_SCORES_CONVERTED(INT8, __VA_ARGS__)
#define TILE_SCORES_BF16(q, qf, scale, G, D, tile, cache_rows, slots, Hkv, g, kt, s, n)       \
    do {                                                                                    \
        const uint16_t *rows_[KEY_TILE];                                                    \
        for (int64_t t_ = 0; t_ < (kt); t_++)                                               \
            rows_[t_] = (const uint16_t *)((cache_rows)                                     \
                                           + ((slots)[t_] * (Hkv) + (g)) * ROW_BYTES_BF16(D)); \
        isa_attn_key_scores_bf16((const uint16_t *)(q), qf, scale, G, D, rows_, kt, s, n);  \
    } while (0)

/* A request's context is attended in partitions of at most ceil(n / MAX_PARTS) positions
 * (at least min_part(d): MIN_PART_VALUES cached values per K or V, 256 positions at
 * SmolLM2's 3 kv heads x 64, 48 at Qwen3's 8 x 128, so a partition is the same amount of
 * work whatever the heads): each partition is one work item, so a lone request's attention
 * is spread over the threads too, and the split depends only on the request's own context
 * length and the model's heads, never on the batch or the thread count (a request's output
 * is the same alone or batched). An item keeps, per query head, its scores' maximum m, the
 * sum l of exp(score - m) and acc = sum exp(score - m) v; DEFINE_MERGE combines a request's
 * items in order: out = sum_i exp(m_i - M) acc_i / sum_i exp(m_i - M) l_i, M the largest
 * m_i. */
#define MAX_PARTS 8
#define MIN_PART_VALUES (256 * 3 * 64)

static inline int64_t min_part(const PagedDims *d) {
    const int64_t positions = MIN_PART_VALUES / (d->num_kv_heads * d->head_size);
    return positions > KEY_TILE ? positions : KEY_TILE;
}

static inline int64_t part_size(int64_t n, int64_t least) {
    const int64_t even = (n + MAX_PARTS - 1) / MAX_PARTS;
    return even > least ? even : least;
}

static inline int64_t num_parts(int64_t n, int64_t least) {
    return (n + part_size(n, least) - 1) / part_size(n, least);
}

/* One partition [p0, p1) of one request's attention into its partial (m [H], l [H],
 * acc [H * D]). T is the query type with its LOAD conversion, CACHE names the cache row
 * format; HEAD_DIM is the head size, a constant in the specialised versions so the
 * compiler unrolls the row conversions. The partition is read KEY_TILE positions at a
 * time; each kv head's rows of a tile serve its G query heads: the scores through
 * TILE_SCORES_<CACHE> (no horizontal sum per key; a bfloat16 cache's keys scored where
 * they lie), the values converted to float32 once for isa_attn_weighted_sum_rows (its
 * accumulators in registers across the tile). */
#define DEFINE_PART(NAME, T, LOAD, CACHE, HEAD_DIM)                                          \
static void NAME(const PagedDims *d, const T *q, const char *keys, const char *values,      \
                 const int32_t *blocks, int64_t p0, int64_t p1, float scale, float *scores, \
                 float *qf, float *partial) {                                               \
    const int64_t D = (HEAD_DIM), H = d->num_heads, Hkv = d->num_kv_heads;                  \
    const int64_t G = H / Hkv, bs = d->block_size;                                          \
    const int64_t n = p1 - p0; /* scores[h * n + p - p0] = q_h . k_p */                     \
    float *m = partial, *l = partial + H, *acc = partial + 2 * H;                           \
    for (int64_t i = 0; i < H * D; i++) qf[i] = LOAD(q[i]) * scale;                         \
    float tile[KEY_TILE * D]; /* one kv head's rows of a tile, in float32 */                \
    int64_t slots[KEY_TILE], next[KEY_TILE]; /* this tile's cache slots and the next's */   \
    tile_slots(blocks, bs, p0, n < KEY_TILE ? n : KEY_TILE, slots);                         \
    for (int64_t k0 = p0; k0 < p1; k0 += KEY_TILE) {                                        \
        const int64_t kt = p1 - k0 < KEY_TILE ? p1 - k0 : KEY_TILE;                         \
        const int64_t rest = p1 - k0 - kt, nt = rest < KEY_TILE ? rest : KEY_TILE;          \
        tile_slots(blocks, bs, k0 + kt, nt, next);                                          \
        for (int64_t g = 0; g < Hkv; g++) {                                                 \
            prefetch_rows(keys, next, nt, Hkv, g, ROW_BYTES_##CACHE(D));                    \
            TILE_SCORES_##CACHE(q + g * G * D, qf + g * G * D, scale, G, D, tile, keys,     \
                                slots, Hkv, g, kt, scores + g * G * n + k0 - p0, n);        \
        }                                                                                   \
        memcpy(slots, next, sizeof(int64_t) * nt);                                          \
    }                                                                                       \
    /* The values' first tile, every kv head: asked for before the softmax, which reads no \
     * cache, so these misses do not crowd a tile's own (as in prefetch_rows). */          \
    tile_slots(blocks, bs, p0, n < KEY_TILE ? n : KEY_TILE, slots);                         \
    for (int64_t g = 0; g < Hkv; g++)                                                       \
        prefetch_rows(values, slots, n < KEY_TILE ? n : KEY_TILE, Hkv, g, ROW_BYTES_##CACHE(D)); \
    for (int64_t h = 0; h < H; h++) { /* exp(s - m) in place, their sum l */                \
        l[h] = exp_minus_max(scores + h * n, n, &m[h]);                                     \
    }                                                                                       \
    memset(acc, 0, sizeof(float) * H * D);                                                  \
    for (int64_t k0 = p0; k0 < p1; k0 += KEY_TILE) {                                        \
        const int64_t kt = p1 - k0 < KEY_TILE ? p1 - k0 : KEY_TILE;                         \
        const int64_t rest = p1 - k0 - kt, nt = rest < KEY_TILE ? rest : KEY_TILE;          \
        tile_slots(blocks, bs, k0 + kt, nt, next);                                          \
        for (int64_t g = 0; g < Hkv; g++) {                                                 \
            prefetch_rows(values, next, nt, Hkv, g, ROW_BYTES_##CACHE(D));                  \
            LOAD_TILE(CACHE, tile, values, slots, Hkv, g, D, kt);                           \
            isa_attn_weighted_sum_rows(acc + g * G * D, G, D, scores + g * G * n + k0 - p0, \
                                       n, tile, kt);                                        \
        }                                                                                   \
        memcpy(slots, next, sizeof(int64_t) * nt);                                          \
    }                                                                                       \
}

/* A request's partials (parts of them, `stride` floats apart) combined into out [H * D]. */
#define DEFINE_MERGE(NAME, T, STORE)                                                         \
static void NAME(int64_t H, int64_t D, const float *partials, int64_t parts,                \
                 int64_t stride, T *out) {                                                  \
    if (parts == 0) { /* an empty context (never scheduled): zeros, as before */          \
        for (int64_t i = 0; i < H * D; i++) out[i] = STORE(0.f);                            \
        return;                                                                             \
    }                                                                                       \
    for (int64_t h = 0; h < H; h++) {                                                       \
        float M = -INFINITY, den = 0.f;                                                     \
        for (int64_t i = 0; i < parts; i++) {                                               \
            const float mi = partials[i * stride + h];                                      \
            M = mi > M ? mi : M;                                                            \
        }                                                                                   \
        float o[D];                                                                         \
        for (int64_t j = 0; j < D; j++) o[j] = 0.f;                                         \
        for (int64_t i = 0; i < parts; i++) {                                               \
            const float *part = partials + i * stride;                                      \
            const float c = expf(part[h] - M);                                              \
            den += c * part[H + h];                                                         \
            const float *a = part + 2 * H + h * D;                                          \
            for (int64_t j = 0; j < D; j++) o[j] += c * a[j];                               \
        }                                                                                   \
        const float inv = 1.f / den;                                                        \
        for (int64_t j = 0; j < D; j++) out[h * D + j] = STORE(o[j] * inv);                 \
    }                                                                                       \
}

/* The entry point per (query type, cache format): a request's partitions are work items
 * spread over OpenMP threads, then each request's are merged. */
#define DEFINE_DECODE(NAME, T, LOAD, STORE, CACHE)                                           \
DEFINE_PART(NAME##_part_64, T, LOAD, CACHE, 64)                                             \
DEFINE_PART(NAME##_part_128, T, LOAD, CACHE, 128)                                           \
DEFINE_PART(NAME##_part_256, T, LOAD, CACHE, 256) /* Gemma's */                             \
DEFINE_PART(NAME##_part_any, T, LOAD, CACHE, d->head_size)                                  \
DEFINE_MERGE(NAME##_merge, T, STORE)                                                        \
                                                                                            \
int NAME(const PagedDims *d, const T *query, T *out, const char *kv_cache,                       \
         const int32_t *block_tables, const int32_t *seq_lens, const int32_t *token_rows,   \
         int64_t num_reqs, int64_t max_seq_len, float scale) {                              \
    const int64_t H = d->num_heads, HD = H * d->head_size, stride = 2 * H + HD;             \
    const char *keys = kv_cache;                                                            \
    const char *values = kv_cache + d->num_blocks * d->block_size * d->num_kv_heads         \
                                    * ROW_BYTES_##CACHE(d->head_size);                      \
    /* item_starts[r]: request r's first item; a window keeps positions [lo, seq_len) */     \
    const int64_t least = min_part(d); /* the shortest partition */                         \
    int64_t *item_starts = malloc(sizeof(int64_t) * (num_reqs + 1));                        \
    if (item_starts == NULL) return 1;                                                      \
    item_starts[0] = 0;                                                                     \
    for (int64_t r = 0; r < num_reqs; r++) {                                                \
        const int64_t len = seq_lens[r];                                                    \
        const int64_t n = d->window > 0 && len > d->window ? d->window : len;               \
        item_starts[r + 1] = item_starts[r] + num_parts(n, least);                          \
    }                                                                                       \
    const int64_t items = item_starts[num_reqs];                                            \
    /* each item's request, then the partials */                                            \
    int64_t *item_reqs = malloc(sizeof(int64_t) * (size_t)(items + 1));                     \
    float *partials = malloc(sizeof(float) * (size_t)(items * stride + 1));                 \
    if (item_reqs == NULL || partials == NULL) {                                            \
        free(item_reqs), free(partials), free(item_starts);                                 \
        return 1;                                                                           \
    }                                                                                       \
    for (int64_t r = 0; r < num_reqs; r++)                                                  \
        for (int64_t item = item_starts[r]; item < item_starts[r + 1]; item++)              \
            item_reqs[item] = r;                                                            \
    int failed = 0;                                                                         \
    void (*part)(const PagedDims *, const T *, const char *, const char *, const int32_t *, \
                 int64_t, int64_t, float, float *, float *, float *) =                      \
        d->head_size == 64 ? NAME##_part_64                                                 \
        : d->head_size == 128 ? NAME##_part_128                                             \
        : d->head_size == 256 ? NAME##_part_256 : NAME##_part_any;                          \
    _Pragma("omp parallel")                                                                 \
    {                                                                                       \
        const int64_t most = part_size(max_seq_len, least); /* the longest partition */     \
        float *scores = malloc(sizeof(float) * (d->num_heads * most + HD));                 \
        if (scores == NULL) {                                                               \
            _Pragma("omp atomic write")                                                     \
            failed = 1;                                                                     \
        }                                                                                   \
        _Pragma("omp for schedule(dynamic, 1)")                                             \
        for (int64_t item = 0; item < items; item++) {                                      \
            if (scores == NULL) continue;                                                   \
            const int64_t r = item_reqs[item];                                              \
            const int64_t len = seq_lens[r];                                                \
            const int64_t lo = d->window > 0 && len > d->window ? len - d->window : 0;      \
            const int64_t size = part_size(len - lo, least), i = item - item_starts[r];     \
            const int64_t p0 = lo + i * size, p1 = p0 + size < len ? p0 + size : len;       \
            part(d, query + token_rows[r] * HD, keys, values,                               \
                 block_tables + r * d->max_blocks, p0, p1, scale, scores + HD, scores,      \
                 partials + item * stride);                                                 \
        }                                                                                   \
        _Pragma("omp for schedule(static)")                                                 \
        for (int64_t r = 0; r < num_reqs; r++)                                              \
            NAME##_merge(H, d->head_size, partials + item_starts[r] * stride,               \
                         item_starts[r + 1] - item_starts[r], stride,                       \
                         out + token_rows[r] * HD);                                         \
        free(scores);                                                                       \
    }                                                                                       \
    free(partials);                                                                         \
    free(item_reqs);                                                                        \
    free(item_starts);                                                                      \
    return failed;                                                                          \
}

#define LOAD_F32(x) (x)
#define STORE_F32(x) (x)
DEFINE_DECODE(paged_decode_f32, float, LOAD_F32, STORE_F32, F32)
DEFINE_DECODE(paged_decode_bf16, uint16_t, bf16_to_float, float_to_bf16, BF16)
DEFINE_DECODE(paged_decode_f32_int8, float, LOAD_F32, STORE_F32, INT8)
DEFINE_DECODE(paged_decode_bf16_int8, uint16_t, bf16_to_float, float_to_bf16, INT8)

/*
 * Prefill attention from the paged cache: each request's new query tokens (already stored
 * in the cache with their K/V) attend causally to the request's context and themselves.
 *
 * Work items are (request, kv head, block of QUERY_BLOCK queries). An item converts its keys
 * KEY_TILE positions at a time to float32, transposed, so the scores of a query row against
 * a tile are D vector multiply-adds with no horizontal sums; the item's G * QUERY_BLOCK query
 * rows (the G query heads of the kv head) share every tile, four rows at a time
 * (isa_attn_scores_4; rows are padded with zeros to a multiple of 4), and the weighted sum
 * of values is isa_attn_weighted_sum_rows (all rows at once below the diagonal, each
 * key's values loaded once for a few rows). Scores and softmax are float32, each output
 * value rounded once. Items are spread over OpenMP threads.
 *
 * query rows are `q_stride` elements apart (heads dense within a token), out [T, H * D];
 * query_starts [n] int32: the batch token of each request's first query; query_lens and
 * context_lens [n] int32 (context: tokens cached before this step).
 */
#define QUERY_BLOCK 16

#define DEFINE_PREFILL_ITEM(NAME, T, LOAD, STORE, CACHE, HEAD_DIM)                           \
static void NAME(const PagedDims *d, const T *query, int64_t q_stride, T *out,              \
                 const char *keys, const char *values, const int32_t *blocks,               \
                 int64_t first, int64_t context, int64_t i0, int64_t i1, int64_t g,         \
                 float scale, float *scores, int64_t max_keys, float *qf, float *acc,       \
                 float *tile) {                                                             \
    const int64_t D = (HEAD_DIM), H = d->num_heads, Hkv = d->num_kv_heads;                  \
    const int64_t G = H / Hkv, bs = d->block_size;                                          \
    const int64_t rows = (i1 - i0) * G, num_keys = context + i1;                            \
    /* With a window, row r sees keys (pos - window, pos], pos = context + i0 + r / G: the   \
     * item's keys start at its first row's lowest visible one. */                          \
    const int64_t w_ = d->window, first_key = w_ > 0 && context + i0 + 1 > w_               \
                                                  ? context + i0 + 1 - w_ : 0;              \
    float *tile_t = tile + KEY_TILE * D;                                                    \
    for (int64_t r = 0; r < rows; r++) { /* row r: query i0 + r / G, head g * G + r % G */  \
        const T *q = query + (first + i0 + r / G) * q_stride + (g * G + r % G) * D;         \
        for (int64_t j = 0; j < D; j++) qf[r * D + j] = LOAD(q[j]) * scale;                 \
    }                                                                                       \
    const int64_t padded_rows = (rows + 3) / 4 * 4; /* isa_attn_scores_4 takes 4 rows */    \
    memset(qf + rows * D, 0, sizeof(float) * (padded_rows - rows) * D);                     \
    for (int64_t k0 = first_key; k0 < num_keys; k0 += KEY_TILE) {                           \
        const int64_t kt = num_keys - k0 < KEY_TILE ? num_keys - k0 : KEY_TILE;             \
        int64_t slots[KEY_TILE];                                                            \
        tile_slots(blocks, bs, k0, kt, slots);                                              \
        LOAD_TILE(CACHE, tile, keys, slots, Hkv, g, D, kt);                                 \
        for (int64_t j = 0; j < D; j++)                                                     \
            for (int64_t t = 0; t < KEY_TILE; t++)                                          \
                tile_t[j * KEY_TILE + t] = t < kt ? tile[t * D + j] : 0.f;                  \
        for (int64_t r = 0; r < padded_rows; r += 4) {                                      \
            float s4[4 * KEY_TILE];                                                         \
            isa_attn_scores_4(qf + r * D, D, tile_t, s4, KEY_TILE);                         \
            for (int64_t i = 0; i < 4 && r + i < rows; i++)                                 \
                memcpy(scores + (r + i) * max_keys + k0, s4 + i * KEY_TILE,                 \
                       sizeof(float) * kt);                                                 \
        }                                                                                   \
    }                                                                                       \
    for (int64_t r = 0; r < rows; r++) { /* causal: the row sees keys up to its position */ \
        const int64_t pos = context + i0 + r / G;                                           \
        const int64_t lo = w_ > 0 && pos + 1 > w_ ? pos + 1 - w_ : 0; /* >= first_key */    \
        float *s = scores + r * max_keys;                                                   \
        softmax(s + lo, pos + 1 - lo);                                                      \
        for (int64_t k = first_key; k < lo; k++) s[k] = 0.f; /* outside the window */       \
    }                                                                                       \
    memset(acc, 0, sizeof(float) * rows * D);                                               \
    for (int64_t k0 = first_key; k0 < num_keys; k0 += KEY_TILE) {                           \
        const int64_t kt = num_keys - k0 < KEY_TILE ? num_keys - k0 : KEY_TILE;             \
        int64_t slots[KEY_TILE];                                                            \
        tile_slots(blocks, bs, k0, kt, slots);                                              \
        LOAD_TILE(CACHE, tile, values, slots, Hkv, g, D, kt);                               \
        const int64_t seen = context + i0 + 1 - k0; /* keys of it the first query sees */  \
        if (seen >= kt) /* below the diagonal: every row sees the whole tile */             \
            isa_attn_weighted_sum_rows(acc, rows, D, scores + k0, max_keys, tile, kt);      \
        else /* on it: query i (its G rows) sees seen + i of the tile's keys */             \
            for (int64_t i = 0; i < i1 - i0; i++) {                                         \
                const int64_t n = seen + i < kt ? seen + i : kt;                            \
                if (n > 0)                                                                  \
                    isa_attn_weighted_sum_rows(acc + i * G * D, G, D,                       \
                                               scores + i * G * max_keys + k0, max_keys,    \
                                               tile, n);                                    \
            }                                                                               \
    }                                                                                       \
    for (int64_t r = 0; r < rows; r++) {                                                    \
        T *o = out + (first + i0 + r / G) * H * D + (g * G + r % G) * D;                    \
        for (int64_t j = 0; j < D; j++) o[j] = STORE(acc[r * D + j]);                       \
    }                                                                                       \
}

#define DEFINE_PREFILL(NAME, T, LOAD, STORE, CACHE)                                          \
DEFINE_PREFILL_ITEM(NAME##_item_64, T, LOAD, STORE, CACHE, 64)                              \
DEFINE_PREFILL_ITEM(NAME##_item_128, T, LOAD, STORE, CACHE, 128)                            \
DEFINE_PREFILL_ITEM(NAME##_item_any, T, LOAD, STORE, CACHE, d->head_size)                   \
                                                                                            \
int NAME(const PagedDims *d, const T *query, int64_t q_stride, T *out, const char *kv_cache, \
         const int32_t *block_tables, const int32_t *query_starts, const int32_t *query_lens, \
         const int32_t *context_lens, int64_t num_reqs, int64_t max_seq_len, float scale) { \
    const int64_t D = d->head_size, Hkv = d->num_kv_heads, G = d->num_heads / Hkv;          \
    const char *keys = kv_cache;                                                            \
    const char *values = kv_cache + d->num_blocks * d->block_size * Hkv * ROW_BYTES_##CACHE(D); \
    int64_t *item_starts = malloc(sizeof(int64_t) * (num_reqs + 1));                        \
    if (item_starts == NULL) return 1;                                                      \
    item_starts[0] = 0;                                                                     \
    for (int64_t r = 0; r < num_reqs; r++)                                                  \
        item_starts[r + 1] = item_starts[r]                                                 \
            + Hkv * ((query_lens[r] + QUERY_BLOCK - 1) / QUERY_BLOCK);                      \
    const int64_t rows = QUERY_BLOCK * G;                                                   \
    int failed = 0;                                                                         \
    _Pragma("omp parallel")                                                                 \
    {                                                                                       \
        float *scores = malloc(sizeof(float) * (rows * max_seq_len + 2 * rows * D           \
                                                + 2 * KEY_TILE * D));                       \
        if (scores == NULL) {                                                               \
            _Pragma("omp atomic write")                                                     \
            failed = 1;                                                                     \
        }                                                                                   \
        _Pragma("omp for schedule(dynamic, 1)")                                             \
        for (int64_t item = 0; item < item_starts[num_reqs]; item++) {                      \
            if (scores == NULL) continue;                                                   \
            int64_t r = 0;                                                                  \
            while (item_starts[r + 1] <= item) r++;                                         \
            const int64_t local = item - item_starts[r], g = local % Hkv;                   \
            const int64_t i0 = (local / Hkv) * QUERY_BLOCK;                                 \
            const int64_t i1 = i0 + QUERY_BLOCK < query_lens[r] ? i0 + QUERY_BLOCK : query_lens[r]; \
            float *qf = scores + rows * max_seq_len, *acc = qf + rows * D;                  \
            void (*run)(const PagedDims *, const T *, int64_t, T *, const char *,           \
                        const char *, const int32_t *, int64_t, int64_t, int64_t, int64_t,  \
                        int64_t, float, float *, int64_t, float *, float *, float *) =      \
                D == 64 ? NAME##_item_64 : D == 128 ? NAME##_item_128 : NAME##_item_any;    \
            run(d, query, q_stride, out, keys, values, block_tables + r * d->max_blocks,    \
                query_starts[r], context_lens[r], i0, i1, g, scale, scores, max_seq_len,    \
                qf, acc, acc + rows * D);                                                   \
        }                                                                                   \
        free(scores);                                                                       \
    }                                                                                       \
    free(item_starts);                                                                      \
    return failed;                                                                          \
}

#define PREFILL_ARGS                                                                         \
    const PagedDims *d, const uint16_t *query, int64_t q_stride, uint16_t *out,              \
        const char *kv_cache, const int32_t *block_tables, const int32_t *query_starts,      \
        const int32_t *query_lens, const int32_t *context_lens, int64_t num_reqs,            \
        int64_t max_seq_len, float scale
#define PREFILL_CALL                                                                         \
    d, query, q_stride, out, kv_cache, block_tables, query_starts, query_lens, context_lens, \
        num_reqs, max_seq_len, scale
static int paged_prefill_bf16_vector(PREFILL_ARGS);
static int paged_prefill_bf16_int8_vector(PREFILL_ARGS);
DEFINE_PREFILL(paged_prefill_bf16_vector, uint16_t, bf16_to_float, float_to_bf16, BF16)
DEFINE_PREFILL(paged_prefill_bf16_int8_vector, uint16_t, bf16_to_float, float_to_bf16, INT8)
DEFINE_PREFILL(paged_prefill_f32, float, LOAD_F32, STORE_F32, F32)
DEFINE_PREFILL(paged_prefill_f32_int8, float, LOAD_F32, STORE_F32, INT8)

/* The bfloat16 queries' prefill: on AMX's tiles where this build and the shapes have them
 * (amx_attention.c), else the vector kernels above. */
int paged_prefill_bf16(PREFILL_ARGS) {
    const int tiles = paged_prefill_bf16_tiles(PREFILL_CALL);
    return tiles >= 0 ? tiles : paged_prefill_bf16_vector(PREFILL_CALL);
}

int paged_prefill_bf16_int8(PREFILL_ARGS) {
    const int tiles = paged_prefill_bf16_int8_tiles(PREFILL_CALL);
    return tiles >= 0 ? tiles : paged_prefill_bf16_int8_vector(PREFILL_CALL);
}

/* One int8 cache row from D values, per group of INT8_GROUP: scale = max |x| * (1 / 127),
 * code = round(x * 127 / max |x|), with the same float32 operations as the torch writer
 * (kv_quant.py), so both write equal rows (the scale is written as a product: -ffast-math
 * turns a division by a constant into one anyway). */
#define DEFINE_QUANTIZE_ROW(NAME, T, LOAD, STORE)                                           \
static void NAME(T *x, int8_t *row, int64_t D, int write_back) {                           \
    for (int64_t g = 0; g < D / INT8_GROUP; g++) {                                          \
        T *xg = x + g * INT8_GROUP;                                                         \
        int8_t *codes = row + g * INT8_GROUP;                                               \
        float amax = 0.f;                                                                   \
        for (int j = 0; j < INT8_GROUP; j++) {                                              \
            const float a = fabsf(LOAD(xg[j]));                                             \
            amax = a > amax ? a : amax;                                                     \
        }                                                                                   \
        const float inv = amax > 0.f ? 127.f / amax : 0.f, s = amax * (1.f / 127.f);        \
        for (int j = 0; j < INT8_GROUP; j++) codes[j] = (int8_t)nearbyintf(LOAD(xg[j]) * inv); \
        memcpy(row + D + INT8_SCALE_BYTES * g, &s, sizeof s);                               \
        if (write_back) /* x becomes what the cache gives back */                           \
            for (int j = 0; j < INT8_GROUP; j++) xg[j] = STORE((float)codes[j] * s);        \
    }                                                                                       \
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

/*
 * Prefill attention of bfloat16 queries on Intel AMX's tiles, from a bfloat16 or int8 paged
 * cache (the amx_bf16 variant; every other build compiles this file to "not here", and
 * paged_attention.c's vector kernels run). Same inputs and work items as
 * paged_prefill_bf16 / paged_prefill_bf16_int8 (paged_attention.c): each request's new
 * query rows attend causally to its context and themselves.
 *
 * Two passes:
 * - each (request, kv head)'s keys and values are packed once into the tiles' B layout
 *   (tdpbf16ps takes B as K / 2 rows of column pairs): keys as 16-key tiles of their
 *   dimension pairs transposed (for Q K^T), values as 32-key tiles of position pairs
 *   interleaved per 16 dimensions (for P V). Positions past the context are zeros. An int8
 *   cache's rows are converted to float32 as the vector kernel converts them
 *   (isa_int8_row_to_float) and each value is packed in two bfloat16 parts (hi + lo, exact
 *   to about 16 bits), whose products add into the same sums (the lo values times the lo
 *   probabilities, below 2^-16 of the result, are left out).
 * - each item (request, kv head, 16 queries: the query heads of the kv head, G rows a
 *   query) packs its query rows as A tiles, computes its scores 32 keys at a time (two
 *   accumulator tiles of float32 sums, then times the scale), takes the float32 softmax of
 *   each row (softmax.h's steps, in three passes), and multiplies the probabilities by the
 *   values (four 16-dimension accumulators a pass, two in turn): each probability is
 *   split into two bfloat16 parts (p = hi + lo, exact to about 16 bits; one part alone
 *   would round it to 8) whose products add into the same float32 accumulators.
 *
 * The tiles of a row tile multiply the values past each row's position by zero
 * probabilities, so a non-finite value there would reach earlier rows (0 x NaN): the values
 * are packed with such rows zeroed and counted, and a row that sees one is written as NaN
 * (all its values; the vector kernel's are non-finite where the values are). A step packs
 * at most MAX_PACKED_BYTES at once, or one (request, kv head)'s context where that is more.
 *
 * A row's result does not depend on the batch or on how its prompt was chunked: every
 * tile's element is its own row's sums over the same key tiles, which start at multiples of
 * 32 positions whatever the item, and the tiles past a row's position add products of zero
 * probabilities (exact zeros), so skipping them for a whole row tile changes no row.
 *
 * Takes head sizes that are multiples of 32; anything else returns -1 and the vector kernels
 * run.
 */
#include <stdint.h>

#include "isa.h"
#include "kernels.h"

#ifdef ISA_AMX_BF16
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>

#include "amx_tiles.h"
#include "bf16.h"

#define QUERY_BLOCK 16 /* queries an item, as paged_attention.c's */
#define TILE 16        /* rows of a tile; 64 bytes a row */
#define KEYS_QK 16     /* keys of a score tile (the B tile's 16 columns) */
#define KEYS_PV 32     /* keys of a value tile (the A tile's 32 bfloat16 columns) */
#define ACCUMULATORS 4 /* 16-dimension output slices a pass keeps in tiles */
/* The most a call packs at once (contexts and new tokens, every kv head): a step past it
 * runs in groups of (request, kv head) units (a unit larger alone is packed alone). */
#define MAX_PACKED_BYTES (64LL << 20)

/* Tile registers: accumulators C0..C3, A tiles for the hi and lo probabilities (the query
 * in the scores pass), two B tiles (two accumulators in turn: a tdpbf16ps waits for the
 * last one into the same accumulator). Literal numbers: the intrinsics paste them. */
#define A_HI 4
#define A_LO 5
#define B_T 6
#define B_2 7

/* Accumulators Ca (and Cb: `two`) += (hi + lo probabilities) x the values' tiles v (and
 * v + 512), + hi x their lo parts v_lo where the cache's values are split. Each sum takes its
 * products in the same order whatever the pairing. */
#define PV_TWO(Ca, Cb, v, v_lo, two, split)                                                  \
    do {                                                                                    \
        _tile_loadd(B_T, (v), 64);                                                          \
        _tile_dpbf16ps(Ca, A_HI, B_T);                                                      \
        if (two) {                                                                          \
            _tile_loadd(B_2, (v) + 512, 64);                                                \
            _tile_dpbf16ps(Cb, A_HI, B_2);                                                  \
        }                                                                                   \
        _tile_dpbf16ps(Ca, A_LO, B_T);                                                      \
        if (two) _tile_dpbf16ps(Cb, A_LO, B_2);                                             \
        if (split) {                                                                        \
            _tile_loadd(B_T, (v_lo), 64);                                                   \
            _tile_dpbf16ps(Ca, A_HI, B_T);                                                  \
            if (two) {                                                                      \
                _tile_loadd(B_2, (v_lo) + 512, 64);                                         \
                _tile_dpbf16ps(Cb, A_HI, B_2);                                              \
            }                                                                               \
        }                                                                                   \
    } while (0)

/* Every tile 16 rows of 64 bytes. */
static void configure_tiles(void) {
    const int rows[8] = {TILE, TILE, TILE, TILE, TILE, TILE, TILE, TILE};
    configure_tile_rows(rows);
}

static inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* x as hi + lo, two bfloat16 values (exact to about 16 bits). */
static inline void split_bf16(float x, uint16_t *hi, uint16_t *lo) {
    *hi = float_to_bf16(x);
    *lo = float_to_bf16(x - bf16_to_float(*hi));
}

/* The cache's format: bytes a row (one position, one kv head) and whether its values come
 * in two bfloat16 parts (int8 rows: D codes, then a float32 scale per 16 of them). */
typedef struct {
    int64_t row_bytes;
    int split;
} CacheFormat;

/* Bytes of one part of a (request, kv head)'s packed keys, and of its values, for n
 * positions at head size D. */
static inline int64_t keys_bytes(int64_t n, int64_t D) { return round_up(n, KEYS_QK) * D * 2; }
static inline int64_t values_bytes(int64_t n, int64_t D) { return round_up(n, KEYS_PV) * D * 2; }
/* A unit's packed keys, values, and its values' non-finite position counts (n + 1 int32). */
static inline int64_t packed_bytes(int64_t n, int64_t D, int split) {
    return (keys_bytes(n, D) + values_bytes(n, D)) * (split ? 2 : 1) + round_up(4 * (n + 1), 64);
}

/* Position k's row (kv head g) as D bfloat16 values: hi (and lo where the format splits),
 * through the block table. */
static inline void cache_row(uint16_t *hi, uint16_t *lo, const char *rows,
                             const int32_t *blocks, int64_t bs, int64_t Hkv, int64_t g,
                             int64_t D, int64_t k, CacheFormat f) {
    const char *row = rows + (((int64_t)blocks[k / bs] * bs + k % bs) * Hkv + g) * f.row_bytes;
    if (!f.split) {
        memcpy(hi, row, 2 * D);
        return;
    }
    float x[512];
    isa_int8_row_to_float(x, (const int8_t *)row, D);
    for (int64_t j = 0; j < D; j++) split_bf16(x[j], hi + j, lo + j);
}

/* Keys [0, n) of kv head g as score B tiles (the hi part at dst, the lo part keys_bytes
 * after it where the format splits): tile t, chunk c (32 dimensions) is 16 rows of 16 pairs,
 * row kk holding pair kk (dimensions c * 32 + 2kk, +1) of keys 16t .. 16t + 15. */
static void pack_keys(uint32_t *dst, const char *keys, const int32_t *blocks, int64_t bs,
                      int64_t Hkv, int64_t g, int64_t D, int64_t n, CacheFormat f) {
    const int64_t chunks = D / 32, padded = round_up(n, KEYS_QK);
    uint32_t *dst_lo = dst + keys_bytes(n, D) / 4;
    uint16_t hi[512], lo[512];
    for (int64_t k = 0; k < padded; k++) {
        const int64_t at = (k / KEYS_QK) * chunks * 256 + k % KEYS_QK;
        if (k < n) {
            cache_row(hi, lo, keys, blocks, bs, Hkv, g, D, k, f);
        } else {
            memset(hi, 0, 2 * D), memset(lo, 0, 2 * D);
        }
        for (int64_t p = 0; p < D / 2; p++) {
            const int64_t i = at + (p / 16) * 256 + (p % 16) * 16;
            memcpy(dst + i, hi + 2 * p, 4);
            if (f.split) memcpy(dst_lo + i, lo + 2 * p, 4);
        }
    }
}

/* Values [0, n) of kv head g as value B tiles (parts as pack_keys'): tile t, slice s (16
 * dimensions) is 16 rows of 16 pairs, row kk holding positions 32t + 2kk and + 1 of each
 * dimension side by side. A row with a non-finite value is packed as zeros and counted:
 * bad[k] non-finite rows before position k (a tile's rows multiply the values past their
 * own positions by zero probabilities, and 0 x NaN would reach them; item() writes the rows
 * that see such a position as NaN instead). The test
 * is on the bits: -ffast-math lets the compiler assume isnan() false. */
static void pack_values(uint16_t *dst, int32_t *bad, const char *values, const int32_t *blocks,
                        int64_t bs, int64_t Hkv, int64_t g, int64_t D, int64_t n,
                        CacheFormat f) {
    const int64_t slices = D / 16, padded = round_up(n, KEYS_PV);
    uint16_t *dst_lo = dst + values_bytes(n, D) / 2;
    bad[0] = 0;
    uint16_t hi[512], lo[512];
    for (int64_t k = 0; k < padded; k++) {
        const int64_t at = (k / KEYS_PV) * slices * 512 + ((k % KEYS_PV) / 2) * 32 + k % 2;
        int nonfinite = 0;
        if (k < n) {
            cache_row(hi, lo, values, blocks, bs, Hkv, g, D, k, f);
            for (int64_t j = 0; j < D; j++) nonfinite |= (hi[j] & 0x7F80) == 0x7F80;
            bad[k + 1] = bad[k] + nonfinite;
        }
        if (k >= n || nonfinite) memset(hi, 0, 2 * D), memset(lo, 0, 2 * D);
        for (int64_t j = 0; j < D; j++) {
            dst[at + (j / 16) * 512 + (j % 16) * 2] = hi[j];
            if (f.split) dst_lo[at + (j / 16) * 512 + (j % 16) * 2] = lo[j];
        }
    }
}

/* A thread's buffers for one item: scores [rows][keys], the query A rows, the hi and lo
 * probabilities [rows][keys], a tile's float32 sums. */
typedef struct {
    float *scores, *sums;
    uint16_t *query, *p_hi, *p_lo;
    int64_t keys; /* the scores' and probabilities' row length: max_seq_len rounded up */
} ItemBuffers;

static int alloc_buffers(ItemBuffers *b, int64_t rows, int64_t max_seq_len, int64_t D) {
    const int64_t padded_rows = round_up(rows, TILE);
    b->keys = round_up(max_seq_len, KEYS_PV);
    b->scores = malloc(sizeof(float) * padded_rows * b->keys);
    b->sums = aligned_alloc(64, sizeof(float) * TILE * 16);
    b->query = malloc(2 * padded_rows * D);
    b->p_hi = malloc(2 * padded_rows * b->keys);
    b->p_lo = malloc(2 * padded_rows * b->keys);
    return b->scores && b->sums && b->query && b->p_hi && b->p_lo;
}

static void free_buffers(ItemBuffers *b) {
    free(b->scores), free(b->sums), free(b->query), free(b->p_hi), free(b->p_lo);
}

/* One item: queries [i0, i1) of the request whose first query is batch token `first`,
 * with `context` cached positions, for kv head g; keys/values packed as above. */
static void item(const PagedDims *d, const uint16_t *query, int64_t q_stride, uint16_t *out,
                 const char *packed, int64_t n_keys, int split, int64_t first,
                 int64_t context, int64_t i0, int64_t i1, int64_t g, float scale,
                 ItemBuffers *b) {
    const uint32_t *packed_keys = (const uint32_t *)packed;
    const uint32_t *keys_lo = packed_keys + keys_bytes(n_keys, d->head_size) / 4;
    const uint16_t *packed_values = (const uint16_t *)(packed + keys_bytes(n_keys, d->head_size)
                                                       * (split ? 2 : 1));
    const uint16_t *values_lo = packed_values + values_bytes(n_keys, d->head_size) / 2;
    const int32_t *bad = (const int32_t *)(packed_values + values_bytes(n_keys, d->head_size)
                                                             / 2 * (split ? 2 : 1));
    uint8_t sees_bad[TILE]; /* a row of the tile sees a non-finite value */
    const int64_t D = d->head_size, H = d->num_heads, G = H / d->num_kv_heads;
    const int64_t rows = (i1 - i0) * G, row_tiles = (rows + TILE - 1) / TILE;
    const int64_t chunks = D / 32, slices = D / 16, stride = b->keys;
    /* Keys before the first row's window start are skipped a 32-key tile at a time. */
    const int64_t w = d->window, first_visible = w > 0 && context + i0 + 1 > w
                                                     ? context + i0 + 1 - w : 0;
    const int64_t k_start = first_visible / KEYS_PV * KEYS_PV;
    for (int64_t r = 0; r < row_tiles * TILE; r++) { /* row r: query i0 + r / G, head r % G */
        uint16_t *dst = b->query + r * D;
        if (r < rows)
            memcpy(dst, query + (first + i0 + r / G) * q_stride + (g * G + r % G) * D, 2 * D);
        else
            memset(dst, 0, 2 * D);
    }
    for (int64_t rt = 0; rt < row_tiles; rt++) {
        const int64_t r0 = rt * TILE, r1 = r0 + TILE < rows ? r0 + TILE : rows;
        const int64_t last = context + i0 + (r1 - 1) / G; /* the tile's last row's position */
        /* Scores of the tile's rows against every key up to its last row's position. */
        for (int64_t k0 = k_start; k0 <= last; k0 += 2 * KEYS_QK) { /* two key tiles */
            const int two = k0 + KEYS_QK <= last;
            _tile_zero(0);
            _tile_zero(1);
            for (int64_t c = 0; c < chunks; c++) {
                _tile_loadd(A_HI, b->query + r0 * D + c * 32, 2 * D);
                const int64_t at = ((k0 / KEYS_QK) * chunks + c) * 256, next = chunks * 256;
                _tile_loadd(B_T, packed_keys + at, 64);
                _tile_dpbf16ps(0, A_HI, B_T);
                if (two) {
                    _tile_loadd(B_2, packed_keys + at + next, 64);
                    _tile_dpbf16ps(1, A_HI, B_2);
                }
                if (split) {
                    _tile_loadd(B_T, keys_lo + at, 64);
                    _tile_dpbf16ps(0, A_HI, B_T);
                    if (two) {
                        _tile_loadd(B_2, keys_lo + at + next, 64);
                        _tile_dpbf16ps(1, A_HI, B_2);
                    }
                }
            }
            /* straight into the scores (rows past the item's and keys past `last` are
             * written too: the buffer holds whole tiles; softmax never reads them) */
            _tile_stored(0, b->scores + r0 * stride + k0, 4 * stride);
            if (two) _tile_stored(1, b->scores + r0 * stride + k0 + KEYS_QK, 4 * stride);
        }
        /* Each row's softmax over its visible keys; the probabilities in two parts. */
        const int64_t k_end = round_up(last + 1, KEYS_PV);
        for (int64_t r = r0; r < r0 + TILE; r++) {
            uint16_t *hi = b->p_hi + r * stride, *lo = b->p_lo + r * stride;
            if (r >= r1) {
                memset(hi + k_start, 0, 2 * (k_end - k_start));
                memset(lo + k_start, 0, 2 * (k_end - k_start));
                continue;
            }
            const int64_t pos = context + i0 + r / G;
            const int64_t low = w > 0 && pos + 1 > w ? pos + 1 - w : 0;
            sees_bad[r - r0] = bad[pos + 1] > bad[low];
            /* softmax.h's steps with the scale and the normalization folded into the
             * passes around the exponentials */
            float *s = b->scores + r * stride, mx = -INFINITY, sum = 0.f;
            for (int64_t k = low; k <= pos; k++) {
                s[k] *= scale;
                mx = s[k] > mx ? s[k] : mx;
            }
            for (int64_t k = low; k <= pos; k++) {
                s[k] = expf(s[k] - mx);
                sum += s[k];
            }
            const float inv = 1.f / sum;
            for (int64_t k = k_start; k < k_end; k++) {
                split_bf16(k >= low && k <= pos ? s[k] * inv : 0.f, hi + k, lo + k);
            }
        }
        /* The probabilities times the values, ACCUMULATORS slices of 16 dimensions a pass. */
        for (int64_t s0 = 0; s0 < slices; s0 += ACCUMULATORS) {
            const int64_t n = slices - s0 < ACCUMULATORS ? slices - s0 : ACCUMULATORS;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int64_t k0 = k_start; k0 < k_end; k0 += KEYS_PV) {
                _tile_loadd(A_HI, b->p_hi + r0 * stride + k0, 2 * stride);
                _tile_loadd(A_LO, b->p_lo + r0 * stride + k0, 2 * stride);
                const int64_t at = ((k0 / KEYS_PV) * slices + s0) * 512;
                /* (literal tile numbers: a loop over them would not compile) */
                PV_TWO(0, 1, packed_values + at, values_lo + at, n > 1, split);
                if (n > 2)
                    PV_TWO(2, 3, packed_values + at + 1024, values_lo + at + 1024, n > 3, split);
            }
            for (int64_t j = 0; j < n; j++) {
                if (j == 0) _tile_stored(0, b->sums, 64);
                if (j == 1) _tile_stored(1, b->sums, 64);
                if (j == 2) _tile_stored(2, b->sums, 64);
                if (j == 3) _tile_stored(3, b->sums, 64);
                for (int64_t r = r0; r < r1; r++) {
                    uint16_t *o = out + (first + i0 + r / G) * H * D + (g * G + r % G) * D
                                  + (s0 + j) * 16;
                    for (int64_t t = 0; t < 16; t++)
                        o[t] = sees_bad[r - r0] ? 0x7FC0 /* NaN */
                                                : float_to_bf16(b->sums[(r - r0) * 16 + t]);
                }
            }
        }
    }
}

/* Units [u0, u1) (unit u: request u / Hkv, kv head u % Hkv): each packed at `packed` +
 * packed_at[u] - packed_at[u0], then its items (unit u's are [item_starts[u],
 * item_starts[u + 1]), 16 queries each). */
static int attend_group(const PagedDims *d, const uint16_t *query, int64_t q_stride,
                        uint16_t *out, const char *keys, const char *values,
                        const int32_t *block_tables, const int32_t *query_starts,
                        const int32_t *query_lens, const int32_t *context_lens,
                        int64_t max_seq_len, float scale, CacheFormat f, char *packed,
                        const int64_t *packed_at, const int64_t *item_starts, int64_t u0,
                        int64_t u1) {
    const int64_t D = d->head_size, Hkv = d->num_kv_heads, bs = d->block_size;
    int failed = 0;
    #pragma omp parallel
    {
        #pragma omp for schedule(dynamic, 1)
        for (int64_t u = u0; u < u1; u++) {
            const int64_t r = u / Hkv, g = u % Hkv, n = context_lens[r] + query_lens[r];
            const int32_t *blocks = block_tables + r * d->max_blocks;
            char *at = packed + (packed_at[u] - packed_at[u0]);
            const int64_t values_at = keys_bytes(n, D) * (f.split ? 2 : 1);
            pack_keys((uint32_t *)at, keys, blocks, bs, Hkv, g, D, n, f);
            pack_values((uint16_t *)(at + values_at),
                        (int32_t *)(at + values_at + values_bytes(n, D) * (f.split ? 2 : 1)),
                        values, blocks, bs, Hkv, g, D, n, f);
        }
        ItemBuffers b;
        const int ok = alloc_buffers(&b, QUERY_BLOCK * (d->num_heads / Hkv), max_seq_len, D);
        if (!ok) {
            #pragma omp atomic write
            failed = 1;
        } else {
            configure_tiles();
        }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t it = item_starts[u0]; it < item_starts[u1]; it++) {
            if (!ok) continue;
            int64_t u = u0;
            while (item_starts[u + 1] <= it) u++;
            const int64_t r = u / Hkv, g = u % Hkv;
            const int64_t i0 = (it - item_starts[u]) * QUERY_BLOCK;
            const int64_t i1 = i0 + QUERY_BLOCK < query_lens[r] ? i0 + QUERY_BLOCK : query_lens[r];
            const int64_t n = context_lens[r] + query_lens[r];
            item(d, query, q_stride, out, packed + (packed_at[u] - packed_at[u0]), n, f.split,
                 query_starts[r], context_lens[r], i0, i1, g, scale, &b);
        }
        if (ok) _tile_release();
        free_buffers(&b);
    }
    return failed;
}

/* The causal attention of every request's query rows to its context and themselves, keys
 * and values as the paged cache holds them (rows `f.row_bytes` apart). */
static int attend_tiles(const PagedDims *d, const uint16_t *query, int64_t q_stride,
                        uint16_t *out, const char *keys, const char *values,
                        const int32_t *block_tables, const int32_t *query_starts,
                        const int32_t *query_lens, const int32_t *context_lens,
                        int64_t num_reqs, int64_t max_seq_len, float scale, CacheFormat f) {
    const int64_t D = d->head_size, Hkv = d->num_kv_heads, units = num_reqs * Hkv;
    if (D % 32 != 0 || D > 512 || num_reqs == 0 || !bf16_matrix_units()) return -1;
    /* Where each (request, kv head) unit's packed keys and values start, and its first
     * item. */
    int64_t *packed_at = malloc(sizeof(int64_t) * (units + 1));
    int64_t *item_starts = malloc(sizeof(int64_t) * (units + 1));
    if (packed_at == NULL || item_starts == NULL) {
        free(packed_at), free(item_starts);
        return -1;
    }
    packed_at[0] = 0, item_starts[0] = 0;
    int64_t largest = 0; /* the most one group of units packs */
    for (int64_t u = 0, group_start = 0; u < units; u++) {
        const int64_t r = u / Hkv, n = context_lens[r] + query_lens[r];
        packed_at[u + 1] = packed_at[u] + packed_bytes(n, D, f.split);
        item_starts[u + 1] = item_starts[u] + (query_lens[r] + QUERY_BLOCK - 1) / QUERY_BLOCK;
        if (packed_at[u + 1] - packed_at[group_start] > MAX_PACKED_BYTES && u > group_start)
            group_start = u;
        const int64_t size = packed_at[u + 1] - packed_at[group_start];
        largest = size > largest ? size : largest;
    }
    char *packed = aligned_alloc(64, round_up(largest, 64));
    if (packed == NULL) { /* nothing written yet: the vector kernel runs */
        free(packed_at), free(item_starts);
        return -1;
    }
    int failed = 0;
    /* Groups of units packed at once, within MAX_PACKED_BYTES unless one unit alone is
     * larger (one kv head's context: the memory stays within the larger of the two), and no
     * row's result depends on the grouping (an item reads only its own unit). */
    for (int64_t u0 = 0; u0 < units && !failed;) {
        int64_t u1 = u0 + 1;
        while (u1 < units && packed_at[u1 + 1] - packed_at[u0] <= MAX_PACKED_BYTES) u1++;
        failed = attend_group(d, query, q_stride, out, keys, values, block_tables,
                              query_starts, query_lens, context_lens, max_seq_len, scale, f,
                              packed, packed_at, item_starts, u0, u1);
        u0 = u1;
    }
    free(packed), free(packed_at), free(item_starts);
    return failed;
}

#define TILES_ARGS                                                                           \
    const PagedDims *d, const uint16_t *query, int64_t q_stride, uint16_t *out,              \
        const char *kv_cache, const int32_t *block_tables, const int32_t *query_starts,      \
        const int32_t *query_lens, const int32_t *context_lens, int64_t num_reqs,            \
        int64_t max_seq_len, float scale

/* The paged cache [2, num_blocks, block_size, Hkv, row]: its keys, then its values. */
static int prefill_tiles(TILES_ARGS, CacheFormat f) {
    const char *values = kv_cache + d->num_blocks * d->block_size * d->num_kv_heads * f.row_bytes;
    return attend_tiles(d, query, q_stride, out, kv_cache, values, block_tables, query_starts,
                        query_lens, context_lens, num_reqs, max_seq_len, scale, f);
}

int paged_prefill_bf16_tiles(TILES_ARGS) {
    const CacheFormat f = {2 * d->head_size, 0};
    return prefill_tiles(d, query, q_stride, out, kv_cache, block_tables, query_starts,
                         query_lens, context_lens, num_reqs, max_seq_len, scale, f);
}

int paged_prefill_bf16_int8_tiles(TILES_ARGS) {
    /* kv_quant's rows: D codes, a float32 scale per 16 */
    const CacheFormat f = {d->head_size + 4 * (d->head_size / 16), 1};
    if (d->head_size % 16 != 0) return -1;
    return prefill_tiles(d, query, q_stride, out, kv_cache, block_tables, query_starts,
                         query_lens, context_lens, num_reqs, max_seq_len, scale, f);
}

#else /* not built for AMX */

#define UNUSED_TILES_ARGS                                                                    \
    (void)d, (void)query, (void)q_stride, (void)out, (void)kv_cache, (void)block_tables;     \
    (void)query_starts, (void)query_lens, (void)context_lens, (void)num_reqs;                \
    (void)max_seq_len, (void)scale

int paged_prefill_bf16_tiles(const PagedDims *d, const uint16_t *query, int64_t q_stride,
                             uint16_t *out, const char *kv_cache, const int32_t *block_tables,
                             const int32_t *query_starts, const int32_t *query_lens,
                             const int32_t *context_lens, int64_t num_reqs,
                             int64_t max_seq_len, float scale) {
    UNUSED_TILES_ARGS;
    return -1;
}

int paged_prefill_bf16_int8_tiles(const PagedDims *d, const uint16_t *query, int64_t q_stride,
                                  uint16_t *out, const char *kv_cache,
                                  const int32_t *block_tables, const int32_t *query_starts,
                                  const int32_t *query_lens, const int32_t *context_lens,
                                  int64_t num_reqs, int64_t max_seq_len, float scale) {
    UNUSED_TILES_ARGS;
    return -1;
}

#endif

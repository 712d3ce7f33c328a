/*
 * Dense bfloat16 matmuls on Intel AMX's tiles (the amx_bf16 variant; every other build
 * compiles this file to "no matrix units"). bf16_matmul.c hands a whole step here first.
 *
 * The weights are bf16_matmul.c's panels unchanged: a panel's pair j is 16 rows x 2 inputs,
 * 64 bytes, which is exactly one row of an AMX B tile (tdpbf16ps takes B as K / 2 rows of
 * column pairs). So 16 consecutive pairs of a panel are one B tile, loaded from contiguous
 * memory, and the activations are A tiles read in place (16 tokens x 32 inputs).
 * A block is 2 x 16 tokens x 2 panels: four float32 accumulator tiles, two A tiles and two B
 * tiles, the eight tiles AMX has; each step of 32 inputs loads four tiles and runs four
 * tdpbf16ps. Tails (fewer tokens, one panel) configure shorter tiles; the last K % 32
 * inputs are added to the float32 sums with vdpbf16ps before rounding.
 *
 * The arithmetic is the matrix unit's (its own order and rounding inside a step of 32
 * inputs; measured equal to oneDNN's AMX matmul, not to vdpbf16ps). It does not depend on
 * the step's size: each output row is its own token's A row times the same B tiles in the
 * same order, so a token's result is the same alone or in any batch.
 *
 * Linux lets a process use the tiles only after asking (arch_prctl ARCH_REQ_XCOMP_PERM);
 * that is asked once, and a refusal (a kernel older than 5.16, a VM without AMX state)
 * leaves the vector tiles.
 */
#include <stdint.h>

#include "isa.h"
#include "kernels.h"

#ifdef ISA_AMX_BF16
#include <immintrin.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "amx_tiles.h"
#include "avx512_bf16_store.h"

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
/* Inputs per tile step: 16 rows of 64 bytes in A (32 bfloat16), 16 pairs in B. */
#define K_STEP 32
#define TILE_ROWS 16
/* Tokens per chunk of a large step: their activations stay in the core's cache while every
 * panel passes over them (256 x K bfloat16: 288 KB at K = 576; 256 measured best of 64-512). */
#define TOKEN_CHUNK 256

/* The tile registers a block uses: accumulators C[token half][panel], A[token half], B[panel]
 * (literal numbers: gcc's tile intrinsics paste them into the instruction's register name). */
#define C00 0
#define C01 1
#define C10 2
#define C11 3
#define A0 4
#define A1 5
#define B0 6
#define B1 7

int bf16_matrix_units(void) {
    /* 0 unknown, 1 granted, -1 refused: the request is idempotent, so a race only repeats it */
    static volatile int state = 0;
    if (state == 0) state = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : -1;
    return state == 1;
}

/* Tiles for r0 tokens in the first half and r1 (maybe 0: unused) in the second. */
static void configure(int r0, int r1) {
    const int rows[8] = {[C00] = r0, [C01] = r0, [C10] = r1, [C11] = r1,
                         [A0] = r0, [A1] = r1, [B0] = TILE_ROWS, [B1] = TILE_ROWS};
    configure_tile_rows(rows);
}

/* An accumulator tile's `rows` x 16 float32 (stored at sums) into bfloat16 output rows,
 * after adding the inputs [k0, K) past the last whole tile step (K % 32 of them, in pairs)
 * with vdpbf16ps: tokens x (x_stride apart) times panel w. */
static void write_rows(float *sums, int rows, const uint16_t *x, int64_t x_stride,
                       const uint16_t *w, int64_t k0, int64_t K, uint16_t *out,
                       int64_t out_stride, int lanes) {
    for (int r = 0; r < rows; r++) {
        __m512 acc = _mm512_load_ps(sums + r * 16);
        for (int64_t k = k0; k < K; k += 2) {
            uint32_t pair;
            memcpy(&pair, x + r * x_stride + k, sizeof pair);
            acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32((int)pair),
                                   (__m512bh)_mm512_loadu_si512(w + k * PANEL_ROWS));
        }
        store_bf16x16(out + r * out_stride, acc, lanes);
    }
}

/* One block: tokens x[0 .. r0 + r1) times panels w0 (and w1 when `two`), all K inputs. The
 * tiles are configured for (r0, r1). */
static void block(const uint16_t *x, int64_t x_stride, int r0, int r1, const uint16_t *w0,
                  const uint16_t *w1, int two, int64_t K, uint16_t *out, int64_t out_stride,
                  int lanes0, int lanes1) {
    const int64_t xb = x_stride * 2; /* bytes between tokens */
    const uint16_t *x1 = x + TILE_ROWS * x_stride;
    _tile_zero(C00);
    _tile_zero(C01);
    if (r1) { /* the second half's tiles are unconfigured (0 rows) without tokens */
        _tile_zero(C10);
        _tile_zero(C11);
    }
    const int64_t whole = K - K % K_STEP; /* inputs the tiles take; write_rows adds the rest */
    for (int64_t k = 0; k < whole; k += K_STEP) {
        /* pair k / 2 of a panel starts at element k * 16: 16 pairs of 64 bytes follow */
        _tile_loadd(A0, x + k, xb);
        _tile_loadd(B0, w0 + k * PANEL_ROWS, 64);
        _tile_dpbf16ps(C00, A0, B0);
        if (two) {
            _tile_loadd(B1, w1 + k * PANEL_ROWS, 64);
            _tile_dpbf16ps(C01, A0, B1);
        }
        if (r1) {
            _tile_loadd(A1, x1 + k, xb);
            _tile_dpbf16ps(C10, A1, B0);
            if (two) _tile_dpbf16ps(C11, A1, B1);
        }
    }
    float sums[TILE_ROWS * 16] __attribute__((aligned(64)));
    _tile_stored(C00, sums, 64);
    write_rows(sums, r0, x, x_stride, w0, whole, K, out, out_stride, lanes0);
    if (two) {
        _tile_stored(C01, sums, 64);
        write_rows(sums, r0, x, x_stride, w1, whole, K, out + PANEL_ROWS, out_stride, lanes1);
    }
    if (r1) {
        uint16_t *out1 = out + TILE_ROWS * out_stride;
        _tile_stored(C10, sums, 64);
        write_rows(sums, r1, x1, x_stride, w0, whole, K, out1, out_stride, lanes0);
        if (two) {
            _tile_stored(C11, sums, 64);
            write_rows(sums, r1, x1, x_stride, w1, whole, K, out1 + PANEL_ROWS, out_stride,
                       lanes1);
        }
    }
}

int bf16_matrix_matmul(int64_t M, int64_t N, int64_t K, const uint16_t *x, int64_t x_stride,
                       const uint16_t *panels, uint16_t *out, int64_t out_stride) {
    if (K % 2 != 0 || !bf16_matrix_units()) return 1;
    const int64_t num_panels = (N + PANEL_ROWS - 1) / PANEL_ROWS;
    const int64_t units = (num_panels + 1) / 2, panel_size = K * PANEL_ROWS;
    #pragma omp parallel
    {
        int config0 = -1, config1 = -1; /* the thread's tile shapes: reconfigured on change */
        for (int64_t chunk = 0; chunk < M; chunk += TOKEN_CHUNK) {
            const int64_t end = M - chunk < TOKEN_CHUNK ? M : chunk + TOKEN_CHUNK;
            #pragma omp for schedule(static)
            for (int64_t u = 0; u < units; u++) {
                const int64_t first = 2 * u;
                const int two = first + 1 < num_panels;
                const int64_t left0 = N - first * PANEL_ROWS;
                const int lanes0 = left0 < PANEL_ROWS ? (int)left0 : PANEL_ROWS;
                const int lanes1 = two && left0 - PANEL_ROWS < PANEL_ROWS
                                       ? (int)(left0 - PANEL_ROWS) : PANEL_ROWS;
                const uint16_t *w0 = panels + first * panel_size, *w1 = w0 + panel_size;
                for (int64_t t = chunk; t < end; t += 2 * TILE_ROWS) {
                    const int64_t left = end - t;
                    const int r0 = left < TILE_ROWS ? (int)left : TILE_ROWS;
                    const int r1 = left <= TILE_ROWS ? 0
                                   : left - TILE_ROWS < TILE_ROWS ? (int)(left - TILE_ROWS)
                                                                  : TILE_ROWS;
                    if (r0 != config0 || r1 != config1) {
                        configure(r0, r1);
                        config0 = r0, config1 = r1;
                    }
                    block(x + t * x_stride, x_stride, r0, r1, w0, w1, two, K,
                          out + t * out_stride + first * PANEL_ROWS, out_stride, lanes0,
                          lanes1);
                }
            }
        }
        if (config0 >= 0) _tile_release();
    }
    return 0;
}

#else /* not built for AMX */

int bf16_matrix_units(void) { return 0; }

int bf16_matrix_matmul(int64_t M, int64_t N, int64_t K, const uint16_t *x, int64_t x_stride,
                       const uint16_t *panels, uint16_t *out, int64_t out_stride) {
    (void)M, (void)N, (void)K, (void)x, (void)x_stride, (void)panels, (void)out, (void)out_stride;
    return 1;
}

#endif

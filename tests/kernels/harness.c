/*
 * Kernel variants against the scalar reference, without Python or torch: the test harness
 * for variants that run under an emulator (the Arm ones under qemu-aarch64).
 *
 *   harness REFERENCE.so VARIANT.so
 *
 * Both libraries get the same deterministic inputs. The byte dot products (W4A8, W8A8) must
 * be bit-identical; attention and the fused ops agree to float32 / bfloat16 rounding. Prints
 * one line per check ("ok name" or "FAIL name: detail") and exits 1 on any failure.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "kernels.h"

typedef int (*matmul_fn)(int64_t, int64_t, int64_t, const uint16_t *, int64_t, const uint8_t *,
                         const float *, uint16_t *, int64_t);
typedef int (*decode_fn)(const PagedDims *, const void *, void *, const char *, const int32_t *,
                         const int32_t *, const int32_t *, int64_t, int64_t, float);
typedef int (*prefill_fn)(const PagedDims *, const void *, int64_t, void *, const char *,
                          const int32_t *, const int32_t *, const int32_t *, const int32_t *,
                          int64_t, int64_t, float);
typedef void (*norm_fn)(int64_t, int64_t, const uint16_t *, int64_t, float *, int32_t,
                        const uint16_t *, uint16_t *, float);
typedef void (*silu_fn)(int64_t, int64_t, const uint16_t *, int64_t, uint16_t *);
typedef const char *(*isa_fn)(void);

static int failures = 0;
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t next_u32(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 2685821657736338717ull) >> 32);
}

static float uniform(float lo, float hi) { return lo + (hi - lo) * (float)(next_u32() >> 8) / 16777216.f; }

static void *symbol(void *lib, const char *name) {
    void *found = dlsym(lib, name);
    if (found == NULL) {
        fprintf(stderr, "missing symbol %s\n", name);
        exit(2);
    }
    return found;
}

static void report(const char *name, int ok, const char *detail) {
    printf("%s %s%s%s\n", ok ? "ok" : "FAIL", name, ok ? "" : ": ", ok ? "" : detail);
    failures += !ok;
}

/* Largest |a - b| / (|b| + floor) over n floats. */
static float max_rel_diff(const float *a, const float *b, int64_t n, float floor) {
    float worst = 0.f;
    for (int64_t i = 0; i < n; i++) {
        const float rel = fabsf(a[i] - b[i]) / (fabsf(b[i]) + floor);
        worst = rel > worst ? rel : worst;
    }
    return worst;
}

static void bf16_to_floats(const uint16_t *x, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = bf16_to_float(x[i]);
}

/* kind: 0 int4 codes with float32 scales, 1 int8 codes, 2 int4 codes with float16 scales
 * and minimums, 3 int4 codes with float16 scales alone. */
static void check_matmul(void *ref, void *var, const char *name, int kind, int64_t M, int64_t N,
                         int64_t K) {
    const int int8 = kind == 1, half = kind >= 2;
    const int64_t panels = (N + 15) / 16, G = K / 32;
    const int64_t code_bytes = panels * G * (int8 ? 512 : 256);
    const int64_t dm_floats = panels * G * (int8 ? 16 : 32);
    uint8_t *codes = malloc(code_bytes);
    float *dm = malloc(sizeof(float) * dm_floats);
    uint16_t *dm_half = (uint16_t *)dm; /* float16 scales: the first half of the buffer */
    uint16_t *x = malloc(sizeof(uint16_t) * M * K);
    uint16_t *want = calloc(M * N, sizeof(uint16_t)), *got = calloc(M * N, sizeof(uint16_t));
    for (int64_t i = 0; i < code_bytes; i++) codes[i] = (uint8_t)next_u32();
    for (int64_t i = 0; i < dm_floats; i++) dm[i] = uniform(int8 ? 0.001f : -0.05f, 0.05f);
    if (half) /* float16 bits: either sign, exponents 2^-10 .. 2^-3, any mantissa */
        for (int64_t i = 0; i < dm_floats; i++) {
            const uint32_t r = next_u32();
            dm_half[i] = (uint16_t)(((r & 1u) << 15) | ((5u + (r >> 1) % 8u) << 10) |
                                    ((r >> 8) & 0x3FFu));
        }
    for (int64_t i = 0; i < M * K; i++) x[i] = float_to_bf16(uniform(-3.f, 3.f));
    for (int64_t i = 0; i < 32 && i < K; i++) x[i] = 0; /* a group of zeros */
    int status = ((matmul_fn)symbol(ref, name))(M, N, K, x, K, codes, dm, want, N);
    status |= ((matmul_fn)symbol(var, name))(M, N, K, x, K, codes, dm, got, N);
    char detail[128];
    snprintf(detail, sizeof detail, "M=%lld N=%lld K=%lld differ", (long long)M, (long long)N,
             (long long)K);
    char label[96];
    snprintf(label, sizeof label, "%s M=%lld", name, (long long)M);
    report(label, status == 0 && memcmp(want, got, sizeof(uint16_t) * M * N) == 0, detail);
    free(codes), free(dm), free(x), free(want), free(got);
}

/* Whether two bfloat16 values are equal or neighbours (one unit in the last place apart). */
static int within_one_ulp(uint16_t a, uint16_t b) {
    return a == b || ((a ^ b) < 0x8000u && (a > b ? a - b : b - a) == 1);
}

/* Dense bfloat16 panels (bf16_matmul.c) of N x K random weights: bit for bit, except where
 * the variant multiplies on matrix units (AMX): their float32 sums round in their own order,
 * so a result may be the bfloat16 next to the reference's. */
static void check_bf16_matmul(void *ref, void *var, int64_t M, int64_t N, int64_t K) {
    typedef int (*bf16_fn)(int64_t, int64_t, int64_t, const uint16_t *, int64_t,
                           const uint16_t *, uint16_t *, int64_t);
    const int64_t panel_values = (N + 15) / 16 * 16 * K;
    uint16_t *panels = malloc(sizeof(uint16_t) * panel_values);
    uint16_t *x = malloc(sizeof(uint16_t) * M * K);
    uint16_t *want = calloc(M * N, sizeof(uint16_t)), *got = calloc(M * N, sizeof(uint16_t));
    for (int64_t i = 0; i < panel_values; i++) panels[i] = float_to_bf16(uniform(-0.1f, 0.1f));
    for (int64_t i = 0; i < M * K; i++) x[i] = float_to_bf16(uniform(-3.f, 3.f));
    int status = ((bf16_fn)symbol(ref, "bf16_matmul_bf16"))(M, N, K, x, K, panels, want, N);
    status |= ((bf16_fn)symbol(var, "bf16_matmul_bf16"))(M, N, K, x, K, panels, got, N);
    const int own_order = ((int (*)(void))symbol(var, "bf16_matrix_units"))();
    int same = status == 0;
    for (int64_t i = 0; i < M * N && same; i++)
        same = own_order ? within_one_ulp(want[i], got[i]) : want[i] == got[i];
    char label[96];
    snprintf(label, sizeof label, "bf16_matmul_bf16 M=%lld N=%lld K=%lld%s", (long long)M,
             (long long)N, (long long)K, own_order ? " (matrix units)" : "");
    report(label, same, "differ");
    free(panels), free(x), free(want), free(got);
}

/* A cache of 24 blocks x 16 positions x 3 kv heads x 64 in `row_bytes`-sized rows, filled
 * with bfloat16, float32 or int8 rows; three requests of 40, 1 and 23 tokens. */
typedef struct {
    PagedDims dims;
    char *cache;
    int32_t tables[3 * 3];
    int32_t lens[3];
} Paged;

static Paged make_paged(int kind /* 0 f32, 1 bf16, 2 int8 */) {
    Paged p = {{24, 16, 3, 9, 64, 3, 0}, NULL, {1, 5, 9, 2, 0, 0, 7, 3, 0}, {40, 1, 23}};
    const int64_t rows = 2 * 24 * 16 * 3, D = 64;
    const int64_t row_bytes = kind == 0 ? 4 * D : kind == 1 ? 2 * D : D + D / 4;
    p.cache = calloc(rows, row_bytes);
    for (int64_t r = 0; r < rows; r++) {
        char *row = p.cache + r * row_bytes;
        if ((r / 3) % (24 * 16) < 16) continue; /* block 0 stays zero (the null block) */
        for (int64_t j = 0; j < D; j++) {
            const float v = uniform(-2.f, 2.f);
            if (kind == 0) ((float *)row)[j] = v;
            else if (kind == 1) ((uint16_t *)row)[j] = float_to_bf16(v);
            else ((int8_t *)row)[j] = (int8_t)(next_u32() % 255 - 127);
        }
        for (int64_t g = 0; kind == 2 && g < D / 16; g++) { /* a scale per 16 codes */
            const float scale = uniform(0.001f, 0.02f);
            memcpy(row + D + 4 * g, &scale, sizeof scale);
        }
    }
    return p;
}

static void check_attention(void *ref, void *var, const char *decode, const char *prefill,
                            int kind, int bf16_query) {
    Paged p = make_paged(kind);
    const int64_t HD = 9 * 64, T = 30;
    const size_t elem = bf16_query ? 2 : 4;
    void *query = malloc(elem * T * HD), *want = calloc(T * HD, elem), *got = calloc(T * HD, elem);
    for (int64_t i = 0; i < T * HD; i++) {
        const float v = uniform(-1.f, 1.f);
        if (bf16_query) ((uint16_t *)query)[i] = float_to_bf16(v);
        else ((float *)query)[i] = v;
    }
    float *a = malloc(sizeof(float) * T * HD), *b = malloc(sizeof(float) * T * HD);
    const float tolerance = bf16_query ? 1.f / 128 : 1e-5f;
    char detail[96];
    /* Decode: one query row per request. */
    const int32_t rows[3] = {0, 1, 2};
    int status = ((decode_fn)symbol(ref, decode))(&p.dims, query, want, p.cache, p.tables, p.lens,
                                                   rows, 3, 40, 0.125f);
    status |= ((decode_fn)symbol(var, decode))(&p.dims, query, got, p.cache, p.tables, p.lens,
                                                rows, 3, 40, 0.125f);
    for (int k = 0; k < 2; k++) {
        void *src = k ? got : want;
        float *dst = k ? a : b;
        if (bf16_query) bf16_to_floats(src, dst, 3 * HD);
        else memcpy(dst, src, sizeof(float) * 3 * HD);
    }
    float diff = max_rel_diff(a, b, 3 * HD, 1e-2f);
    snprintf(detail, sizeof detail, "relative difference %g", diff);
    report(decode, status == 0 && diff <= tolerance, detail);
    /* Prefill: 20 new tokens after a context of 20, 1 token, 9 tokens after 14. */
    const int32_t starts[3] = {0, 20, 21}, qlens[3] = {20, 1, 9}, contexts[3] = {20, 0, 14};
    memset(want, 0, elem * T * HD), memset(got, 0, elem * T * HD);
    status = ((prefill_fn)symbol(ref, prefill))(&p.dims, query, HD, want, p.cache, p.tables,
                                                 starts, qlens, contexts, 3, 40, 0.125f);
    status |= ((prefill_fn)symbol(var, prefill))(&p.dims, query, HD, got, p.cache, p.tables,
                                                  starts, qlens, contexts, 3, 40, 0.125f);
    for (int k = 0; k < 2; k++) {
        void *src = k ? got : want;
        float *dst = k ? a : b;
        if (bf16_query) bf16_to_floats(src, dst, T * HD);
        else memcpy(dst, src, sizeof(float) * T * HD);
    }
    diff = max_rel_diff(a, b, T * HD, 1e-2f);
    snprintf(detail, sizeof detail, "relative difference %g", diff);
    report(prefill, status == 0 && diff <= tolerance, detail);
    free(p.cache), free(query), free(want), free(got), free(a), free(b);
}

static void check_fused_ops(void *ref, void *var) {
    const int64_t T = 37, H = 576;
    uint16_t *x = malloc(2 * T * 2 * H), *w = malloc(2 * H);
    uint16_t *want = malloc(2 * T * H), *got = malloc(2 * T * H);
    float *r1 = malloc(sizeof(float) * T * H), *r2 = malloc(sizeof(float) * T * H);
    float *a = malloc(sizeof(float) * T * H), *b = malloc(sizeof(float) * T * H);
    for (int64_t i = 0; i < 2 * T * H; i++) x[i] = float_to_bf16(uniform(-3.f, 3.f));
    for (int64_t i = 0; i < H; i++) w[i] = float_to_bf16(uniform(0.5f, 1.5f));
    for (int64_t i = 0; i < T * H; i++) r1[i] = r2[i] = uniform(-4.f, 4.f);
    ((norm_fn)symbol(ref, "add_rms_norm_bf16"))(T, H, x, H, r1, 1, w, want, 1e-5f);
    ((norm_fn)symbol(var, "add_rms_norm_bf16"))(T, H, x, H, r2, 1, w, got, 1e-5f);
    bf16_to_floats(want, b, T * H), bf16_to_floats(got, a, T * H);
    report("add_rms_norm_bf16", max_rel_diff(a, b, T * H, 1e-3f) <= 2.f / 128 &&
           max_rel_diff(r2, r1, T * H, 1e-3f) <= 1e-6f, "differs");
    ((silu_fn)symbol(ref, "silu_and_mul_bf16"))(T, H, x, 2 * H, want);
    ((silu_fn)symbol(var, "silu_and_mul_bf16"))(T, H, x, 2 * H, got);
    bf16_to_floats(want, b, T * H), bf16_to_floats(got, a, T * H);
    report("silu_and_mul_bf16", max_rel_diff(a, b, T * H, 1e-3f) <= 2.f / 128, "differs");
    free(x), free(w), free(want), free(got), free(r1), free(r2), free(a), free(b);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s REFERENCE.so VARIANT.so\n", argv[0]);
        return 2;
    }
    void *ref = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL), *var = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (ref == NULL || var == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    printf("reference %s, variant %s\n", ((isa_fn)symbol(ref, "pagedllm_isa"))(),
           ((isa_fn)symbol(var, "pagedllm_isa"))());
    const int64_t tokens[] = {1, 3, 4, 5, 9};
    for (int i = 0; i < 5; i++) {
        check_matmul(ref, var, "w4a8_matmul_bf16", 0, tokens[i], 130, 96);
        check_matmul(ref, var, "w8a8_matmul_bf16", 1, tokens[i], 130, 96);
        check_matmul(ref, var, "w4a8_f16_matmul_bf16", 2, tokens[i], 130, 96);
        check_matmul(ref, var, "w4a8_sym_f16_matmul_bf16", 3, tokens[i], 130, 96);
    }
    check_matmul(ref, var, "w4a8_matmul_bf16", 0, 17, 256, 576);
    for (int i = 0; i < 5; i++) check_bf16_matmul(ref, var, tokens[i], 130, 98);
    check_bf16_matmul(ref, var, 17, 256, 576);
    check_attention(ref, var, "paged_decode_f32", "paged_prefill_f32", 0, 0);
    check_attention(ref, var, "paged_decode_bf16", "paged_prefill_bf16", 1, 1);
    check_attention(ref, var, "paged_decode_bf16_int8", "paged_prefill_bf16_int8", 2, 1);
    check_fused_ops(ref, var);
    printf("%d failure(s)\n", failures);
    return failures ? 1 : 0;
}

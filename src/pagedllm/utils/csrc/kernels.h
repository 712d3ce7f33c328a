/* The C kernels other C sources call (the decode stack chains them): their signatures,
 * checked against the definitions in each source that includes this header. */
#ifndef PAGEDLLM_KERNELS_H
#define PAGEDLLM_KERNELS_H

#include <stdint.h>

/* attention/csrc/paged_attention.c: the paged KV cache's shape and the query heads. */
typedef struct {
    int64_t num_blocks, block_size, num_kv_heads, num_heads, head_size, max_blocks;
} PagedDims;

int paged_decode_bf16_int8(const PagedDims *d, const uint16_t *query, uint16_t *out,
                           const char *kv_cache, const int32_t *block_tables,
                           const int32_t *seq_lens, const int32_t *token_rows,
                           int64_t num_reqs, int64_t max_seq_len, float scale);
void store_int8_bf16(const PagedDims *d, int8_t *kv_cache, uint16_t *key, uint16_t *value,
                     int64_t key_stride, int64_t value_stride, const int64_t *slots,
                     int64_t num_tokens, int32_t write_back);

/* layers/csrc/cpu_ops.c */
void add_rms_norm_bf16(int64_t T, int64_t H, const uint16_t *x, int64_t x_stride,
                       float *residual, int32_t has_residual, const uint16_t *weight,
                       uint16_t *out, float eps);
void silu_and_mul_bf16(int64_t T, int64_t d, const uint16_t *x, int64_t x_stride,
                       uint16_t *out);
void rope_neox_bf16(int64_t T, int64_t heads, int64_t head_size, int64_t rot_dim,
                    uint16_t *x, int64_t x_stride, const int64_t *positions,
                    const float *cos_sin);

/* layers/csrc/w4a8.c */
int w4a8_matmul_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *x, int64_t x_stride,
                     const uint8_t *qs, const float *dm, uint16_t *out, int64_t out_stride);
int w8a8_matmul_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *x, int64_t x_stride,
                     const uint8_t *qs, const float *dm, uint16_t *out, int64_t out_stride);

#endif

/*
 * A Llama-style decoder stack for decode-only steps on CPU (any number of requests), in one C call.
 *
 * At one token per step a small model's layer is a dozen tiny ops; called one by one from
 * Python, their dispatch costs more than their work. This loop runs the same kernels the
 * Python layers call (cpu_ops.c, w4a8.c, paged_attention.c: this file is linked with them), in
 * the same order on the same buffers, so its result is bit-identical to the layer-by-layer
 * path with the same weights. Per layer:
 *
 *   x = rms_norm(hidden + residual)          residual += hidden (float32)
 *   qkv = x @ Wqkv^T, RoPE on q and k        (int4 weights x int8 activations)
 *   store k, v in the cache (int8 or bf16)   attention over the paged cache
 *   hidden = attn @ Wo^T
 *   x = rms_norm(hidden + residual)          residual += hidden
 *   hidden = (silu(x @ Wgate^T) * (x @ Wup^T)) @ Wdown^T
 *
 * With a LoRA step (`lora` not NULL), each matrix's output then gets its tokens' adapter
 * deltas (lora.c), as the Python layers add them after their base matmul.
 *
 * The caller applies the final norm. Returns 0, or non-zero when a kernel refused its
 * shapes or a buffer could not be allocated (the caller then runs the Python layers).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

/* Matrix `which` (0 qkv, 1 o, 2 gate_up, 3 down) of layer l: out += its LoRA deltas. */
static int add_lora(const StackLoRAStep *lora, int64_t l, int which, int64_t K, int64_t N,
                    const uint16_t *x, int64_t x_stride, uint16_t *out, int64_t out_stride) {
    if (lora == NULL) return 0;
    const StackLoRA *m = lora->matrices + l * 4 + which;
    if (m->a == NULL) return 0;
    return lora_add_bf16(lora->num, K, N, x, x_stride, out, out_stride, lora->order,
                         lora->order_slots, m->subs, m->sub_offsets, lora->rank, m->a, m->b);
}

/* A bfloat16 cache's writer: each token's K and V rows (kv_size values each, V right after
 * K in its qkv row, rows `stride` apart) copied into their slots, as the Python layers'
 * store does (the K half of the cache, then the V half: paged_attention.c's layout). */
static void store_bf16_rows(const PagedDims *d, uint16_t *kv_cache, const uint16_t *kv,
                            int64_t stride, const int64_t *slots, int64_t T) {
    const int64_t kv_size = d->num_kv_heads * d->head_size;
    uint16_t *values = kv_cache + d->num_blocks * d->block_size * kv_size;
    for (int64_t t = 0; t < T; t++) {
        memcpy(kv_cache + slots[t] * kv_size, kv + t * stride, sizeof(uint16_t) * kv_size);
        memcpy(values + slots[t] * kv_size, kv + t * stride + kv_size,
               sizeof(uint16_t) * kv_size);
    }
}

/* hidden [T, hidden] bfloat16: the embeddings in, the last layer's MLP output out;
 * residual [T, hidden] float32 out. positions and slots [T] int64; block_tables
 * [T, max_blocks], seq_lens [T] and token_rows [T] int32: token t is request t's query. */
int decode_stack_bf16(const StackDims *d, const StackLayer *layers, int64_t T,
                      uint16_t *hidden, float *residual, const int64_t *positions,
                      const float *cos_sin, const int64_t *slots,
                      const int32_t *block_tables, const int32_t *seq_lens,
                      const int32_t *token_rows, int64_t max_seq_len,
                      const StackLoRAStep *lora) {
    const int64_t H = d->hidden, D = d->head_size, I = d->intermediate;
    const int64_t q_size = d->num_heads * D, kv_size = d->num_kv_heads * D;
    const int64_t qkv_size = q_size + 2 * kv_size;
    const PagedDims paged = {d->num_blocks, d->block_size, d->num_kv_heads,
                             d->num_heads, D, d->max_blocks, 0};
    uint16_t *x = malloc(sizeof(uint16_t) * T * (H + qkv_size + 2 * q_size + 3 * I));
    if (x == NULL) return 2;
    uint16_t *qkv = x + T * H, *query = qkv + T * qkv_size, *attn = query + T * q_size;
    uint16_t *gate_up = attn + T * q_size, *act = gate_up + T * 2 * I;
    int failed = 0;
    for (int64_t l = 0; l < d->num_layers && !failed; l++) {
        const StackLayer *L = layers + l;
        add_rms_norm_bf16(T, H, hidden, H, residual, l > 0, L->input_norm, x, d->eps);
        failed |= w4a8_matmul_bf16(T, qkv_size, H, x, H, L->qkv, L->qkv_dm, qkv, qkv_size);
        failed |= add_lora(lora, l, 0, H, qkv_size, x, H, qkv, qkv_size);
        rope_neox_bf16(T, d->num_heads + d->num_kv_heads, D, d->rot_dim, qkv, qkv_size,
                       positions, cos_sin);
        for (int64_t t = 0; t < T; t++) /* the kernel takes dense query rows */
            for (int64_t i = 0; i < q_size; i++) query[t * q_size + i] = qkv[t * qkv_size + i];
        if (d->kv_bf16) {
            store_bf16_rows(&paged, (uint16_t *)L->kv_cache, qkv + q_size, qkv_size, slots, T);
            failed |= paged_decode_bf16(&paged, query, attn, L->kv_cache, block_tables,
                                        seq_lens, token_rows, T, max_seq_len, d->scale);
        } else {
            store_int8_bf16(&paged, (int8_t *)L->kv_cache, qkv + q_size,
                            qkv + q_size + kv_size, qkv_size, qkv_size, slots, T, 0);
            failed |= paged_decode_bf16_int8(&paged, query, attn, L->kv_cache, block_tables,
                                             seq_lens, token_rows, T, max_seq_len, d->scale);
        }
        failed |= w4a8_matmul_bf16(T, H, q_size, attn, q_size, L->o, L->o_dm, hidden, H);
        failed |= add_lora(lora, l, 1, q_size, H, attn, q_size, hidden, H);
        add_rms_norm_bf16(T, H, hidden, H, residual, 1, L->post_norm, x, d->eps);
        failed |= w4a8_matmul_bf16(T, 2 * I, H, x, H, L->gate_up, L->gate_up_dm, gate_up,
                                   2 * I);
        failed |= add_lora(lora, l, 2, H, 2 * I, x, H, gate_up, 2 * I);
        silu_and_mul_bf16(T, I, gate_up, 2 * I, act);
        failed |= w4a8_matmul_bf16(T, H, I, act, I, L->down, L->down_dm, hidden, H);
        failed |= add_lora(lora, l, 3, I, H, act, I, hidden, H);
    }
    free(x);
    return failed;
}

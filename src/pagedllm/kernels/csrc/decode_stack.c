/*
 * A decoder stack for decode steps on CPU (any number of requests), in one C call; a step
 * mixing decodes with prefill chunks too (StackPrefills: the chunks are attended by the
 * prefill kernel, as the Python layers' backend attends them).
 *
 * At one token per step a small model's layer is a dozen tiny ops; called one by one from
 * Python, their dispatch costs more than their work. This loop runs the same kernels the
 * Python layers call (cpu_ops.c, w4a8.c, paged_attention.c: this file is linked with them), in
 * the same order on the same buffers, so its result is bit-identical to the layer-by-layer
 * path with the same weights. Per layer (models/common.py's DecoderLayer; [..] where the
 * layer has it):
 *
 *   x = norm(hidden + residual)              residual += hidden (float32)
 *   qkv = x @ Wqkv^T [+ bias]                (int4 / int8 weights x int8 activations)
 *   [q, k = per-head rms_norm(q), (k)]       [RoPE on q and k with the layer's table]
 *   store k, v in the cache (int8 or bf16)   attention over the paged cache [in a window]
 *   hidden = attn @ Wo^T [+ bias]
 *   x = norm(hidden + residual)              residual += hidden
 *     [sandwich: x = norm(norm(hidden) + residual) with the pre-MLP norm]
 *   hidden = (act(x @ Wgate^T) * (x @ Wup^T)) @ Wdown^T      act: SiLU or GELU (tanh)
 *     [plain MLP: hidden = act(x @ W1^T + b1) @ W2^T + b2    act: GELU (tanh) or ReLU]
 *     [experts: hidden = moe_bf16(x), the routed experts' MLPs (moe.c)]
 *     [sandwich: hidden = norm(hidden)]
 *
 * norm: RMSNorm, or LayerNorm with its bias (GPT-2, OPT: StackDims.layer_norm).
 * A matrix is one W4A8, W8A8 or dense bf16 (bf16_matmul.c) weight, or two summed (a GGUF
 * format split in two, as quantization.SplitWeight), plus its bias. With a LoRA step (`lora` not NULL), each
 * matrix's output then gets its tokens' adapter deltas (lora.c), as the Python layers add
 * them after their base matmul and bias. Each layer reads its KV cache group's block table
 * and slots (a hybrid model's sliding and global layers keep different tables).
 *
 * The model's final norm follows where StackDims.final_norm is set (else the caller
 * applies it). Returns 0, or non-zero when a kernel refused its
 * shapes or a buffer could not be allocated (cpu_stack.py raises: the buffers grow with
 * the step's tokens, which the step budget bounds).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "kernels.h"

/* out [T, N] (rows out_stride apart) += rows of `add` (dense [T, N]), rounded to bfloat16
 * as torch's bfloat16 add. */
static void add_rows(int64_t T, int64_t N, uint16_t *out, int64_t out_stride,
                     const uint16_t *add, int64_t add_stride) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < N; j++) {
            uint16_t *o = out + t * out_stride + j;
            *o = float_to_bf16(bf16_to_float(*o) + bf16_to_float(add[t * add_stride + j]));
        }
}

static int part_matmul(const StackWeight *w, int64_t T, int64_t N, int64_t K,
                       const uint16_t *x, int64_t x_stride, uint16_t *out, int64_t out_stride) {
    return byte_dot_matmul((int)w->format, T, N, K, x, x_stride, w->codes, w->scales, out,
                           out_stride);
}

/* out [T, N] = x @ W^T (+ the second part's product) (+ bias), each sum rounded as the
 * Python layer's bfloat16 adds; `scratch` holds [T, N] for the second part. Steps of at
 * least large_from tokens take the large weight alone (the Python layer's crossover). */
int stack_matmul(const StackMatrix *m, int64_t T, int64_t N, int64_t K, const uint16_t *x,
                  int64_t x_stride, uint16_t *out, int64_t out_stride, uint16_t *scratch) {
    const int large = m->large.codes != NULL && T >= m->large_from;
    int failed = part_matmul(large ? &m->large : &m->parts[0], T, N, K, x, x_stride, out,
                             out_stride);
    if (!large && m->parts[1].codes != NULL) {
        failed |= part_matmul(&m->parts[1], T, N, K, x, x_stride, scratch, N);
        add_rows(T, N, out, out_stride, scratch, N);
    }
    if (m->bias != NULL) add_rows(T, N, out, out_stride, m->bias, 0);
    return failed;
}

/* Matrix `which` (0 qkv, 1 o, 2 gate_up, 3 down) of layer l: out += its LoRA deltas. */
static int add_lora(const StackLoRAStep *lora, int64_t l, int which, int64_t K, int64_t N,
                    const uint16_t *x, int64_t x_stride, uint16_t *out, int64_t out_stride) {
    if (lora == NULL) return 0;
    const StackLoRA *m = lora->matrices + l * 4 + which;
    if (m->a == NULL) return 0;
    return lora_add_bf16(lora->num, K, N, x, x_stride, out, out_stride, lora->order,
                         lora->order_slots, m->subs, m->sub_offsets, lora->rank, m->a, m->b);
}

/* A bfloat16 cache's writer: each token's K and V rows (kv_size values each) copied into
 * their slots, as the Python layers' store does (the K half of the cache, then the V half:
 * paged_attention.c's layout). */
static void store_bf16_rows(const PagedDims *d, uint16_t *kv_cache, const uint16_t *key,
                            int64_t key_stride, const uint16_t *value, int64_t value_stride,
                            const int64_t *slots, int64_t T) {
    const int64_t kv_size = d->num_kv_heads * d->head_size;
    uint16_t *values = kv_cache + d->num_blocks * d->block_size * kv_size;
    for (int64_t t = 0; t < T; t++) {
        memcpy(kv_cache + slots[t] * kv_size, key + t * key_stride, sizeof(uint16_t) * kv_size);
        memcpy(values + slots[t] * kv_size, value + t * value_stride,
               sizeof(uint16_t) * kv_size);
    }
}

/* q and k of each token normalised per head (the Python layer's q_norm / k_norm over
 * [T * heads, head_size] rows), side by side in qk [T, (Hq + Hkv) * D]. */
static void norm_heads(const StackDims *d, const StackLayer *L, int64_t T, const uint16_t *qkv,
                       int64_t qkv_size, uint16_t *qk, float *scratch) {
    const int64_t D = d->head_size, q_size = d->num_heads * D;
    const int64_t qk_size = q_size + d->num_kv_heads * D;
    for (int64_t t = 0; t < T; t++) {
        const uint16_t *row = qkv + t * qkv_size;
        add_rms_norm_bf16(d->num_heads, D, row, D, scratch, 0, L->q_norm, qk + t * qk_size,
                          d->eps);
        add_rms_norm_bf16(d->num_kv_heads, D, row + q_size, D, scratch, 0, L->k_norm,
                          qk + t * qk_size + q_size, d->eps);
    }
}

/* out = norm(x (+ residual)) of the model's kind, updating the float32 residual. */
static void norm(const StackDims *d, int64_t T, const uint16_t *x, float *residual,
                 int32_t has_residual, const uint16_t *weight, const uint16_t *bias,
                 uint16_t *out) {
    if (d->layer_norm)
        add_layer_norm_bf16(T, d->hidden, x, d->hidden, residual, has_residual, weight, bias,
                            out, d->eps);
    else
        add_rms_norm_bf16(T, d->hidden, x, d->hidden, residual, has_residual, weight, out,
                          d->eps);
}

/* The MLP's activation: act(gate) * up of gate_up [T, 2I], or act(h) of a plain MLP's
 * hidden h [T, I]; into out [T, I]. */
static void activate(const StackDims *d, int64_t T, const uint16_t *gate_up, uint16_t *out) {
    const int64_t I = d->intermediate;
    if (!d->gated)
        activation_bf16(d->activation, T, I, gate_up, I, out);
    else if (d->activation == STACK_GELU_TANH)
        gelu_tanh_and_mul_bf16(T, I, gate_up, 2 * I, out);
    else
        silu_and_mul_bf16(T, I, gate_up, 2 * I, out);
}

/* The scratch buffers of one step, carved from one allocation. */
typedef struct {
    uint16_t *x, *qkv, *qk, *query, *attn, *gate_up, *act, *tmp, *part;
    float *norm;
} Buffers;

static void *buffers_alloc(const StackDims *d, int64_t T, Buffers *b) {
    const int64_t H = d->hidden, D = d->head_size, I = d->intermediate;
    const int64_t q_size = d->num_heads * D, kv_size = d->num_kv_heads * D;
    const int64_t qkv_size = q_size + 2 * kv_size;
    int64_t widest = qkv_size > 2 * I ? qkv_size : 2 * I;
    if (H > widest) widest = H;
    const int64_t halves = T * (H + qkv_size + (q_size + kv_size) + 2 * q_size + 3 * I + H +
                                widest);
    const int64_t floats = T * H + (d->num_heads > d->num_kv_heads ? q_size : kv_size);
    char *base = malloc(sizeof(uint16_t) * halves + sizeof(float) * floats);
    if (base == NULL) return NULL;
    b->x = (uint16_t *)base;
    b->qkv = b->x + T * H;
    b->qk = b->qkv + T * qkv_size;
    b->query = b->qk + T * (q_size + kv_size);
    b->attn = b->query + T * q_size;
    b->gate_up = b->attn + T * q_size;
    b->act = b->gate_up + T * 2 * I;
    b->tmp = b->act + T * I;
    b->part = b->tmp + T * H;
    b->norm = (float *)(base + sizeof(uint16_t) * halves);
    return base;
}

/* hidden [T, hidden] bfloat16: the embeddings in (or looked up here from input_ids [T] where
 * StackDims.embedding is set: 3 for an id outside the vocabulary), the last layer's output
 * out (through the final norm where StackDims.final_norm is set); residual [T, hidden]
 * float32 out. positions [T] int64; seq_lens and token_rows [T]
 * int32: token t is request t's query; groups: each KV cache group's slots and tables.
 * With `prefills`, seq_lens / token_rows / the groups' block_tables hold its num_decodes
 * decode requests only, and its chunks are the other requests. */
int decode_stack_bf16(const StackDims *d, const StackLayer *layers, int64_t T,
                      const int64_t *input_ids, uint16_t *hidden, float *residual,
                      const int64_t *positions,
                      const StackGroup *groups, const int32_t *seq_lens,
                      const int32_t *token_rows, int64_t max_seq_len,
                      const StackLoRAStep *lora, const StackPrefills *prefills) {
    const int64_t H = d->hidden, D = d->head_size, I = d->intermediate;
    const int64_t q_size = d->num_heads * D, kv_size = d->num_kv_heads * D;
    const int64_t qkv_size = q_size + 2 * kv_size;
    if (d->embedding != NULL) { /* input_ids' embeddings as torch.embedding, then scaled */
        for (int64_t t = 0; t < T; t++)
            if (input_ids[t] < 0 || input_ids[t] >= d->vocab_size) return 3;
        for (int64_t t = 0; t < T; t++)
            memcpy(hidden + t * H, d->embedding + input_ids[t] * H, sizeof(uint16_t) * H);
        const float scale = d->embedding_scale;
        if (scale != 0.f) /* two bfloat16 values' product is exact in float32: one rounding */
            for (int64_t i = 0; i < T * H; i++)
                hidden[i] = float_to_bf16(bf16_to_float(hidden[i]) * scale);
    }
    Buffers b;
    void *base = buffers_alloc(d, T, &b);
    if (base == NULL) return 2;
    float *head_norm = b.norm + T * H; /* a token's heads' statistics (norm_heads) */
    /* A mixed step attends its decodes and its prefill chunks with their own kernels. */
    const int64_t num_decodes = prefills != NULL ? prefills->num_decodes : T;
    const int64_t num_chunks = prefills != NULL ? prefills->num : 0;
    int failed = 0;
    for (int64_t l = 0; l < d->num_layers && !failed; l++) {
        const StackLayer *L = layers + l;
        const StackGroup *G = groups + L->group;
        const PagedDims paged = {d->num_blocks, d->block_size, d->num_kv_heads,
                                 d->num_heads, D, G->max_blocks, L->window};
        const PagedDims chunks = {d->num_blocks, d->block_size, d->num_kv_heads,
                                  d->num_heads, D, G->prefill_max_blocks, L->window};
        norm(d, T, hidden, residual, l > 0, L->input_norm, L->input_norm_bias, b.x);
        failed |= stack_matmul(&L->qkv, T, qkv_size, H, b.x, H, b.qkv, qkv_size, b.part);
        failed |= add_lora(lora, l, 0, H, qkv_size, b.x, H, b.qkv, qkv_size);
        uint16_t *qk = b.qkv; /* q and k side by side, rows qk_stride apart */
        int64_t qk_stride = qkv_size;
        if (L->q_norm != NULL) {
            norm_heads(d, L, T, b.qkv, qkv_size, b.qk, head_norm);
            qk = b.qk;
            qk_stride = q_size + kv_size;
        }
        if (L->cos_sin != NULL)
            rope_neox_bf16(T, d->num_heads + d->num_kv_heads, D, L->rot_dim, qk, qk_stride,
                           positions, L->cos_sin);
        for (int64_t t = 0; t < T; t++) /* the kernel takes dense query rows */
            memcpy(b.query + t * q_size, qk + t * qk_stride, sizeof(uint16_t) * q_size);
        uint16_t *key = qk + q_size, *value = b.qkv + q_size + kv_size;
        if (d->kv_bf16) {
            store_bf16_rows(&paged, (uint16_t *)L->kv_cache, key, qk_stride, value, qkv_size,
                            G->slots, T);
            if (num_decodes > 0)
                failed |= paged_decode_bf16(&paged, b.query, b.attn, L->kv_cache,
                                            G->block_tables, seq_lens, token_rows, num_decodes,
                                            max_seq_len, d->scale);
            if (num_chunks > 0)
                failed |= paged_prefill_bf16(&chunks, b.query, q_size, b.attn, L->kv_cache,
                                             G->prefill_block_tables, prefills->query_starts,
                                             prefills->query_lens, prefills->context_lens,
                                             num_chunks, prefills->max_seq_len, d->scale);
        } else {
            store_int8_bf16(&paged, (int8_t *)L->kv_cache, key, value, qk_stride, qkv_size,
                            G->slots, T, 0);
            if (num_decodes > 0)
                failed |= paged_decode_bf16_int8(&paged, b.query, b.attn, L->kv_cache,
                                                 G->block_tables, seq_lens, token_rows,
                                                 num_decodes, max_seq_len, d->scale);
            if (num_chunks > 0)
                failed |= paged_prefill_bf16_int8(&chunks, b.query, q_size, b.attn,
                                                  L->kv_cache, G->prefill_block_tables,
                                                  prefills->query_starts, prefills->query_lens,
                                                  prefills->context_lens, num_chunks,
                                                  prefills->max_seq_len, d->scale);
        }
        failed |= stack_matmul(&L->o, T, H, q_size, b.attn, q_size, hidden, H, b.part);
        failed |= add_lora(lora, l, 1, q_size, H, b.attn, q_size, hidden, H);
        const int sandwich = L->pre_ffn_norm != NULL;
        if (sandwich) {
            norm(d, T, hidden, b.norm, 0, L->post_attn_norm, NULL, b.tmp);
            norm(d, T, b.tmp, residual, 1, L->pre_ffn_norm, NULL, b.x);
        } else {
            norm(d, T, hidden, residual, 1, L->post_attn_norm, L->post_attn_norm_bias, b.x);
        }
        uint16_t *mlp_out = sandwich ? b.tmp : hidden;
        if (L->moe != NULL) {
            failed |= moe_bf16(L->moe, T, H, d->activation, b.x, mlp_out);
        } else {
            const int64_t up_size = d->gated ? 2 * I : I;
            failed |= stack_matmul(&L->gate_up, T, up_size, H, b.x, H, b.gate_up, up_size,
                                   b.part);
            failed |= add_lora(lora, l, 2, H, up_size, b.x, H, b.gate_up, up_size);
            activate(d, T, b.gate_up, b.act);
            failed |= stack_matmul(&L->down, T, H, I, b.act, I, mlp_out, H, b.part);
            failed |= add_lora(lora, l, 3, I, H, b.act, I, mlp_out, H);
        }
        if (sandwich) norm(d, T, b.tmp, b.norm, 0, L->post_ffn_norm, NULL, hidden);
    }
    if (d->final_norm != NULL) { /* hidden = norm(hidden + residual), residual updated */
        norm(d, T, hidden, residual, 1, d->final_norm, d->final_norm_bias, b.x);
        memcpy(hidden, b.x, sizeof(uint16_t) * (size_t)(T * H));
    }
    free(base);
    return failed;
}

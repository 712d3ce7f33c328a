/*
 * The CPU kernel library's interface: every function Python calls (kernels/abi.py declares
 * their ctypes signatures) and that one source calls in another (the decode stack chains
 * them). The same functions exist in every variant's library; only isa.h's primitives
 * differ between them. Everything else is compiled hidden (-fvisibility=hidden), so two
 * variants loaded in one process (the tests do) never resolve each other's symbols.
 */
#ifndef PAGEDLLM_KERNELS_H
#define PAGEDLLM_KERNELS_H

#include <stdint.h>

#define PAGEDLLM_API __attribute__((visibility("default")))

/* The variant this library was built as (variants.py's names: "amx_bf16", "avx512_bf16",
 * "avx512", "avx2_vnni", "avx2", "neon_dotprod", "neon" or "scalar"; w4a8.c). */
PAGEDLLM_API const char *pagedllm_isa(void);

/* paged_attention.c: the paged KV cache's shape and the query heads; window > 0 limits
 * each query to the keys at positions > its own - window (sliding-window layers). */
typedef struct {
    int64_t num_blocks, block_size, num_kv_heads, num_heads, head_size, max_blocks, window;
} PagedDims;

/* The byte dot products' weight formats (StackWeight.format, isa_byte_dot_tile; w4a8.c has
 * the layouts). float16 holds every GGUF Q4_0 / Q4_1 scale exactly: 0.625 bytes a weight
 * instead of 0.75, and Q4_0's minimum, always -8 d, need not be stored (0.5625). */
#define FMT_INT4 0         /* int4 codes, float32 (d, m) */
#define FMT_INT8 1         /* int8 codes + 128, float32 d (m = -128 d) */
#define FMT_INT4_F16 2     /* int4 codes, float16 (d, m) */
#define FMT_INT4_SYM_F16 3 /* int4 codes, float16 d (m = -8 d: Q4_0) */
#define FMT_BF16 4         /* bfloat16 panels (bf16_matmul.c), no scales: dense weights */

/* Activations (activation_bf16, StackDims.activation). */
#define STACK_SILU 0
#define STACK_GELU_TANH 1
#define STACK_RELU 2
#define STACK_QUICK_GELU 3 /* CLIP: x * sigmoid(1.702 x); activation_bf16 only */

/* Decode attention: one query row per request (token_rows), context read from the cache.
 * Four entry points by (query dtype, cache format); returns non-zero when out of memory. */
#define DECLARE_DECODE(NAME, T)                                                              \
    PAGEDLLM_API int NAME(const PagedDims *d, const T *query, T *out, const char *kv_cache,  \
                          const int32_t *block_tables, const int32_t *seq_lens,             \
                          const int32_t *token_rows, int64_t num_reqs, int64_t max_seq_len, \
                          float scale);
DECLARE_DECODE(paged_decode_f32, float)
DECLARE_DECODE(paged_decode_bf16, uint16_t)
DECLARE_DECODE(paged_decode_f32_int8, float)
DECLARE_DECODE(paged_decode_bf16_int8, uint16_t)
#undef DECLARE_DECODE

/* Causal prefill attention of each request's new query rows, from the cache. */
#define DECLARE_PREFILL(NAME, T)                                                             \
    PAGEDLLM_API int NAME(const PagedDims *d, const T *query, int64_t q_stride, T *out,      \
                          const char *kv_cache, const int32_t *block_tables,                \
                          const int32_t *query_starts, const int32_t *query_lens,           \
                          const int32_t *context_lens, int64_t num_reqs,                    \
                          int64_t max_seq_len, float scale);
DECLARE_PREFILL(paged_prefill_f32, float)
DECLARE_PREFILL(paged_prefill_bf16, uint16_t)
DECLARE_PREFILL(paged_prefill_f32_int8, float)
DECLARE_PREFILL(paged_prefill_bf16_int8, uint16_t)
#undef DECLARE_PREFILL
/* amx_attention.c: paged_prefill_bf16 / _bf16_int8 on AMX's tiles; -1 where this build or
 * the shapes have none (then the vector kernels run), 1 when out of memory. */
int paged_prefill_bf16_tiles(const PagedDims *d, const uint16_t *query, int64_t q_stride,
                             uint16_t *out, const char *kv_cache, const int32_t *block_tables,
                             const int32_t *query_starts, const int32_t *query_lens,
                             const int32_t *context_lens, int64_t num_reqs,
                             int64_t max_seq_len, float scale);
int paged_prefill_bf16_int8_tiles(const PagedDims *d, const uint16_t *query, int64_t q_stride,
                                  uint16_t *out, const char *kv_cache,
                                  const int32_t *block_tables, const int32_t *query_starts,
                                  const int32_t *query_lens, const int32_t *context_lens,
                                  int64_t num_reqs, int64_t max_seq_len, float scale);

/* dense_attention.c: bidirectional attention over [B, N, H, D] bfloat16 q, k, v (a vision
 * tower's image tokens) into out of the same shape; non-zero when out of memory. */
PAGEDLLM_API int dense_attention_bf16(int64_t B, int64_t N, int64_t H, int64_t D,
                                      const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                      uint16_t *out, float scale);

/* The int8 cache's writer: K/V rows of the new tokens quantized into their slots. */
PAGEDLLM_API void store_int8_f32(const PagedDims *d, int8_t *kv_cache, float *key,
                                 float *value, int64_t key_stride, int64_t value_stride,
                                 const int64_t *slots, int64_t num_tokens, int32_t write_back);
PAGEDLLM_API void store_int8_bf16(const PagedDims *d, int8_t *kv_cache, uint16_t *key,
                                  uint16_t *value, int64_t key_stride, int64_t value_stride,
                                  const int64_t *slots, int64_t num_tokens, int32_t write_back);

/* cpu_ops.c: fused bfloat16 element-wise ops of a decoder layer. */
PAGEDLLM_API void add_rms_norm_bf16(int64_t T, int64_t H, const uint16_t *x, int64_t x_stride,
                                    float *residual, int32_t has_residual,
                                    const uint16_t *weight, uint16_t *out, float eps);
PAGEDLLM_API void silu_and_mul_bf16(int64_t T, int64_t d, const uint16_t *x, int64_t x_stride,
                                    uint16_t *out);
PAGEDLLM_API void add_layer_norm_bf16(int64_t T, int64_t H, const uint16_t *x, int64_t x_stride,
                                      float *residual, int32_t has_residual,
                                      const uint16_t *weight, const uint16_t *bias,
                                      uint16_t *out, float eps);
PAGEDLLM_API void activation_bf16(int64_t kind, int64_t T, int64_t d, const uint16_t *x,
                                  int64_t x_stride, uint16_t *out);
PAGEDLLM_API void gelu_tanh_and_mul_bf16(int64_t T, int64_t d, const uint16_t *x,
                                         int64_t x_stride, uint16_t *out);
PAGEDLLM_API int64_t finite_rows_bf16(int64_t T, int64_t H, const uint16_t *x,
                                      int64_t x_stride, uint8_t *finite);
PAGEDLLM_API void rope_neox_bf16(int64_t T, int64_t heads, int64_t head_size, int64_t rot_dim,
                                 uint16_t *x, int64_t x_stride, const int64_t *positions,
                                 const float *cos_sin);

/* w4a8.c: int4 / int8 weights x int8 activations; returns 1 when K % 32 != 0, 2 when out
 * of memory. */
PAGEDLLM_API int w4a8_matmul_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *x,
                                  int64_t x_stride, const uint8_t *qs, const float *dm,
                                  uint16_t *out, int64_t out_stride);
PAGEDLLM_API int w4a8_f16_matmul_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *x,
                                      int64_t x_stride, const uint8_t *qs, const uint16_t *dm,
                                      uint16_t *out, int64_t out_stride);
PAGEDLLM_API int w4a8_sym_f16_matmul_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *x,
                                          int64_t x_stride, const uint8_t *qs,
                                          const uint16_t *d, uint16_t *out, int64_t out_stride);
/* bf16_matmul.c: out [M, N] = x [M, K] @ W^T for W [N, K] bfloat16 in panels of 16 rows
 * (see there), all bfloat16 (rows x_stride / out_stride apart); 1 when K is odd. */
PAGEDLLM_API int bf16_matmul_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *x,
                                  int64_t x_stride, const uint16_t *panels, uint16_t *out,
                                  int64_t out_stride);
/* amx_bf16.c: bf16_matmul_bf16 on matrix units (Intel AMX); 1 where the variant has none,
 * the OS refused them, or K is odd (then the vector tiles run). bf16_matrix_units: 1
 * when this library multiplies bfloat16 panels on them. */
int bf16_matrix_matmul(int64_t M, int64_t N, int64_t K, const uint16_t *x, int64_t x_stride,
                       const uint16_t *panels, uint16_t *out, int64_t out_stride);
PAGEDLLM_API int bf16_matrix_units(void);
/* Any format (FMT_*): what the decode stack calls. */
int byte_dot_matmul(int format, int64_t M, int64_t N, int64_t K, const uint16_t *x,
                    int64_t x_stride, const uint8_t *codes, const void *dm, uint16_t *out,
                    int64_t out_stride);
PAGEDLLM_API int w8a8_matmul_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *x,
                                  int64_t x_stride, const uint8_t *qs, const float *dm,
                                  uint16_t *out, int64_t out_stride);

/* lora.c: each listed token adds its LoRA adapter's delta to its bfloat16 output row;
 * returns 2 when out of memory. */
PAGEDLLM_API int lora_add_bf16(int64_t num, int64_t K, int64_t N, const uint16_t *x,
                               int64_t x_stride, uint16_t *out, int64_t out_stride,
                               const int32_t *order, const int32_t *order_slots, int64_t subs,
                               const int64_t *sub_offsets, int64_t R, const uint16_t *A,
                               const uint16_t *B);

/* decode_stack.c: a decoder stack (every DecoderSpec layer but MoE) for decode-only steps,
 * in one call. */
typedef struct {
    int64_t num_layers, hidden, num_heads, num_kv_heads, head_size, intermediate;
    int64_t num_blocks, block_size; /* the paged KV cache of every layer */
    int64_t kv_bf16; /* its rows: bfloat16 when non-zero, else int8 codes with scales */
    int64_t activation; /* gated: STACK_SILU or STACK_GELU_TANH; plain: GELU_TANH or RELU */
    int64_t gated; /* 1: act(gate) * up (gate_up [2 I]); 0: a plain MLP (fc1 [I] in gate_up) */
    int64_t layer_norm; /* 1: LayerNorm (with the norms' biases), 0: RMSNorm */
    float eps, scale;
    /* the model's final norm (its kind and eps as the layers'), applied to the last layer's
     * output when not NULL; its bias (LayerNorm) may be NULL */
    const uint16_t *final_norm, *final_norm_bias;
    /* the token embedding [vocab_size, hidden] bfloat16 the call looks its input_ids up in
     * (no learned positions), or NULL: hidden holds them */
    const uint16_t *embedding;
    int64_t vocab_size;
    /* the looked-up rows times this bfloat16 value, rounded to bfloat16 as torch's
     * bfloat16 product (Gemma's sqrt(hidden)); 0: no scale */
    float embedding_scale;
} StackDims;


typedef struct {
    const uint8_t *codes; /* NULL: no such part */
    const void *scales; /* with the minimums, unless the format implies them */
    int64_t format; /* FMT_* */
} StackWeight;

typedef struct {
    StackWeight parts[2]; /* a split GGUF weight sums two; parts[1].codes NULL otherwise */
    const uint16_t *bias; /* NULL: none */
    /* Steps of at least large_from tokens multiply by `large` instead of the parts (a
     * quantized weight's bf16 panels on matrix units: crossover.py); codes NULL: none. */
    StackWeight large;
    int64_t large_from;
} StackMatrix;

/* A sparse MLP's weights (moe.c): the router, each expert's two matrices, the shared
 * expert (Qwen2-MoE; its gate_up codes NULL: none) and its sigmoid gate. */
typedef struct {
    int64_t num_experts, top_k, renormalize, intermediate, shared_intermediate;
    const uint16_t *router; /* [num_experts, hidden] bfloat16, dense */
    const StackMatrix *gate_up, *down; /* [num_experts] each */
    StackMatrix shared_gate_up, shared_down;
    const uint16_t *shared_gate; /* [hidden] bfloat16 */
} StackMoE;

typedef struct {
    /* post_attn_norm: before the MLP, or with sandwich norms (pre_ffn_norm not NULL) on the
     * attention's output, pre_ffn_norm before the MLP and post_ffn_norm on its output. */
    const uint16_t *input_norm, *post_attn_norm, *pre_ffn_norm, *post_ffn_norm;
    const uint16_t *input_norm_bias, *post_attn_norm_bias; /* LayerNorm's, or NULL */
    const uint16_t *q_norm, *k_norm; /* per-head RMSNorm of q and k, or NULL */
    StackMatrix qkv, o, gate_up, down; /* gate_up and down unused where moe is set */
    const StackMoE *moe; /* the layer's experts, or NULL for a dense MLP */
    const float *cos_sin; /* this layer's RoPE table [positions, rot_dim], (cos | sin), or
                           * NULL (learned positions: nothing to rotate) */
    int64_t rot_dim, window; /* window: 0 for full attention */
    int64_t group; /* its KV cache group (block table and slots) */
    char *kv_cache; /* paged_attention.c's layout, in StackDims.kv_bf16's format */
} StackLayer;

typedef struct {
    const int64_t *slots; /* [T] */
    const int32_t *block_tables; /* the decode requests' [num_decodes, max_blocks] */
    int64_t max_blocks;
    /* a mixed step's prefill requests' [StackPrefills.num, prefill_max_blocks] (else NULL) */
    const int32_t *prefill_block_tables;
    int64_t prefill_max_blocks;
} StackGroup;

/* A mixed step's requests that compute several tokens (prefill chunks), attended by the
 * prefill kernel as the Python layers' backend attends them (paged_attention.c); the
 * decode requests are the first num_decodes of seq_lens / token_rows. NULL: every token is
 * a decode request (token t is request t). */
typedef struct {
    int64_t num_decodes, num;
    const int32_t *query_starts, *query_lens, *context_lens; /* [num] */
    int64_t max_seq_len;
} StackPrefills;

typedef struct {
    const uint16_t *a, *b;
    const int64_t *sub_offsets;
    int64_t subs;
} StackLoRA;

/* A step's LoRA tokens (lora.c's order / order_slots) and every layer's four matrices'
 * slots (qkv, o, gate_up, down), [num_layers * 4]. */
typedef struct {
    int64_t num, rank;
    const int32_t *order, *order_slots;
    const StackLoRA *matrices;
} StackLoRAStep;

/* moe.c: out [T, hidden] = the sparse MLP of x [T, hidden] (all bfloat16): softmax routing
 * in float32, top-k (renormalised when asked), each chosen expert's gated MLP (activation as
 * StackDims.activation), their outputs weighted and summed in float32, plus the gated shared
 * expert; 0, or non-zero when a kernel refused or memory ran out. */
PAGEDLLM_API int moe_bf16(const StackMoE *m, int64_t T, int64_t hidden, int64_t activation,
                          const uint16_t *x, uint16_t *out);

/* decode_stack.c's matmul of a StackMatrix (for moe.c): out [T, N] = x @ W^T (+ bias). */
int stack_matmul(const StackMatrix *m, int64_t T, int64_t N, int64_t K, const uint16_t *x,
                 int64_t x_stride, uint16_t *out, int64_t out_stride, uint16_t *scratch);

/* lm_head.c: the LM head's greedy tail. refine_top_bf16: each row's top k logits (of
 * [M, N] bfloat16, rows logits_stride apart) as ids [M, k] and their float32 logits exact
 * [M, k] recomputed from the dense weight [N, K] and x [M, K] (bfloat16). greedy_head_bf16:
 * the head's matmul (x @ head^T), the same refinement, and each row's argmax into tokens [M]
 * (-1 for a row of x holding a NaN or infinity); `scratch` (NULL: allocated here) holds the
 * logits, parts x M x N bfloat16 values (parts: 2 for a split head, else 1).
 * Both return 1 when k is not in 1..N, 2 when out of memory (greedy: or the matmul's code). */
PAGEDLLM_API int refine_top_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *logits,
                                 int64_t logits_stride, const uint16_t *x, int64_t x_stride,
                                 const uint16_t *weight, int64_t k, int64_t *ids, float *exact);
PAGEDLLM_API int greedy_head_bf16(const StackMatrix *head, int64_t M, int64_t N, int64_t K,
                                  const uint16_t *x, int64_t x_stride, const uint16_t *weight,
                                  int64_t k, int64_t *tokens, uint16_t *scratch);

PAGEDLLM_API int decode_stack_bf16(const StackDims *d, const StackLayer *layers, int64_t T,
                                   const int64_t *input_ids, uint16_t *hidden, float *residual,
                                   const int64_t *positions,
                                   const StackGroup *groups, const int32_t *seq_lens,
                                   const int32_t *token_rows, int64_t max_seq_len,
                                   const StackLoRAStep *lora, const StackPrefills *prefills);

/* decode_loop.c: `steps` greedy decode steps of T requests in one call (see there). */
PAGEDLLM_API int decode_greedy_steps(const StackDims *d, const StackLayer *layers, int64_t T,
                                     int64_t steps, int64_t *input_ids, uint16_t *hidden,
                                     float *residual, int64_t *positions,
                                     const StackGroup *groups, int64_t num_groups,
                                     int32_t *seq_lens,
                                     const int32_t *token_rows,
                                     const StackLoRAStep *lora, const StackMatrix *head,
                                     int64_t N, const uint16_t *weight, int64_t k,
                                     uint16_t *scratch, int64_t *tokens, int64_t *steps_done,
                                     const int64_t *stop_ids, int64_t stop_width);

#endif

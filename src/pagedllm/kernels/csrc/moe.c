/*
 * A sparse mixture-of-experts MLP (Mixtral, Qwen2-MoE, Qwen3-MoE) on CPU, in one call.
 *
 * layers/moe.py's FusedMoE calls this for bfloat16 steps of a few rows, and the decode
 * stack (decode_stack.c) for its MoE layers, so both give the same bits:
 *
 *   logits = bf16(x @ router^T)       probabilities: softmax in float32
 *   top-k experts (ties: the lower id), weights renormalised to sum to one when asked,
 *   rounded to bfloat16 (transformers casts them to the activations' dtype)
 *   each expert's gated MLP over the rows routed to it (grouped, as the Python layer),
 *   out = sum over a row's experts of bf16(expert out x weight), summed in float32 in
 *   expert order, + bf16(shared(x) x bf16(sigmoid(bf16(x @ shared_gate)))), rounded once.
 *
 * The router is dense (a quantized router would send tokens elsewhere); its dot products
 * run in float32 here, which for the few rows of a decode step costs less than a torch call.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "kernels.h"

/* bf16(x . w) over n values, float32 sums. */
static float dot_bf16(const uint16_t *x, const uint16_t *w, int64_t n) {
    float sum = 0.f;
    for (int64_t j = 0; j < n; j++) sum += bf16_to_float(x[j]) * bf16_to_float(w[j]);
    return round_bf16(sum);
}

/* Row t's top-k experts (ids[k], weights[k] rounded to bfloat16) from its router logits. */
static void route(const StackMoE *m, const uint16_t *xt, int64_t H, float *probs, int32_t *ids,
                  float *weights) {
    const int64_t E = m->num_experts, K = m->top_k;
    float top = -INFINITY, total = 0.f;
    for (int64_t e = 0; e < E; e++) {
        probs[e] = dot_bf16(xt, m->router + e * H, H);
        if (probs[e] > top) top = probs[e];
    }
    for (int64_t e = 0; e < E; e++) {
        probs[e] = expf(probs[e] - top);
        total += probs[e];
    }
    float chosen = 0.f;
    for (int64_t c = 0; c < K; c++) {
        int32_t best = -1;
        for (int64_t e = 0; e < E; e++)
            if (probs[e] >= 0.f && (best < 0 || probs[e] > probs[best])) best = (int32_t)e;
        if (best < 0) best = (int32_t)(c % E); /* non-finite logits: never index probs[-1] */
        ids[c] = best;
        weights[c] = probs[best] / total;
        chosen += weights[c];
        probs[best] = -1.f; /* taken */
    }
    for (int64_t c = 0; c < K; c++)
        weights[c] = round_bf16(m->renormalize ? weights[c] / chosen : weights[c]);
}

static void activate(int64_t activation, int64_t T, int64_t I, const uint16_t *gate_up,
                     uint16_t *out) {
    if (activation == STACK_GELU_TANH)
        gelu_tanh_and_mul_bf16(T, I, gate_up, 2 * I, out);
    else
        silu_and_mul_bf16(T, I, gate_up, 2 * I, out);
}

/* rows [n, H] through one gated MLP (gate_up [2I, H], down [H, I]) into out [n, H]. */
static int expert(const StackMatrix *gate_up, const StackMatrix *down, int64_t activation,
                  int64_t n, int64_t H, int64_t I, const uint16_t *rows, uint16_t *hidden,
                  uint16_t *act, uint16_t *out, uint16_t *scratch) {
    int failed = stack_matmul(gate_up, n, 2 * I, H, rows, H, hidden, 2 * I, scratch);
    activate(activation, n, I, hidden, act);
    failed |= stack_matmul(down, n, H, I, act, I, out, H, scratch);
    return failed;
}

int moe_bf16(const StackMoE *m, int64_t T, int64_t H, int64_t activation, const uint16_t *x,
             uint16_t *out) {
    if (T == 0) return 0;
    const int64_t E = m->num_experts, K = m->top_k;
    const int64_t I = m->intermediate > m->shared_intermediate ? m->intermediate
                                                                : m->shared_intermediate;
    const int64_t wide = 2 * I > H ? 2 * I : H;
    float *acc = calloc((size_t)(T * H + E + T * K), sizeof(float));
    int32_t *ids = malloc(sizeof(int32_t) * (T * K + T));
    uint16_t *buf = malloc(sizeof(uint16_t) * T * (H + 2 * I + I + H + wide));
    if (acc == NULL || ids == NULL || buf == NULL) {
        free(acc); free(ids); free(buf);
        return 2;
    }
    float *probs = acc + T * H, *weights = probs + E;
    int32_t *rows_of = ids + T * K; /* the tokens routed to one expert */
    uint16_t *rows = buf, *hidden = rows + T * H, *act = hidden + T * 2 * I;
    uint16_t *expert_out = act + T * I, *scratch = expert_out + T * H;
    for (int64_t t = 0; t < T; t++) route(m, x + t * H, H, probs, ids + t * K, weights + t * K);
    int failed = 0;
    for (int64_t e = 0; e < E && !failed; e++) {
        int64_t n = 0;
        for (int64_t i = 0; i < T * K; i++)
            if (ids[i] == e) {
                rows_of[n] = (int32_t)i; /* token i / K, its choice i % K */
                memcpy(rows + n * H, x + (i / K) * H, sizeof(uint16_t) * H);
                n++;
            }
        if (n == 0) continue;
        if (m->gate_up[e].parts[0].codes == NULL) { failed = 3; break; } /* not held here */
        failed |= expert(m->gate_up + e, m->down + e, activation, n, H, m->intermediate, rows,
                         hidden, act, expert_out, scratch);
        for (int64_t r = 0; r < n; r++) {
            const float w = weights[rows_of[r]];
            float *a = acc + (rows_of[r] / K) * H;
            for (int64_t j = 0; j < H; j++)
                a[j] += round_bf16(bf16_to_float(expert_out[r * H + j]) * w);
        }
    }
    if (!failed && m->shared_gate_up.parts[0].codes != NULL) {
        failed |= expert(&m->shared_gate_up, &m->shared_down, activation, T, H,
                         m->shared_intermediate, x, hidden, act, expert_out, scratch);
        for (int64_t t = 0; t < T; t++) {
            const float g = round_bf16(
                1.f / (1.f + expf(-dot_bf16(x + t * H, m->shared_gate, H))));
            for (int64_t j = 0; j < H; j++)
                acc[t * H + j] += round_bf16(bf16_to_float(expert_out[t * H + j]) * g);
        }
    }
    for (int64_t i = 0; i < T * H; i++) out[i] = float_to_bf16(acc[i]);
    free(acc); free(ids); free(buf);
    return failed;
}

/*
 * decode_loop.c: several greedy decode steps in one call (a multi-step's extra steps,
 * worker/multi_step.py): the host's per-step glue (input arrays, slot mapping, the two
 * calls) would otherwise cost about as much as a tenth of a batch-1 step.
 *
 * Each step is exactly what the runner's own step does on this path: the slot of every
 * request's position from each KV cache group's block table, decode_stack_bf16 (embedding
 * lookup and final norm in the call), greedy_head_bf16 on its output, and the argmax fed back as the next
 * step's input one position further.
 */
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

/* `steps` decode steps of T requests (token t is request t). input_ids, positions [T] int64
 * and seq_lens [T] int32 hold the first step's inputs and are advanced in place;
 * groups: the model's `num_groups` KV cache groups (a windowed model's sliding-window
 * layers keep their own), each of whose `block_tables` [T, max_blocks] int32 cover every
 * step's position (a window's blocks wholly behind it may be the null block: its layers
 * never read them) and whose `slots` [T] int64 is the caller's buffer, written here each
 * step;
 * token_rows [T] is 0..T-1. head, N, k, weight, scratch: greedy_head_bf16's. tokens
 * [steps, T] out. *steps_done: the steps whose tokens are in `tokens`.
 * stop_ids [T, stop_width] (-1: none; NULL when stop_width is 0): each row's tokens that
 * end its request; the call returns after the first step where a row samples one of its
 * own, so no step is computed past it (the engine's stop checks cut the tokens as ever).
 * Returns 0; the decode stack's or the head's code (below 16); 17 when the stack does not
 * look the embeddings up or apply the final norm itself; 16 when a row of a step's hidden
 * states was not finite (that step's tokens hold -1 there and count in *steps_done). */
int decode_greedy_steps(const StackDims *d, const StackLayer *layers, int64_t T,
                        int64_t steps, int64_t *input_ids, uint16_t *hidden, float *residual,
                        int64_t *positions, const StackGroup *groups, int64_t num_groups,
                        int32_t *seq_lens, const int32_t *token_rows,
                        const StackLoRAStep *lora, const StackMatrix *head, int64_t N,
                        const uint16_t *weight, int64_t k, uint16_t *scratch,
                        int64_t *tokens, int64_t *steps_done, const int64_t *stop_ids,
                        int64_t stop_width) {
    *steps_done = 0;
    if (d->embedding == NULL || d->final_norm == NULL) return 17;
    const int64_t bs = d->block_size;
    for (int64_t s = 0; s < steps; s++) {
        int64_t max_seq_len = 1;
        for (int64_t t = 0; t < T; t++)
            if (seq_lens[t] > max_seq_len) max_seq_len = seq_lens[t];
        for (int64_t g = 0; g < num_groups; g++) {
            /* slots: the caller's buffer, which the stack reads */
            int64_t *slots = (int64_t *)groups[g].slots;
            const int32_t *tables = groups[g].block_tables;
            const int64_t max_blocks = groups[g].max_blocks;
            for (int64_t t = 0; t < T; t++) {
                const int64_t pos = positions[t];
                slots[t] = (int64_t)tables[t * max_blocks + pos / bs] * bs + pos % bs;
            }
        }
        int failed = decode_stack_bf16(d, layers, T, input_ids, hidden, residual, positions,
                                       groups, seq_lens, token_rows, max_seq_len, lora, NULL);
        if (failed) return failed;
        int64_t *out = tokens + s * T;
        failed = greedy_head_bf16(head, T, N, d->hidden, hidden, d->hidden, weight, k, out,
                                  scratch);
        if (failed) return failed;
        *steps_done = s + 1;
        int stopped = 0;
        for (int64_t t = 0; t < T; t++) {
            if (out[t] < 0) return 16;
            for (int64_t j = 0; j < stop_width; j++)
                stopped |= out[t] == stop_ids[t * stop_width + j];
            input_ids[t] = out[t];
            positions[t] += 1;
            seq_lens[t] += 1;
        }
        if (stopped) return 0;
    }
    return 0;
}

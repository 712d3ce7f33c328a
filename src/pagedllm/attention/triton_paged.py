"""The GPU attention backend: the paged Triton kernel (triton_kernels/paged_attention.py).

Same cache layout and contract as the torch backend (torch_paged.py, the reference): the
step's K/V are written at `slot_mapping` with one indexed copy per cache, then one kernel
launch per layer attends every request of the batch, decodes and prefills together, each
query reading its context straight from the paged blocks (no gathered copy). Per-step
metadata is just the runner's tensors: nothing to precompute, nothing read back from the
device, so a decode step can be captured in a CUDA graph.

It runs where Triton runs: compiled on CUDA, or in Triton's interpreter on CPU tensors
(`TRITON_INTERPRET=1`; tests only, it is slow).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedllm.attention import kv_quant
from pagedllm.attention.backend import AttentionBackend, CommonAttentionMetadata
from pagedllm.platform import get_platform


@dataclass
class TritonPagedMetadata:
    """Per-step metadata of `TritonPagedBackend`: the runner's tensors, on the device.

    Attributes:
        slot_mapping: [num_tokens] cache slot of each new token.
        block_tables: [num_reqs, max_blocks] block ids.
        seq_lens: [num_reqs] cached context plus this step's tokens.
        query_start_loc: [num_reqs + 1] where each request's tokens start.
        max_query_len: the longest query of the step (the kernel's grid).
        max_seq_len: the longest sequence (bounds the decode split), None in a captured
            graph (the metadata must not depend on a step's lengths there).
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    max_query_len: int
    max_seq_len: int | None = None


class TritonPagedBackend(AttentionBackend):
    """Paged attention in one Triton kernel per layer (CUDA; CPU under TRITON_INTERPRET).

    KV cache of one layer: [2, num_blocks, block_size, num_kv_heads, head_size], K then V,
    as the torch backend, or the int8 format's rows (kv_cache_dtype="int8": the kernel
    reads the codes and scales and attends in float32).
    """

    name = "triton"
    cuda_graph_safe = True

    # [2 (K, V), num_blocks, block_size, num_kv_heads, row]: values, or int8 rows.
    get_kv_cache_shape = staticmethod(kv_quant.cache_shape)

    def build_metadata(
        self, common: CommonAttentionMetadata, block_size: int
    ) -> TritonPagedMetadata:
        """The step's layout as the kernel reads it."""
        if not get_platform(common.block_tables.device).runs_triton():
            raise ValueError(
                "The Triton attention backend runs on CUDA, or on CPU with TRITON_INTERPRET=1 "
                f"(tests); the model is on {common.block_tables.device}."
            )
        return TritonPagedMetadata(
            slot_mapping=common.slot_mapping,
            block_tables=common.block_tables,
            seq_lens=common.seq_lens,
            query_start_loc=common.query_start_loc,
            max_query_len=common.max_query_len,
            max_seq_len=None if common.for_cuda_graph else common.max_seq_len,
        )

    def attend(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_size]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_size]
        metadata: TritonPagedMetadata,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_size]
        """Each query to its context, in one kernel launch (K/V already in the cache)."""
        from pagedllm.triton_kernels.paged_attention import paged_attention

        return paged_attention(
            query if query.stride(-1) == 1 else query.contiguous(),
            kv_cache,
            metadata.block_tables,
            metadata.seq_lens,
            metadata.query_start_loc,
            metadata.max_query_len,
            scale,
            window,
            max_seq_len=metadata.max_seq_len,
        )

"""AttentionBackend interface and the metadata every backend starts from.

The model runner builds one `CommonAttentionMetadata` per step (torch tensors on the model's
device). The active backend turns it once per step into its own metadata object (for example
padding indices and masks), which every attention layer then reuses. Backends never see the
scheduler; they see block tables and slot mappings only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch

from pagedllm.attention import kv_quant


@dataclass
class CommonAttentionMetadata:
    """Batch layout of one step: requests are contiguous runs of tokens.

    Attributes:
        num_reqs: requests in the batch.
        num_tokens: tokens in the batch (sum of query lengths).
        query_start_loc: [num_reqs + 1] int64, where each request's tokens start.
        query_lens: [num_reqs] int64, tokens computed this step per request.
        context_lens: [num_reqs] int64, tokens already in the cache before this step.
        seq_lens: [num_reqs] int64, context_lens + query_lens.
        max_query_len: largest query length.
        max_seq_len: largest sequence length.
        block_tables: [num_reqs, max_num_blocks] int64, block ids, padded with 0.
        slot_mapping: [num_tokens] int64, cache slot of each new token.
        query_lens_cpu / seq_lens_cpu: the same lengths as Python lists (no device sync).
        contexts_rewritten: positions below a request's context may hold other tokens than
            in earlier steps (speculative decoding rolls rejected drafts back and writes
            those positions again): a backend that keeps copies of contexts across steps
            (torch_grouped.py) must not reuse them.
        for_cuda_graph: the metadata of a captured decode graph, replayed with other
            lengths and block tables in the same tensors: the host-side fields (the
            lists, max_seq_len) describe the capture, not the steps that replay it.
        key_ends: [num_tokens] int64, or None (causal): each token's exclusive bound on
            the key positions it attends, past its own where its image's tokens attend to
            each other both ways (Gemma 3). Only the reference backend (torch_paged.py)
            reads it; the runner runs such steps on it.
    """

    num_reqs: int
    num_tokens: int
    query_start_loc: torch.Tensor
    query_lens: torch.Tensor
    context_lens: torch.Tensor
    seq_lens: torch.Tensor
    max_query_len: int
    max_seq_len: int
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    query_lens_cpu: list[int]
    seq_lens_cpu: list[int]
    contexts_rewritten: bool = False
    for_cuda_graph: bool = False
    key_ends: torch.Tensor | None = None

    def decode_and_prefill_rows(self) -> tuple[list[int], list[int]]:
        """Indices of the requests computing one token (decodes) and more (prefills)."""
        decodes = [i for i, n in enumerate(self.query_lens_cpu) if n == 1]
        prefills = [i for i, n in enumerate(self.query_lens_cpu) if n > 1]
        return decodes, prefills


class AttentionBackend(ABC):
    """One implementation of attention over the paged KV cache.

    Contract: `build_metadata` is called once per step before the forward pass; `forward`
    is called once per layer with that step's metadata (which has a `slot_mapping`) and the
    layer's cache. Every backend's forward is the same two steps: `store_kv` writes the new tokens'
    K/V into the cache at `slot_mapping` (nothing else in the cache changes), then `attend`
    computes the attention output. A new backend implements `build_metadata` and `attend`,
    and overrides `store_kv` only where it has a faster writer.
    """

    name: str = "abstract"
    # True when the backend reads all its per-step metadata from device tensors (no host
    # lists, no host syncs): a decode step can then be captured in a CUDA graph and
    # replayed with new values in the same tensors (worker/decode_step/cuda_graphs.py).
    cuda_graph_safe: bool = False

    @staticmethod
    @abstractmethod
    def get_kv_cache_shape(
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        cache_dtype: str = "auto",
    ) -> tuple[int, ...]:
        """Shape of one layer's KV cache tensor in the `cache_dtype` format."""

    @staticmethod
    def get_kv_cache_dtype(model_dtype: torch.dtype, cache_dtype: str) -> torch.dtype:
        """The element dtype of the KV cache tensors: the model's for "auto"."""
        if cache_dtype == "auto":
            return model_dtype
        if cache_dtype == "int8":
            return torch.int8
        raise ValueError(f"Unknown KV cache dtype {cache_dtype!r}.")

    @abstractmethod
    def build_metadata(self, common: CommonAttentionMetadata, block_size: int) -> Any:
        """Per-step metadata for this backend, computed once and shared by all layers."""

    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_size]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        kv_cache: torch.Tensor,
        metadata: Any,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_size]
        """Store K/V of the new tokens, then attend each query to its request's context:
        with a `window` (sliding-window layers), to the keys at positions > its own -
        window only."""
        key, value = self.store_kv(kv_cache, key, value, metadata.slot_mapping)
        return self.attend(query, key, value, kv_cache, metadata, scale, window)

    def store_kv(
        self, kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the step's K/V into the cache at `slot_mapping` (an int8 cache's rows with
        kv_quant's writer, no host sync); return them as `attend` takes them."""
        if kv_cache.dtype == torch.int8:
            kv_quant.store_rows(kv_cache, key, value, slot_mapping)
        else:
            write_kv(kv_cache, key, value, slot_mapping)
        return key, value

    @abstractmethod
    def attend(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_size]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size], as store_kv returned
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        kv_cache: torch.Tensor,
        metadata: Any,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_size]
        """Attend each query to its request's context, this step's K/V already stored."""


def write_kv(
    kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Write the step's K/V [num_tokens, num_kv_heads, head_size] into a cache laid out as
    [2, num_blocks, block_size, num_kv_heads, head_size] at `slot_mapping` (one indexed
    copy each, no host sync: safe inside a CUDA graph)."""
    flat_cache = kv_cache.view(2, -1, *key.shape[1:])  # [2, num_slots, Hkv, D]
    flat_cache[0].index_copy_(0, slot_mapping, key)
    flat_cache[1].index_copy_(0, slot_mapping, value)

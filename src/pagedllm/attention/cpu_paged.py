"""The CPU attention backend: the C kernels read every context straight from the paged cache.

Per layer it writes the new tokens' K/V into the cache (an int8 cache through the C writer),
then attends decodes (one query row per request) and prefills (several, causally after a
cached context) with the kernels of attention/cpu_kernel.py. No context is ever copied out
of the cache, so nothing depends on the batch layout beyond the per-step tables built once
in `build_metadata`. The registry picks it on CPU when the kernel library is there for the
model's dtype (float32 or bfloat16); `torch_paged` is the reference and the fallback.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedllm.attention import cpu_kernel
from pagedllm.attention.backend import AttentionBackend, CommonAttentionMetadata
from pagedllm.attention.torch_paged import TorchPagedBackend

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)


@dataclass
class KernelDecodes:
    """All decode requests of a step.

    Attributes:
        token_rows: [n] int32 batch token of each decode request.
        block_tables: [n, max_blocks] int32.
        seq_lens: [n] int32 context length including the new token.
        max_seq_len: the longest of them.
    """

    token_rows: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    max_seq_len: int


@dataclass
class KernelPrefills:
    """All prefill requests of a step.

    Attributes:
        block_tables: [n, max_blocks] int32.
        query_starts: [n] int32 batch token of each request's first query.
        query_lens: [n] int32 new tokens of each request.
        context_lens: [n] int32 tokens cached before this step.
        max_seq_len: the longest context + new tokens.
    """

    block_tables: torch.Tensor
    query_starts: torch.Tensor
    query_lens: torch.Tensor
    context_lens: torch.Tensor
    max_seq_len: int


@dataclass
class CpuPagedMetadata:
    """Per-step metadata of `CpuPagedBackend`, shared by all layers of the step.

    Attributes:
        num_tokens: tokens in the batch.
        slot_mapping: [num_tokens] cache slot of each new token.
        decodes: the decode requests, or None.
        prefills: the prefill requests, or None.
    """

    num_tokens: int
    slot_mapping: torch.Tensor
    decodes: KernelDecodes | None = None
    prefills: KernelPrefills | None = None

    def decodes_only(self) -> KernelDecodes | None:
        """The step's decodes when the step is made of decodes alone."""
        if self.prefills is not None or self.decodes is None:
            return None
        return self.decodes if self.decodes.seq_lens.shape[0] == self.num_tokens else None


def _decodes(common: CommonAttentionMetadata, rows: list[int]) -> KernelDecodes:
    index = torch.tensor(rows)
    return KernelDecodes(
        token_rows=common.query_start_loc[index].to(torch.int32),
        block_tables=common.block_tables[index].to(torch.int32).contiguous(),
        seq_lens=common.seq_lens[index].to(torch.int32),
        max_seq_len=max(common.seq_lens_cpu[i] for i in rows),
    )


def _prefills(common: CommonAttentionMetadata, rows: list[int]) -> KernelPrefills:
    index = torch.tensor(rows)
    return KernelPrefills(
        block_tables=common.block_tables[index].to(torch.int32).contiguous(),
        query_starts=common.query_start_loc[index].to(torch.int32),
        query_lens=common.query_lens[index].to(torch.int32),
        context_lens=common.context_lens[index].to(torch.int32),
        max_seq_len=max(common.seq_lens_cpu[i] for i in rows),
    )


class CpuPagedBackend(AttentionBackend):
    """Paged attention by the C kernels, for float32 and bfloat16 on CPU.

    The KV cache layout is the torch backend's (same shape, same int8 rows), so the two
    backends read each other's caches and the torch backend checks this one in tests.
    """

    name = "cpu"
    get_kv_cache_shape = staticmethod(TorchPagedBackend.get_kv_cache_shape)

    def build_metadata(
        self, common: CommonAttentionMetadata, block_size: int
    ) -> CpuPagedMetadata:
        """The decodes' and prefills' block tables and lengths as the kernels take them."""
        del block_size  # the kernels read it from the cache's shape
        metadata = CpuPagedMetadata(common.num_tokens, common.slot_mapping)
        decode_rows, prefill_rows = common.decode_and_prefill_rows()
        if decode_rows:
            metadata.decodes = _decodes(common, decode_rows)
        if prefill_rows:
            metadata.prefills = _prefills(common, prefill_rows)
        return metadata

    def store_kv(
        self, kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """An int8 cache's rows through the C writer (one call a layer); else the base's."""
        if kv_cache.dtype != torch.int8:
            return super().store_kv(kv_cache, key, value, slot_mapping)
        cpu_kernel.store_int8(kv_cache, key, value, slot_mapping)
        return key, value

    def attend(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_size]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, row]
        metadata: CpuPagedMetadata,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_size]
        """Every query from the cache (within `window` positions of it, for a
        sliding-window layer): the kernels read the new tokens back from it too."""
        if query.dtype not in SUPPORTED_DTYPES:
            raise NotImplementedError(
                f"The CPU attention kernels take float32 and bfloat16, not {query.dtype}; "
                "the registry gives other dtypes the torch backend."
            )
        out = torch.empty_like(query)  # [num_tokens, H, D]
        decodes, prefills = metadata.decodes, metadata.prefills
        if decodes is not None:
            cpu_kernel.paged_decode_attention(
                out, query.contiguous(), kv_cache, decodes.block_tables, decodes.seq_lens,
                decodes.token_rows, decodes.max_seq_len, scale, window,
            )
        if prefills is not None:
            cpu_kernel.paged_prefill_attention(
                out, query, kv_cache, prefills.block_tables, prefills.query_starts,
                prefills.query_lens, prefills.context_lens, prefills.max_seq_len, scale,
                window,
            )
        return out

"""The bytes one batch-1 decode step of the engine reads, and the memory floor they set.

Counted from the loaded engine, not from the config: every linear layer's weight as the
step multiplies it (a layer with a small-step and a large-step method counts the small one,
e.g. the 4-bit groups with their scales; a dense layer its dense weight), the LM head as a
plain greedy step reads it (the 4-bit shortlist where the engine keeps one, else its 8-bit
or dense weight; the float32 refinement of the top 8 rows is left out: 8 rows), the other
parameters a layer reads whole (norms, biases), and the KV cache of `context_len` positions
in its own dtype (int8 with its scales where the default picks it). The embedding table is
left out (one row a token); an MoE layer's experts count top_k / num_experts of their bytes
(one token reads the router's top-k of them; shared experts are read whole).

Used by roofline.py (the floor) and latency.py (the fraction of it a measured step reaches);
cuda_decode.py counts the GPU path's weights with `weight_bytes`.
"""

from __future__ import annotations

import time
from typing import Any


def _step_method(method: Any) -> Any:
    """The method a one-row step runs: a crossover's small side, else the method."""
    small = getattr(method, "small", None)
    return small if small is not None else method


def weight_bytes(model: Any, greedy: bool = True) -> dict[str, int]:
    """Bytes of the weights a batch-1 decode step reads: {"linear", "head", "other"}."""
    from pagedllm.layers.embedding import LMHead, VocabEmbedding
    from pagedllm.layers.quantization.base import LinearMethod

    counted: set[int] = set()
    parts = {"linear": 0, "head": 0, "other": 0}
    share = _expert_shares(model)
    for module in model.modules():
        if isinstance(module, VocabEmbedding):
            counted.update(id(p) for p in module.parameters(recurse=False))
            continue
        method = getattr(module, "method", None)
        if not isinstance(method, LinearMethod):
            continue
        if isinstance(module, LMHead):
            chosen = module.shortlist if greedy and module.shortlist is not None else method
            parts["head"] += _step_method(chosen).nbytes()
        else:
            parts["linear"] += round(_step_method(method).nbytes() * share.get(id(module), 1.0))
        # The layer's weight is read through its method; its bias (if any) below.
        weight = getattr(module, "weight", None)
        if weight is not None:
            counted.add(id(weight))
    for param in {id(p): p for p in model.parameters()}.values():
        if id(param) not in counted:
            parts["other"] += param.numel() * param.element_size()
    return parts


def _expert_shares(model: Any) -> dict[int, float]:
    """{id(linear module): fraction a batch-1 step reads} for every routed expert's layers."""
    from pagedllm.layers.moe import FusedMoE

    shares: dict[int, float] = {}
    for moe in model.modules():
        if isinstance(moe, FusedMoE):
            for module in moe.experts.modules():
                shares[id(module)] = moe.top_k / moe.num_experts
    return shares


def kv_bytes_per_position(llm: Any) -> int:
    """KV cache bytes of one context position over every layer, K and V (scales included)."""
    spec = _worker(llm).kv_cache_spec
    return spec.bytes_per_block // spec.block_size


def decode_step_bytes(llm: Any, context_len: int, greedy: bool = True) -> dict[str, int]:
    """Everything a batch-1 decode step at `context_len` positions reads, by part, and the
    total."""
    parts = weight_bytes(_worker(llm).model, greedy)
    parts["kv"] = kv_bytes_per_position(llm) * context_len
    parts["total"] = sum(parts.values())
    return parts


def measure_read_bandwidth(gib: float = 1.0, repeats: int = 5) -> float:
    """CPU memory read bandwidth in bytes/s: a float32 tensor's bytes / the best time to
    sum it (torch's threads)."""
    import torch

    x = torch.ones(int(gib * 2**30) // 4, dtype=torch.float32)
    x.sum()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - start)
    return x.numel() * 4 / best


def _worker(llm: Any) -> Any:
    return llm.llm_engine.engine_core.engine_core.executor.worker

"""Worker: owns the device, the model and the KV cache tensors; runs steps.

It loads the model, decides how many KV blocks fit the memory budget, allocates one KV tensor
per layer in the attention backend's layout, and hands each step to the ModelRunner.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedllm import envs
from pagedllm.attention.registry import get_attention_backend
from pagedllm.config import EngineConfig
from pagedllm.core.sched_output import SchedulerOutput
from pagedllm.logger import init_logger
from pagedllm.model_loader.loader import get_model
from pagedllm.utils.device import cuda_free_memory_bytes, to_torch_dtype
from pagedllm.worker.model_runner import ModelRunner
from pagedllm.worker.outputs import ModelRunnerOutput

logger = init_logger(__name__)


@dataclass(frozen=True)
class KVCacheSpec:
    """The KV cache as resolved at start-up (known only once the model is loaded)."""

    num_blocks: int
    block_size: int
    bytes_per_block: int


class Worker:
    """Loads the model on its device and executes scheduler outputs."""

    def __init__(self, engine_config: EngineConfig) -> None:
        self.config = engine_config
        self.device = torch.device(engine_config.device_config.device)
        threads = envs.num_threads()
        if threads:
            torch.set_num_threads(threads)
        self.dtype = to_torch_dtype(engine_config.model_config.dtype)
        self.model = get_model(engine_config.model_config, str(self.device))
        self.backend = get_attention_backend(self.device.type)
        self.kv_cache_spec = self._determine_kv_cache_spec()
        self.model_runner = ModelRunner(
            self.model,
            self.backend,
            self._allocate_kv_caches(),
            self.kv_cache_spec.block_size,
            self.device,
        )

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step."""
        return self.model_runner.execute_model(scheduler_output)

    def _layer_geometry(self) -> tuple[int, int, int]:
        hf = self.config.model_config.hf_config
        num_kv_heads = getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads
        head_size = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        return hf.num_hidden_layers, num_kv_heads, head_size

    def _determine_kv_cache_spec(self) -> KVCacheSpec:
        cache = self.config.cache_config
        num_layers, num_kv_heads, head_size = self._layer_geometry()
        element_size = torch.empty((), dtype=self.dtype).element_size()
        # K and V, every layer, every token of the block.
        bytes_per_block = 2 * num_layers * cache.block_size * num_kv_heads * head_size * element_size
        if cache.num_gpu_blocks_override is not None:
            num_blocks = cache.num_gpu_blocks_override
        else:
            num_blocks = self._memory_budget_bytes() // bytes_per_block
        if num_blocks < 2:
            raise ValueError(
                f"The KV cache budget holds {num_blocks} block(s) of {bytes_per_block} bytes; "
                "at least 2 are needed. Raise kv_cache_memory_bytes or num_gpu_blocks_override."
            )
        logger.info(
            "KV cache: %d blocks of %d tokens (%.1f MiB)",
            num_blocks,
            cache.block_size,
            num_blocks * bytes_per_block / 2**20,
        )
        return KVCacheSpec(num_blocks, cache.block_size, bytes_per_block)

    def _memory_budget_bytes(self) -> int:
        cache = self.config.cache_config
        if cache.kv_cache_memory_bytes is not None:
            return cache.kv_cache_memory_bytes
        if self.device.type == "cuda":
            free, total = cuda_free_memory_bytes()
            used_by_others = total - free
            return max(int(total * cache.gpu_memory_utilization) - used_by_others, 0)
        return envs.cpu_kv_cache_space_bytes()

    def _allocate_kv_caches(self) -> list[torch.Tensor]:
        num_layers, num_kv_heads, head_size = self._layer_geometry()
        shape = self.backend.get_kv_cache_shape(
            self.kv_cache_spec.num_blocks, self.kv_cache_spec.block_size, num_kv_heads, head_size
        )
        # Zeroed so that padded reads (e.g. of the null block) are finite.
        return [
            torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(num_layers)
        ]

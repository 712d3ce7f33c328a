"""Worker: owns the device, the model and the KV cache tensors; runs steps.

It loads the model, splits its layers into KV cache groups (core/kv_cache_groups.py: one
group unless sliding-window and global layers mix), decides how many KV blocks fit the memory
budget, allocates one KV tensor per slot of a group in the attention backend's layout (layer
j of every group shares slot j's tensor: a block id belongs to one group at a time), and
hands each step to the ModelRunner. In swap preemption mode it also allocates a host-side KV
pool (same layout, CPU memory, `swap_space` GiB) and copies the blocks the scheduler swaps
out or in before each step. An encoder model (BERT) has no KV cache at all: its spec has no
groups and no blocks.
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from pagedllm import envs
from pagedllm.attention import kv_quant
from pagedllm.attention.cpu_paged import CpuPagedBackend
from pagedllm.attention.registry import get_attention_backend
from pagedllm.config import EngineConfig
from pagedllm.core.kv_cache_groups import KVCacheGroupSpec, make_kv_cache_groups, num_kv_slots
from pagedllm.core.sched_output import SchedulerOutput
from pagedllm.distributed.kv_transfer import KVConnectorRole, make_connector
from pagedllm.distributed.parallel_state import get_pp_group, get_world_group
from pagedllm.layers.attention import Attention
from pagedllm.logger import init_logger
from pagedllm.logits_processor import CustomLogitsProcessors
from pagedllm.model_loader.loader import get_model
from pagedllm.platform import get_platform
from pagedllm.pooling.model_pooler import ModelPooler
from pagedllm.spec_decode.proposers import DecodeFn, DrafterContext, Proposer, make_proposer
from pagedllm.utils.device import to_torch_dtype
from pagedllm.worker.decode_step import DecodeBatch, DecodeStep
from pagedllm.worker.decode_step.cpu_stack import CpuDecodeStack
from pagedllm.worker.decode_step.cuda_graphs import DecodeGraphs, default_capture_sizes
from pagedllm.worker.decode_step.stack_reach import extend_reach
from pagedllm.worker.fault_injection import faults_requested, install_fault_injection
from pagedllm.worker.model_runner import ModelRunner
from pagedllm.worker.outputs import ModelRunnerOutput
from pagedllm.worker.sleep_mode import WAKE_UP_TAGS, SleepMode
from pagedllm.worker.step_hooks import StepHook
from pagedllm.worker.step_hooks.kv_connector import KVConnectorHook
from pagedllm.worker.step_hooks.lora import LoRAHook
from pagedllm.worker.step_hooks.multimodal import MultiModalHook
from pagedllm.worker.step_hooks.pooling import PoolingHook
from pagedllm.worker.step_hooks.prompt_logprobs import PromptLogprobsHook
from pagedllm.worker.step_hooks.spec_decode import SpecDecodeHook

if TYPE_CHECKING:
    from pagedllm.lora.manager import LoRAModelManager
    from pagedllm.lora.request import LoRARequest
    from pagedllm.models.interfaces import CausalLM, SupportsMultiModal

logger = init_logger(__name__)


@dataclass(frozen=True)
class KVCacheSpec:
    """The KV cache as resolved at start-up (known only once the model is loaded)."""

    num_blocks: int
    block_size: int
    # Bytes of one block id: K and V of every slot (layer of a group).
    bytes_per_block: int
    # Host-side blocks for swap preemption (0 unless preemption_mode is "swap").
    num_cpu_blocks: int = 0
    # The KV cache groups; one full-attention group of every layer for most models.
    groups: tuple[KVCacheGroupSpec, ...] = ()


class Worker:
    """Loads the model on its device and executes scheduler outputs."""

    def __init__(self, engine_config: EngineConfig) -> None:
        self.config = engine_config
        self.device = torch.device(engine_config.device_config.device)
        self.platform = get_platform(self.device)
        threads = envs.num_threads()
        if threads:
            torch.set_num_threads(threads)
        self.dtype = to_torch_dtype(engine_config.model_config.dtype)
        self.model = get_model(engine_config.model_config, str(self.device))
        install_fault_injection(self.model)  # only when a test asks for it
        self.backend = get_attention_backend(str(self.device), self.dtype)
        self.is_encoder = bool(getattr(self.model, "is_encoder", False))
        self.kv_cache_spec = self._determine_kv_cache_spec()
        self.host_kv_caches = self._allocate_host_kv_caches()
        # One tensor per slot; the runner sees them per layer.
        self.kv_caches = self._allocate_kv_caches()
        self.sleep_mode = SleepMode()
        # Whether a decode stack was built once (its reach is measured only then, over free
        # blocks: stack_reach.py).
        self._stack_reach_measured = False
        self._build_runner()

    def _build_runner(self) -> None:
        """The model runner over the model and the KV caches, its hooks, its fast path."""
        engine_config = self.config
        self.model_runner = ModelRunner(
            self.model,
            self.backend,
            self._layer_kv_caches(self.kv_caches),
            self.kv_cache_spec.block_size,
            self.device,
            kv_cache_groups=self.kv_cache_spec.groups,
            activation_dtype=self.dtype,
        )
        if engine_config.logits_processors:  # the plugins, built once per runner
            self.model_runner.sampling.custom = CustomLogitsProcessors(
                engine_config.logits_processors, engine_config, self.device,
                self.platform.pin_memory)
        self.lora_manager = self._make_lora_manager()
        self.model_runner.hooks.extend(self._make_step_hooks())
        self.model_runner.contexts_rewritten = engine_config.speculative_config is not None
        # Not over released KV memory (weights woken first): wake_up builds it once whole.
        self.model_runner.decode_step = (
            None if self.sleep_mode.kv_released else self._build_decode_step())

    # ------------------------------------------------------------------ sleep mode

    def sleep(self, level: int = 1) -> None:
        """Give memory back while idle (vLLM's sleep mode; worker/sleep_mode.py): level 1
        frees the KV cache, level 2 the weights too (reloaded from the checkpoint)."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}.")
        if level == 2 and self.lora_manager is not None and self.lora_manager.loaded_ids():
            raise ValueError("sleep level 2 reloads the weights and would drop the loaded "
                             "LoRA adapters: remove them first, or use level 1.")
        self.sleep_mode.release_kv_caches([*self.kv_caches, *self.host_kv_caches])
        if level == 2 and not self.sleep_mode.weights_released:
            self.model = None  # type: ignore[assignment]
            self.model_runner = None  # type: ignore[assignment]
            self.lora_manager = None
            self.sleep_mode.weights_released = True
        gc.collect()

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Take back what `sleep` gave (`tags`: "weights", "kv_cache"; None: both)."""
        tags = list(tags) if tags else list(WAKE_UP_TAGS)
        unknown = set(tags) - set(WAKE_UP_TAGS)
        if unknown:
            raise ValueError(f"wake_up tags must be among {list(WAKE_UP_TAGS)}, got "
                             f"{sorted(unknown)}.")
        if "weights" in tags and self.sleep_mode.weights_released:
            self.model = get_model(self.config.model_config, str(self.device))
            install_fault_injection(self.model)  # only when a test asks for it
            self.sleep_mode.weights_released = False
            self._build_runner()
        if "kv_cache" in tags and self.sleep_mode.kv_released:
            self.sleep_mode.restore_kv_caches(
                [*self.kv_caches, *self.host_kv_caches], self._block_dim(),
                zero_all=self.platform.prefaults_kv_cache())
        if not self.is_sleeping() and self.model_runner is not None:
            # The fast path holds the caches' and weights' addresses: take the new ones.
            self.model_runner.decode_step = self._build_decode_step()

    def shutdown(self) -> None:
        """Stop a KV connector's threads and sockets (nothing else needs it)."""
        connector = getattr(self, "_kv_connector", None)
        if connector is not None:
            connector.shutdown()

    def is_sleeping(self) -> bool:
        """True while the KV cache or the weights are given back."""
        return self.sleep_mode.kv_released or self.sleep_mode.weights_released

    def _make_step_hooks(self) -> list[StepHook]:
        """The runner's step hooks this configuration asks for (worker/step_hooks/)."""
        model_config = self.config.model_config
        hooks: list[StepHook] = []
        if self.lora_manager is not None:
            hooks.append(LoRAHook(self.lora_manager, self.device))
        if model_config.pooler_config is not None:
            hooks.append(PoolingHook(ModelPooler(self.model, model_config.pooler_config)))
        if getattr(self.model, "supports_multimodal", False) or model_config.enable_prompt_embeds:
            # First: the model's inputs must be complete before anything reads the step.
            hooks.insert(0, MultiModalHook(cast("SupportsMultiModal", self.model), self.device))
        if model_config.runner == "generate":
            hooks.append(PromptLogprobsHook(cast("CausalLM", self.model)))
        if self.config.kv_transfer_config is not None:
            hooks.append(self._kv_connector_hook())
        proposer = self._make_proposer()
        if proposer is not None:
            assert self.config.speculative_config is not None
            hooks.append(SpecDecodeHook(
                proposer, self.config.speculative_config, self.model_runner.sampling.draft_probs
            ))
        return hooks

    def _kv_connector_hook(self) -> KVConnectorHook:
        """The KV connector's worker half over this worker's caches."""
        if len(self.kv_cache_spec.groups) != 1:
            raise ValueError("kv_transfer_config needs a model with one KV cache group (no "
                             "sliding-window layers beside full ones).")
        # Made once: a runner rebuilt on waking keeps the connector (and a tier it holds).
        connector = getattr(self, "_kv_connector", None)
        if connector is None:
            connector = make_connector(self.config.kv_transfer_config, KVConnectorRole.WORKER,
                                       self.kv_cache_spec.block_size,
                                       self.kv_cache_spec.bytes_per_block)
            self._kv_connector = connector
        connector.register_kv_caches(self.model_runner.kv_caches, self._block_dim())
        connector.set_row_converter(kv_quant.convert_rows)
        return KVConnectorHook(connector)

    def _build_decode_step(self) -> DecodeStep | None:
        """The platform's decode-step fast path, where it serves this engine (none while a
        fault is injected: the fast paths would bypass its hook)."""
        measured, self._stack_reach_measured = self._stack_reach_measured, True
        if faults_requested():
            return None
        kind = self.platform.decode_step_kind()
        if kind == "cuda_graphs":
            return self._capture_decode_graphs()
        if kind == "cpu_stack" and self._cpu_stack_applies():
            runner = self.model_runner
            stack = CpuDecodeStack.build(self.model, runner.kv_caches, runner.group_of_layer)
            if stack is not None:  # measured on the first build only (wake_up rebuilds
                # it over caches whose blocks may be live): extend_reach reuses the choice
                config = self.config
                extend_reach(stack, runner, min(config.scheduler_config.max_num_batched_tokens,
                                                config.model_config.max_model_len),
                             measure=not measured)
            return stack
        return None

    def _cpu_stack_applies(self) -> bool:
        """One rank (the C stack has no collectives and runs every layer) of a generating
        model whose attention is the C kernels' (the stack's results equal the layers'
        then)."""
        return (
            get_world_group().world_size == 1
            and isinstance(self.backend, CpuPagedBackend)
            and self.config.model_config.runner == "generate"
        )

    def _decode_graphs_off_reason(self) -> str | None:
        """Why decode steps cannot replay CUDA graphs here, or None when they can."""
        config = self.config
        checks = [
            (config.model_config.enforce_eager, "enforce_eager=True"),
            (not self.backend.cuda_graph_safe, f"the {self.backend.name} attention backend"),
            (self.is_encoder or config.model_config.runner != "generate", "not a generator"),
            (len(self.kv_cache_spec.groups) != 1, "several KV cache groups"),
            (config.lora_config is not None, "LoRA"),
            (config.speculative_config is not None, "speculative decoding"),
            (get_world_group().world_size > 1, "several ranks"),
        ]
        return next((reason for off, reason in checks if off), None)

    def _capture_decode_graphs(self) -> DecodeGraphs | None:
        """Decode forwards captured per batch size (decode_step/cuda_graphs.py), where they
        serve; a capture that fails (an op of the model that cannot be captured) leaves
        every step eager, with a warning."""
        reason = self._decode_graphs_off_reason()
        if reason is not None:
            if self.platform.captures_graphs():
                logger.info("CUDA graphs off: %s; decode steps run eagerly.", reason)
            return None
        block_size = self.kv_cache_spec.block_size
        graphs = DecodeGraphs(
            self.model,
            self.backend,
            self.model_runner.kv_caches,
            block_size,
            max_blocks_per_seq=-(-self.config.model_config.max_model_len // block_size),
            capture_sizes=default_capture_sizes(self.config.scheduler_config.max_num_seqs),
            device=self.device,
            replay_by_rerunning=not self.platform.captures_graphs(),
        )
        start = time.perf_counter()
        try:
            with torch.inference_mode():  # as the steps run (execute_model)
                graphs.capture_all()
        except Exception as error:  # noqa: BLE001 - any failure means: run eagerly
            logger.warning("CUDA graphs off: capturing a decode step failed (%s).", error)
            return None
        logger.info(
            "Captured decode steps of %d batch sizes (1 to %d) in %.1f s.",
            len(graphs.capture_sizes), graphs.max_batch_size, time.perf_counter() - start,
        )
        return graphs

    def _make_lora_manager(self) -> LoRAModelManager | None:
        """Adapter slots on every LoRA-able layer, when LoRA is on."""
        if self.config.lora_config is None:
            return None
        from pagedllm.lora.manager import LoRAModelManager

        return LoRAModelManager(self.model, self.config.lora_config, self.dtype, self.device)

    def _make_proposer(self) -> Proposer | None:
        """The speculative decoding proposer, with what a model-based one needs."""
        config = self.config.speculative_config
        if config is None:
            return None
        groups = self.kv_cache_spec.groups
        if config.num_lookahead_slots and (
            len(groups) != 1 or groups[0].sliding_window is not None
        ):
            # The drafter's cache follows the target's block table, which must then hold
            # every position (no sliding window letting blocks go).
            raise ValueError(
                f"speculative_config method {config.method!r} needs a target whose layers all "
                "attend to the whole context (one KV cache group without a sliding window)."
            )
        context = DrafterContext(
            target=self.model,
            backend=self.backend,
            block_size=self.kv_cache_spec.block_size,
            num_blocks=self.kv_cache_spec.num_blocks,
            device=self.device,
            dtype=self.dtype,
            kv_cache_dtype=self.config.cache_config.cache_dtype,
            model_config=config.draft_model_config,
            decode_step_for=self._drafter_decode_step,
        )
        return make_proposer(config, context)

    def _drafter_decode_step(
        self, model: torch.nn.Module, kv_caches: list[torch.Tensor]
    ) -> DecodeFn | None:
        """The CPU decode stack for a draft model over its own caches, where it serves."""
        if self.platform.decode_step_kind() != "cpu_stack" or not self._cpu_stack_applies():
            return None
        stack = CpuDecodeStack.build(model, kv_caches)
        if stack is None:
            return None

        def run(
            input_ids: np.ndarray, positions: np.ndarray, slots: np.ndarray, table: np.ndarray
        ) -> torch.Tensor | None:
            batch = DecodeBatch(input_ids, positions, slots, table)
            return stack.run(batch) if stack.serves(batch) else None

        return run

    def add_lora(self, lora_request: LoRARequest) -> None:
        """Load an adapter onto the host now (ValueError: missing, unsupported, misfit)."""
        self._lora_manager().add(lora_request)

    def remove_lora(self, lora_int_id: int) -> None:
        """Drop an adapter's host copy and slot (a later request reloads it)."""
        self._lora_manager().remove(lora_int_id)

    def list_loras(self) -> list[int]:
        """Ids of the adapters loaded on the host."""
        return self._lora_manager().loaded_ids()

    def _lora_manager(self) -> LoRAModelManager:
        manager = self.lora_manager
        if manager is None:
            raise ValueError("LoRA is off: start the engine with enable_lora=True.")
        return manager

    def run_rpc(self, payload: bytes) -> Any:
        """One `collective_rpc` call (utils/rpc.py `encode_rpc`): a Worker method by
        name, or a function called with this worker first."""
        from pagedllm.utils.rpc import decode_rpc

        method, args, kwargs = decode_rpc(payload)
        if isinstance(method, str):
            if method.startswith("_") or not callable(getattr(self, method, None)):
                raise ValueError(f"Worker has no public method {method!r}.")
            return getattr(self, method)(*args, **kwargs)
        return method(self, *args, **kwargs)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Apply the step's swaps, then run it."""
        self.swap_blocks(scheduler_output)
        return self.model_runner.execute_model(scheduler_output)

    def swap_blocks(self, scheduler_output: SchedulerOutput) -> None:
        """Copy swapped-out blocks device → host, then swapped-in blocks host → device.

        Out before in, and both before the forward pass, which may overwrite the device
        blocks just swapped out (the scheduler has already handed them to other requests).
        """
        device_caches, host_caches = self.kv_caches, self.host_kv_caches
        for pairs, is_out in (
            (scheduler_output.blocks_to_swap_out, True),
            (scheduler_output.blocks_to_swap_in, False),
        ):
            if pairs:
                device_ids, host_ids = (list(ids) for ids in zip(*pairs, strict=True))
                if is_out:
                    self._copy_blocks(device_caches, device_ids, host_caches, host_ids)
                else:
                    self._copy_blocks(host_caches, host_ids, device_caches, device_ids)

    def _copy_blocks(
        self,
        sources: list[torch.Tensor],
        source_ids: list[int],
        targets: list[torch.Tensor],
        target_ids: list[int],
    ) -> None:
        """Copy block source_ids[i] of every slot's source into block target_ids[i]."""
        dim = self._block_dim()
        for source, target in zip(sources, targets, strict=True):
            if source.numel() == 0 or target.numel() == 0:
                continue  # a slot only other pipeline stages use
            source_index = torch.tensor(source_ids, dtype=torch.int64, device=source.device)
            target_index = torch.tensor(target_ids, dtype=torch.int64, device=target.device)
            blocks = source.index_select(dim, source_index).to(target.device)
            target.index_copy_(dim, target_index, blocks)

    def _block_dim(self) -> int:
        # The dimension of the backend's KV layout that indexes blocks: the one that changes
        # with the number of blocks.
        shape_1 = self.backend.get_kv_cache_shape(1, self.kv_cache_spec.block_size, 1, 1)
        shape_2 = self.backend.get_kv_cache_shape(2, self.kv_cache_spec.block_size, 1, 1)
        (dim,) = [i for i, (a, b) in enumerate(zip(shape_1, shape_2, strict=True)) if a != b]
        return dim

    def _attention_layers(self) -> list[Attention]:
        """This rank's attention layers, by layer index."""
        return sorted(
            (m for m in self.model.modules() if isinstance(m, Attention)),
            key=lambda attn: attn.layer_idx,
        )

    def _layer_geometry(self) -> tuple[int, int]:
        """(KV heads, head size) of every attention layer (this rank's share of the heads
        under tensor parallelism)."""
        first = self._attention_layers()[0]
        return first.num_kv_heads, first.head_size

    def _kv_cache_groups(self) -> tuple[KVCacheGroupSpec, ...]:
        """The model's attention layers, grouped by how far back they attend (every layer of
        the model, also those other pipeline stages hold: the scheduler's block tables are
        the same on every stage)."""
        layers = self._attention_layers()
        spec = getattr(self.model, "spec", None)
        if get_pp_group().world_size > 1 and spec is not None:
            windows = list(spec.layer_windows)
        else:
            assert [attn.layer_idx for attn in layers] == list(range(len(layers))), (
                "attention layers must be numbered 0..n-1"
            )
            windows = [attn.sliding_window for attn in layers]
        return make_kv_cache_groups(windows, self.config.model_config.max_model_len)

    def _local_slots(self, groups: tuple[KVCacheGroupSpec, ...]) -> set[int]:
        """The KV slots this rank's layers use (all of them but on a pipeline stage)."""
        local = {attn.layer_idx for attn in self._attention_layers()}
        return {
            slot
            for group in groups
            for slot, layer_index in enumerate(group.layer_indices)
            if layer_index in local
        }

    def _determine_kv_cache_spec(self) -> KVCacheSpec:
        cache = self.config.cache_config
        if self.is_encoder:
            # A pool of just the null block and one more: the scheduler takes none.
            return KVCacheSpec(num_blocks=2, block_size=cache.block_size, bytes_per_block=0)
        num_kv_heads, head_size = self._layer_geometry()
        groups = self._kv_cache_groups()
        one_block = self.backend.get_kv_cache_shape(
            1, cache.block_size, num_kv_heads, head_size, cache.cache_dtype
        )
        element_size = torch.empty((), dtype=self._kv_dtype()).element_size()
        # K and V, every slot this rank uses, every token of the block.
        bytes_per_block = len(self._local_slots(groups)) * math.prod(one_block) * element_size
        if cache.num_gpu_blocks_override is not None:
            num_blocks = cache.num_gpu_blocks_override
        else:
            num_blocks = self._memory_budget_bytes() // bytes_per_block
        # Block ids mean the same on every rank: all take the smallest count.
        num_blocks = int(get_world_group().all_reduce(torch.tensor([num_blocks]), "min")[0])
        if num_blocks < 2:
            raise ValueError(
                f"The KV cache budget holds {num_blocks} block(s) of {bytes_per_block} bytes; "
                "at least 2 are needed. Raise kv_cache_memory_bytes or num_gpu_blocks_override."
            )
        logger.info(
            "KV cache: %d blocks of %d tokens (%.1f MiB, %s), %d group(s) of %d layer(s)%s",
            num_blocks,
            cache.block_size,
            num_blocks * bytes_per_block / 2**20,
            cache.cache_dtype if cache.cache_dtype != "auto" else self.dtype,
            len(groups),
            num_kv_slots(groups),
            ", sliding windows free their old blocks"
            if any(g.sliding_window for g in groups)
            else "",
        )
        num_cpu_blocks = 0
        if self.config.scheduler_config.preemption_mode == "swap":
            num_cpu_blocks = int(cache.swap_space * 2**30) // bytes_per_block
            num_cpu_blocks = int(
                get_world_group().all_reduce(torch.tensor([num_cpu_blocks]), "min")[0]
            )
        return KVCacheSpec(
            num_blocks, cache.block_size, bytes_per_block, num_cpu_blocks, groups
        )

    def _kv_dtype(self) -> torch.dtype:
        return self.backend.get_kv_cache_dtype(self.dtype, self.config.cache_config.cache_dtype)

    def _kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        num_kv_heads, head_size = self._layer_geometry()
        return self.backend.get_kv_cache_shape(
            num_blocks,
            self.kv_cache_spec.block_size,
            num_kv_heads,
            head_size,
            self.config.cache_config.cache_dtype,
        )

    def _memory_budget_bytes(self) -> int:
        cache = self.config.cache_config
        if cache.kv_cache_memory_bytes is not None:
            return cache.kv_cache_memory_bytes
        return self.platform.kv_cache_budget_bytes(cache.gpu_memory_utilization)

    def _layer_kv_caches(self, slot_caches: list[torch.Tensor]) -> list[torch.Tensor]:
        """The cache of every layer: its slot's tensor (shared with the other groups)."""
        slot_of: dict[int, int] = {}
        for group in self.kv_cache_spec.groups:
            for slot, layer_index in enumerate(group.layer_indices):
                slot_of[layer_index] = slot
        return [slot_caches[slot_of[layer]] for layer in range(len(slot_of))]

    def _allocate_kv_caches(self) -> list[torch.Tensor]:
        """One KV tensor per slot of the largest group (none for an encoder)."""
        if not self.kv_cache_spec.groups:
            return []
        shape = self._kv_cache_shape(self.kv_cache_spec.num_blocks)
        local_slots = self._local_slots(self.kv_cache_spec.groups)
        caches = []
        for slot in range(num_kv_slots(self.kv_cache_spec.groups)):
            if slot not in local_slots:  # only other pipeline stages' layers use it
                caches.append(torch.empty(0, dtype=self._kv_dtype(), device=self.device))
                continue
            # Not zeroed: on CPU the pages of a large empty tensor only become resident when
            # a block is first written, so memory grows with use instead of the full budget
            # (unless PAGEDLLM_CPU_KVCACHE_PREFAULT asks for all of it at start).
            cache = torch.empty(shape, dtype=self._kv_dtype(), device=self.device)
            if self.platform.prefaults_kv_cache():
                cache.zero_()
            else:  # padded reads go to the null block 0: it must hold finite values
                cache.select(self._block_dim(), 0).zero_()
            caches.append(cache)
        return caches

    def _allocate_host_kv_caches(self) -> list[torch.Tensor]:
        """The swap space: one host tensor per slot, in the device caches' layout."""
        num_cpu_blocks = self.kv_cache_spec.num_cpu_blocks
        # Block 0 is unused, as in every pool; an encoder has no KV to swap.
        if num_cpu_blocks < 2 or not self.kv_cache_spec.groups:
            return []
        shape = self._kv_cache_shape(num_cpu_blocks)
        # Pinned on CUDA hosts so copies are fast; a plain second pool on a CPU device.
        pin = self.platform.pin_memory
        logger.info(
            "Swap space: %d host blocks (%.1f MiB)",
            num_cpu_blocks,
            num_cpu_blocks * self.kv_cache_spec.bytes_per_block / 2**20,
        )
        local_slots = self._local_slots(self.kv_cache_spec.groups)
        return [
            torch.empty(
                shape if slot in local_slots else (0,), dtype=self._kv_dtype(), device="cpu",
                pin_memory=pin,
            )
            for slot in range(num_kv_slots(self.kv_cache_spec.groups))
        ]

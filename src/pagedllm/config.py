"""Frozen engine configuration: model, cache, scheduler and device sub-configs.

Every value here is resolved before the engine starts (paths found, `max_model_len` read from
the model, dtype chosen) so that no layer mutates configuration at run time. Values that are
only known after the model is loaded, such as the number of KV blocks, travel separately
(see `worker.worker.KVCacheSpec`). This module must not import torch or transformers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from pagedllm.lora.config import LoRAConfig
from pagedllm.pooling.config import PoolerConfig
from pagedllm.spec_decode.config import SpeculativeConfig

SUPPORTED_DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATION_METHODS = ("int8", "int4", "fp8")
# What `quantization` accepts: None (the checkpoint decides), "none" (dense weights) or a method.
# Checkpoint formats named by their config.json `quantization_config` (vLLM's names); their
# codes run as "int4" / "int8" (model_loader/checkpoint_quantization.py).
CHECKPOINT_QUANTIZATIONS = ("gptq", "awq", "compressed-tensors")
QUANTIZATION_CHOICES = ("none", *QUANTIZATION_METHODS, *CHECKPOINT_QUANTIZATIONS)
# KV cache formats: "auto" is the model's dtype (as in vLLM); "int8" stores codes with one
# float32 scale per 16 values of a (position, kv head) row (attention/kv_quant.py).
KV_CACHE_DTYPES = ("auto", "int8")
# Values per float32 scale in the int8 KV format: head sizes must be multiples of it.
KV_INT8_GROUP = 16
PREEMPTION_MODES = ("recompute", "swap")
SCHEDULING_POLICIES = ("fcfs", "priority")


@dataclass(frozen=True)
class ModelConfig:
    """Which model to run and how.

    Attributes:
        model: the name the user gave (a folder, a .gguf file, or the default model's name).
        model_dir: folder holding config/tokenizer files (for GGUF: the file's folder).
        gguf_file: the GGUF file's name inside `model_dir`, or None for a safetensors folder.
        dtype: resolved torch dtype name: "float32", "bfloat16" or "float16".
        max_model_len: longest prompt + output, in tokens.
        seed: seed of the engine's default random generator.
        architecture: HF `architectures[0]`, e.g. "LlamaForCausalLM".
        hf_config: the transformers `PretrainedConfig` (not compared, not printed).
        quantization: weight quantization ("int8", "int4", "fp8") or None for dense weights.
        keep_dense_weights: with quantization, also keep the dense weights for large steps.
        enforce_eager: run every step eagerly (no CUDA graphs, vLLM's flag).
        checkpoint_quantization: a GPTQ / AWQ / compressed-tensors checkpoint's
            `quantization_config` (its layers are stored quantized:
            model_loader/checkpoint_quantization.py), else None.
        runner: "generate" or "pooling" (models/registry.py resolve_runner).
        convert: "embed" when a generating decoder serves as an embedder, else None.
        supported_tasks: what requests the model serves: ("generate",), or pooling tasks
            (embed, encode, classify, score, reward).
        pooler_config: how pooling requests pool (resolved: the user's overrides over the
            sentence-transformers folder over the architecture's defaults); None when the
            model serves no pooling task.
        limit_mm_per_prompt: most images / videos in one prompt, by modality (vLLM's
            name; unlisted: no limit); a vision-language model only.
        mm_processor_kwargs: default options of the model's transformers processor
            (a request's own override them).
        max_logprobs: most logprobs (sample or prompt) a request may ask for; -1: the whole
            vocabulary (vLLM's --max-logprobs; a request's -1 counts as the vocabulary).
        enable_sleep_mode: the engine may `sleep` (give its KV cache and weights back while
            idle) and `wake_up` (vLLM's sleep mode).
        enable_prompt_embeds: prompts may come as embeddings (`{"prompt_embeds": tensor}`;
            multimodal/prompt_embeds.py).
    """

    model: str
    model_dir: str
    gguf_file: str | None
    dtype: str
    max_model_len: int
    seed: int
    architecture: str
    hf_config: Any = field(compare=False, repr=False)
    quantization: str | None = None
    keep_dense_weights: bool = True
    checkpoint_quantization: dict[str, Any] | None = field(default=None, compare=False)
    runner: str = "generate"
    convert: str | None = None
    supported_tasks: tuple[str, ...] = ("generate",)
    pooler_config: PoolerConfig | None = None
    enforce_eager: bool = False
    limit_mm_per_prompt: dict[str, int] | None = field(default=None, compare=False)
    mm_processor_kwargs: dict[str, Any] | None = field(default=None, compare=False)
    max_logprobs: int = 20
    enable_sleep_mode: bool = False
    enable_prompt_embeds: bool = False

    @property
    def text_config(self) -> Any:
        """The config of the text model (the whole config for a text-only model)."""
        return self.hf_config.get_text_config()


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache settings.

    Attributes:
        block_size: tokens per KV block.
        kv_cache_memory_bytes: KV cache budget in bytes (None: the device's default).
        num_gpu_blocks_override: exact number of KV blocks (vLLM's name; wins over the budget).
        gpu_memory_utilization: share of CUDA memory the engine may use (CUDA only).
        enable_prefix_caching: reuse the KV of cached full blocks across requests.
        swap_space: host memory for KV blocks of requests preempted by swap, in GiB.
        cache_dtype: KV cache format, one of KV_CACHE_DTYPES.
    """

    block_size: int = 16
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    swap_space: float = 4
    cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.cache_dtype not in KV_CACHE_DTYPES:
            fp8 = " (fp8 KV caches are not built; int8 is the compact one)"
            raise ValueError(
                f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.cache_dtype!r}"
                f"{fp8 if str(self.cache_dtype).startswith('fp8') else ''}."
            )
        if self.block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {self.block_size}.")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise ValueError(
                f"kv_cache_memory_bytes must be positive, got {self.kv_cache_memory_bytes}."
            )
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 1:
            raise ValueError(
                f"num_gpu_blocks_override must be at least 1, got {self.num_gpu_blocks_override}."
            )
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}."
            )
        if not self.swap_space >= 0:
            raise ValueError(f"swap_space must be non-negative (GiB), got {self.swap_space}.")


# The smallest prefill cap SchedulerConfig.prefill_tokens_per_decode sets: with a decode
# or two running, a 16-token chunk keeps a long prompt moving.
MIN_PREFILL_CHUNK = 16


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous-batching limits.

    Attributes:
        max_num_seqs: most requests in one step.
        max_num_batched_tokens: token budget of one step.
        max_model_len: longest prompt + output, in tokens (copied from ModelConfig).
        enable_chunked_prefill: split prompts longer than the budget left across steps.
        preemption_mode: "recompute" (free the KV, recompute on resume) or "swap" (copy the
            KV to host swap space and back).
        scheduling_policy: "fcfs" (arrival order) or "priority" (lower priority value
            first, then arrival; higher-priority requests preempt lower-priority ones).
        max_num_encoder_input_tokens: a vision-language model's encoder budget: embedding
            rows its encoder may produce in one step (vLLM's name; 0: no encoder).
        encoder_cache_size: embedding rows the runner's encoder cache holds (0: none).
        prefill_tokens_per_decode: while requests decode, the prompt tokens (prefill
            chunks) a step computes beside them are capped at this many per decoding
            request (at least MIN_PREFILL_CHUNK), so a new request's prefill does not
            stretch their inter-token gap (Sarathi-Serve's stall-free batching) and the
            cap follows the decode step's own cost; 0: only max_num_batched_tokens bounds
            them. Steps without decodes, prompts that must run whole (pooling) and an
            image that must be computed in one step are not capped; needs chunked prefill.
        num_scheduler_steps: decode steps the runner takes per scheduler step when every
            running request only decodes (vLLM's multi-step scheduling): the scheduler,
            its stats and the output processing run once per this many tokens. Tokens
            then stream in groups of this many; 1 schedules every step. None (the
            default): in the offline LLM, core/multi_step.py's AUTO_SCHEDULER_STEPS while
            every running request takes its final output only, else 1 (a streamed token
            comes out as soon as it is made); an online engine (AsyncLLM, the server)
            takes 1 (for_online_serving).
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    enable_chunked_prefill: bool = True
    preemption_mode: str = "recompute"
    scheduling_policy: str = "fcfs"
    max_num_encoder_input_tokens: int = 0
    encoder_cache_size: int = 0
    prefill_tokens_per_decode: int = 0
    num_scheduler_steps: int | None = None

    def __post_init__(self) -> None:
        if self.num_scheduler_steps is not None and self.num_scheduler_steps < 1:
            raise ValueError(
                f"num_scheduler_steps must be at least 1, got {self.num_scheduler_steps}."
            )
        if self.prefill_tokens_per_decode < 0:
            raise ValueError(
                "prefill_tokens_per_decode must be non-negative (0: no cap), got "
                f"{self.prefill_tokens_per_decode}."
            )
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {self.max_num_seqs}.")
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be at least 1, got {self.max_num_batched_tokens}."
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than "
                f"max_model_len ({self.max_model_len}) with chunked prefill disabled: long "
                "prompts could never be scheduled. Raise max_num_batched_tokens or enable "
                "chunked prefill."
            )
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(
                f"preemption_mode must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}."
            )
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"scheduling_policy must be one of {SCHEDULING_POLICIES}, "
                f"got {self.scheduling_policy!r}."
            )


@dataclass(frozen=True)
class DeviceConfig:
    """Where the model runs: "cpu" or "cuda"."""

    device: str = "cpu"


STRUCTURED_OUTPUT_BACKENDS = ("auto", "xgrammar", "guidance")


@dataclass(frozen=True)
class StructuredOutputsConfig:
    """How constrained requests are compiled (vLLM's `structured_outputs_config`).

    Attributes:
        backend: "auto", "xgrammar" or "guidance" (llguidance). "auto" is xgrammar: faster
            per token; guidance compiles a new schema 10-100x faster (structured_output/).
        reasoning_parser: the model's reasoning format (reasoning/): constrained requests
            are constrained only in the answer after the reasoning; None: everywhere.
        enable_in_reasoning: constrain the reasoning too (vLLM's switch; off by default).
    """

    backend: str = "auto"
    reasoning_parser: str | None = None
    enable_in_reasoning: bool = False

    @property
    def resolved_backend(self) -> str:
        """The library in force ("xgrammar" or "guidance")."""
        return "xgrammar" if self.backend == "auto" else self.backend

    def __post_init__(self) -> None:
        if self.backend not in STRUCTURED_OUTPUT_BACKENDS:
            raise ValueError(
                f"structured_outputs_config backend must be one of "
                f"{STRUCTURED_OUTPUT_BACKENDS}, got {self.backend!r}."
            )
        if self.reasoning_parser is not None:
            from pagedllm.reasoning import get_reasoning_parser

            get_reasoning_parser(self.reasoning_parser)  # ValueError naming the known ones


@dataclass(frozen=True)
class KVEventsConfig:
    """KV cache events for prefix-aware routers (vLLM's `kv_events_config`): every step's
    blocks stored / removed / cleared, published over ZMQ (engine/kv_events_publisher.py).

    Attributes:
        enable_kv_cache_events: publish them (needs prefix caching, which makes them).
        publisher: "zmq", or "null" (none); None: zmq when enabled.
        endpoint: the ZMQ PUB address: bound when it holds `*` or is ipc:// / inproc://,
            else connected to.
        replay_endpoint: a ROUTER address answering "batches from sequence N" (None: off).
        buffer_steps: batches kept for replay.
        hwm: the PUB socket's high-water mark.
        max_queue_size: batches waiting for the sending thread (more are dropped).
        topic: the first frame of every message.
        data_parallel_rank: the engine core's rank (added to tcp ports; set per core).
    """

    enable_kv_cache_events: bool = False
    publisher: str | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""
    data_parallel_rank: int = 0

    def __post_init__(self) -> None:
        if self.publisher is None:
            object.__setattr__(self, "publisher", "zmq" if self.enable_kv_cache_events
                               else "null")
        if self.publisher not in ("zmq", "null"):
            raise ValueError(f"kv_events_config publisher must be 'zmq' or 'null', got "
                             f"{self.publisher!r}.")
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"kv_events_config {name} must be at least 1, got "
                                 f"{getattr(self, name)}.")

    @property
    def publishes(self) -> bool:
        """True when events are published."""
        return self.enable_kv_cache_events and self.publisher == "zmq"

    def for_rank(self, rank: int) -> KVEventsConfig:
        """The config of data-parallel core `rank`: its own ports (tcp port + rank)."""
        return replace(self, data_parallel_rank=rank,
                       endpoint=_offset_port(self.endpoint, rank),
                       replay_endpoint=(None if self.replay_endpoint is None
                                        else _offset_port(self.replay_endpoint, rank)))


def _offset_port(endpoint: str, offset: int) -> str:
    """`tcp://host:PORT` with PORT + offset (other transports: `_dp{offset}` appended)."""
    if offset == 0:
        return endpoint
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint.rpartition(":")
        return f"{host}:{int(port) + offset}"
    return f"{endpoint}_dp{offset}"


DISTRIBUTED_EXECUTOR_BACKENDS = ("mp", "ray", "uni")


@dataclass(frozen=True)
class ParallelConfig:
    """How an engine spreads over processes (vLLM's names).

    Attributes:
        tensor_parallel_size: ranks each layer's matrices are split over.
        pipeline_parallel_size: stages the layers are split into.
        data_parallel_size: engine cores behind one frontend.
        distributed_executor_backend: "mp" (worker processes), "ray" (Ray actors) or "uni"
            (this process); None picks "uni" for one rank.
        enable_expert_parallel: spread MoE experts over the ranks instead of splitting each.
    """

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    distributed_executor_backend: str | None = None
    enable_expert_parallel: bool = False

    @property
    def world_size(self) -> int:
        """Worker ranks of one engine core (tensor x pipeline)."""
        return self.tensor_parallel_size * self.pipeline_parallel_size


@dataclass(frozen=True)
class EngineConfig:
    """All sub-configs of one engine."""

    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    device_config: DeviceConfig
    structured_outputs_config: StructuredOutputsConfig = field(
        default_factory=StructuredOutputsConfig
    )
    # Speculative decoding (None: off).
    speculative_config: SpeculativeConfig | None = None
    # Multi-LoRA (None: LoRA off).
    lora_config: LoRAConfig | None = None
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    # KV cache events for routers (None: off).
    kv_events_config: KVEventsConfig | None = None
    # Logits-processor plugin classes (logits_processor/), applied to every step's logits.
    logits_processors: tuple[type, ...] = ()
    # A KV connector moving blocks to a store or a peer (None: off).
    kv_transfer_config: Any = None

    def __post_init__(self) -> None:
        steps = self.scheduler_config.num_scheduler_steps
        conflict = _multi_step_conflict(self)
        if conflict is None or steps == 1:
            return
        if steps is not None:
            raise ValueError(
                f"num_scheduler_steps={steps} does not combine with {conflict}: use 1 with it."
            )
        # The automatic default stands aside (the config is frozen: set through object).
        object.__setattr__(self, "scheduler_config",
                           replace(self.scheduler_config, num_scheduler_steps=1))


def for_online_serving(config: EngineConfig) -> EngineConfig:
    """`config` for an engine taking requests while it runs (AsyncLLM, the server): the
    automatic multi-step default becomes 1 there, as a request arriving during a group
    would wait for the group to end before its first step; an explicit count stays."""
    if config.scheduler_config.num_scheduler_steps is not None:
        return config
    return replace(config, scheduler_config=replace(config.scheduler_config,
                                                    num_scheduler_steps=1))


def _multi_step_conflict(config: EngineConfig) -> str | None:
    """The first system configured that acts between every two steps (multi-step
    scheduling runs its extra steps in one worker, sampling plainly), or None."""
    conflicts = {
        "speculative_config": config.speculative_config is not None,
        "kv_transfer_config": config.kv_transfer_config is not None,
        "tensor_parallel_size/pipeline_parallel_size": config.parallel_config.world_size > 1,
    }
    return next((name for name, present in conflicts.items() if present), None)

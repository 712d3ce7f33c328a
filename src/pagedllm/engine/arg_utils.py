"""EngineArgs: the flat, vLLM-named arguments users pass, resolved into a frozen EngineConfig.

Resolution reads the model's config (no weights): where its files are, its architecture,
its context length and the dtype to run in. Invalid values raise ValueError naming the field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pagedllm.config import (
    CHECKPOINT_QUANTIZATIONS,
    DISTRIBUTED_EXECUTOR_BACKENDS,
    QUANTIZATION_CHOICES,
    SUPPORTED_DTYPES,
    CacheConfig,
    DeviceConfig,
    EngineConfig,
    KVEventsConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    StructuredOutputsConfig,
)
from pagedllm.distributed.kv_transfer.config import KVTransferConfig
from pagedllm.logger import init_logger
from pagedllm.logits_processor import load_logits_processors
from pagedllm.lora.config import LoRAConfig
from pagedllm.platform import current_platform, get_platform
from pagedllm.pooling.config import PoolerConfig
from pagedllm.spec_decode.config import DEFAULT_DISABLE_BY_BATCH_SIZE, SpeculativeConfig
from pagedllm.utils.json_args import parse_json_arg

if TYPE_CHECKING:
    from pagedllm.models.registry import RunnerChoice

logger = init_logger(__name__)

# A CPU step of this many tokens already keeps the matmuls efficient; larger steps only
# lengthen the time new requests wait for their first token.
_DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048


def _encoder_budget(model_config: ModelConfig, token_budget: int) -> dict[str, int]:
    """A vision-language model's encoder budget and cache size, in embedding rows: the
    step's token budget, but at least the largest item (vLLM's compute_mm_encoder_budget);
    with prompt embeddings, at least a whole prompt's rows. Nothing for a text-only model
    without them."""
    from pagedllm.multimodal.layouts import layout_class

    layout = layout_class(model_config.architecture)
    if layout is None:
        if not model_config.enable_prompt_embeds:
            return {}
        rows = max(token_budget, model_config.max_model_len)
        return {"max_num_encoder_input_tokens": rows, "encoder_cache_size": rows}
    largest = layout.max_tokens_per_item(model_config.hf_config)
    if layout.bidirectional and token_budget < largest:
        raise ValueError(
            f"max_num_batched_tokens={token_budget} is below the {largest} tokens of one "
            f"{model_config.architecture} image, which are computed in one step (they "
            "attend to each other both ways); raise it."
        )
    rows = max(token_budget, largest)
    if model_config.enable_prompt_embeds:
        rows = max(rows, model_config.max_model_len)
    return {"max_num_encoder_input_tokens": rows, "encoder_cache_size": rows}


@dataclass
class EngineArgs:
    """Engine arguments with vLLM's names (see `LLM` for their meaning)."""

    model: str | None = None
    dtype: str = "auto"
    quantization: str | None = None
    keep_dense_weights: bool = True
    enforce_eager: bool = False
    seed: int = 0
    max_model_len: int | None = None
    max_logprobs: int = 20
    # vLLM's sleep mode: LLM.sleep / wake_up (and the server's /sleep, /wake_up routes).
    enable_sleep_mode: bool = False
    # Prompts given as embeddings ({"prompt_embeds": tensor}; the server's prompt_embeds).
    enable_prompt_embeds: bool = False
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    # Prompt tokens a step may compute per decoding request (SchedulerConfig's; 0: no cap).
    prefill_tokens_per_decode: int = 0
    # Decode steps a scheduler step runs when every request only decodes (vLLM V0's
    # multi-step scheduling; 1: every step scheduled; None: in the offline LLM 8 while
    # every request takes its final output only, else 1; an online engine takes 1).
    num_scheduler_steps: int | None = None
    enable_chunked_prefill: bool = True
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    gpu_memory_utilization: float = 0.9
    device: str = "auto"
    enable_prefix_caching: bool = True
    swap_space: float = 4
    kv_cache_dtype: str | None = None
    preemption_mode: str | None = None
    scheduling_policy: str = "fcfs"
    structured_outputs_config: dict | str | StructuredOutputsConfig | None = None
    # The model's reasoning format: the server splits replies with it and constrained
    # requests are constrained only after the reasoning (vLLM's --reasoning-parser).
    reasoning_parser: str | None = None
    # KV cache events for prefix-aware routers, published over ZMQ (vLLM's).
    kv_events_config: dict | str | KVEventsConfig | None = None
    # Logits-processor plugins: classes or "module:Class" names (vLLM's).
    logits_processors: list[Any] | None = None
    # A KV connector (vLLM's kv_transfer_config: a dict, its JSON, or the config).
    kv_transfer_config: dict | str | KVTransferConfig | None = None
    # The prefix cache's second tier: GiB of blocks in host memory (or, with a path, on
    # disk), vLLM's --kv-offloading-size (an OffloadingConnector).
    kv_offloading_size: float | None = None
    kv_offloading_path: str | None = None
    runner: str = "auto"
    convert: str = "auto"
    pooler_config: dict | str | PoolerConfig | None = None
    speculative_config: dict | str | SpeculativeConfig | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    distributed_executor_backend: str | None = None
    enable_expert_parallel: bool = False
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    limit_mm_per_prompt: dict | str | None = None
    mm_processor_kwargs: dict | str | None = None

    def create_engine_config(self) -> EngineConfig:
        """Validate the arguments and resolve everything the engine needs to start."""
        device = self._resolve_device()
        model_config = self._create_model_config(device)
        max_len = model_config.max_model_len
        budget = self.max_num_batched_tokens
        if budget is None:
            budget = _DEFAULT_MAX_NUM_BATCHED_TOKENS
            # A pooling request is computed in one step: any input must fit one.
            if not self.enable_chunked_prefill or model_config.runner == "pooling":
                budget = max(budget, max_len)
        return EngineConfig(
            model_config=model_config,
            cache_config=CacheConfig(
                block_size=self.block_size,
                kv_cache_memory_bytes=self.kv_cache_memory_bytes,
                num_gpu_blocks_override=self.num_gpu_blocks_override,
                gpu_memory_utilization=self.gpu_memory_utilization,
                enable_prefix_caching=self.enable_prefix_caching,
                swap_space=self.swap_space,
                cache_dtype=self._resolve_kv_cache_dtype(),
            ),
            scheduler_config=SchedulerConfig(
                max_num_seqs=self.max_num_seqs,
                max_num_batched_tokens=budget,
                max_model_len=max_len,
                enable_chunked_prefill=self.enable_chunked_prefill,
                preemption_mode=self.preemption_mode
                or get_platform(device).default_preemption_mode,
                scheduling_policy=self.scheduling_policy,
                prefill_tokens_per_decode=self.prefill_tokens_per_decode,
                num_scheduler_steps=self.num_scheduler_steps,
                **_encoder_budget(model_config, budget),
            ),
            device_config=DeviceConfig(device),
            structured_outputs_config=self._structured_outputs_config(),
            speculative_config=self._speculative_config(model_config),
            lora_config=self._lora_config(model_config),
            parallel_config=self._parallel_config(model_config),
            kv_events_config=self._kv_events_config(),
            logits_processors=self._logits_processors(model_config),
            kv_transfer_config=self._kv_transfer_config(model_config),
        )

    def _kv_transfer_config(self, model_config: ModelConfig) -> KVTransferConfig | None:
        """The user's kv_transfer_config, checked against what the connectors serve."""
        config = (None if self.kv_transfer_config is None
                  else KVTransferConfig.parse(self.kv_transfer_config))
        if self.kv_offloading_size is not None or self.kv_offloading_path is not None:
            if self.kv_offloading_size is None:
                raise ValueError("kv_offloading_path needs kv_offloading_size (GiB).")
            offloading = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                          "kv_connector_extra_config": {
                              "kv_offloading_size": self.kv_offloading_size,
                              "kv_offloading_path": self.kv_offloading_path}}
            if config is None:
                config = KVTransferConfig.parse(offloading)
            else:  # the given connector first, then the tier (vLLM composes them so too)
                config = KVTransferConfig("MultiConnector", config.kv_role,
                                          kv_connector_extra_config={"connectors": [
                                              dataclasses.asdict(config), offloading]})
        if config is None:
            return None
        if model_config.runner != "generate":
            raise ValueError("kv_transfer_config applies to generating models only.")
        if self.tensor_parallel_size * self.pipeline_parallel_size > 1:
            self._check_kv_transfer_ranks(config)
        if (self.data_parallel_size > 1 and config.is_producer
                and config.kv_connector in ("TcpConnector", "NixlConnector")):
            raise ValueError("kv_transfer_config: a TcpConnector producer with "
                             "data_parallel_size > 1 is not supported (every engine core "
                             "would serve blocks at the same kv_port); run one producer "
                             "instance per core behind the proxy.")
        return config

    def _check_kv_transfer_ranks(self, config: KVTransferConfig) -> None:
        """Several ranks: only a network consumer splitting heads over tensor-parallel
        ranks (TcpConnector, kv_consumer) is built."""
        if (config.kv_connector in ("TcpConnector", "NixlConnector")
                and config.kv_role == "kv_consumer" and self.pipeline_parallel_size == 1):
            return
        raise ValueError("kv_transfer_config with several ranks is supported for a "
                         "TcpConnector (NixlConnector) kv_consumer with tensor parallelism "
                         f"only, not {config.kv_connector} as {config.kv_role} with "
                         f"tensor_parallel_size={self.tensor_parallel_size}, "
                         f"pipeline_parallel_size={self.pipeline_parallel_size}.")

    def _logits_processors(self, model_config: ModelConfig) -> tuple[type, ...]:
        """The plugin classes (installed ones, then the given ones), checked."""
        classes = load_logits_processors(self.logits_processors)
        if classes and model_config.runner != "generate":
            raise ValueError("logits_processors apply to generating models only.")
        if classes and self.speculative_config is not None:
            raise ValueError("logits_processors with speculative_config are not supported: "
                             "a plugin sees one logits row per request.")
        return classes

    def _kv_events_config(self) -> KVEventsConfig | None:
        """The user's kv_events_config (a dict, JSON text or the config), checked."""
        config = self.kv_events_config
        if config is None or isinstance(config, KVEventsConfig):
            return config
        config = parse_json_arg(config, "kv_events_config")
        known = {f.name for f in dataclasses.fields(KVEventsConfig)} - {"data_parallel_rank"}
        if not isinstance(config, dict) or set(config) - known:
            unknown = sorted(set(config) - known) if isinstance(config, dict) else config
            raise ValueError(f"kv_events_config has unknown keys {unknown}; known: "
                             f"{sorted(known)}.")
        return KVEventsConfig(**config)

    def _parallel_config(self, model_config: ModelConfig) -> ParallelConfig:
        """The parallel layout, checked (vLLM's names).

        Raises:
            ValueError: a size below 1, an unknown backend, "uni" with several ranks, a model
                that does not split so (heads, layers), or a feature not built for several
                ranks (speculative decoding, LoRA).
        """
        sizes = {
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "data_parallel_size": self.data_parallel_size,
        }
        for name, size in sizes.items():
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise ValueError(f"{name} must be a positive integer, got {size!r}.")
        backend = self.distributed_executor_backend
        if backend is not None and backend not in DISTRIBUTED_EXECUTOR_BACKENDS:
            raise ValueError(
                f"distributed_executor_backend must be one of {DISTRIBUTED_EXECUTOR_BACKENDS} "
                f"or None, got {backend!r}."
            )
        config = ParallelConfig(
            self.tensor_parallel_size, self.pipeline_parallel_size, self.data_parallel_size,
            backend, self.enable_expert_parallel,
        )
        if backend == "uni" and config.world_size > 1:
            raise ValueError(
                f"distributed_executor_backend='uni' runs one rank; tensor x pipeline "
                f"parallel sizes ask for {config.world_size}."
            )
        if config.world_size > 1:
            self._check_splits(model_config, config)
        return config

    def _check_splits(self, model_config: ModelConfig, config: ParallelConfig) -> None:
        """Raise ValueError, naming the field, when the model cannot be split as asked or a
        feature is asked that several ranks do not run."""
        several = (f"tensor_parallel_size={config.tensor_parallel_size}, "
                   f"pipeline_parallel_size={config.pipeline_parallel_size}")
        if self.speculative_config is not None:
            raise ValueError(f"speculative_config with {several}: speculative decoding runs "
                             "on one rank only (not built for several).")
        if self.enable_lora:
            raise ValueError(f"enable_lora with {several}: LoRA runs on one rank only (not "
                             "built for split layers).")
        hf = model_config.text_config
        tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
        heads = getattr(hf, "num_attention_heads", None)
        kv_heads = getattr(hf, "num_key_value_heads", None) or heads
        if heads is not None and heads % tp:
            raise ValueError(f"tensor_parallel_size={tp} does not divide the model's "
                             f"{heads} attention heads.")
        if kv_heads is not None and kv_heads % tp and tp % kv_heads:
            raise ValueError(f"tensor_parallel_size={tp} and the model's {kv_heads} KV heads: "
                             "one must divide the other.")
        layers = getattr(hf, "num_hidden_layers", None)
        if pp > 1 and (model_config.runner == "pooling" or layers is None):
            raise ValueError(f"pipeline_parallel_size={pp}: pipeline stages are built for "
                             "decoder models that generate.")
        if layers is not None and pp > layers:
            raise ValueError(f"pipeline_parallel_size={pp} exceeds the model's {layers} layers.")

    def _lora_config(self, model_config: ModelConfig) -> LoRAConfig | None:
        """The multi-LoRA limits when enable_lora is on."""
        if not self.enable_lora:
            return None
        if model_config.runner == "pooling":
            raise ValueError("enable_lora applies to generating models only.")
        return LoRAConfig(self.max_loras, self.max_lora_rank, self.max_cpu_loras)

    def _speculative_config(self, model_config: ModelConfig) -> SpeculativeConfig | None:
        """The user's speculative_config, validated, its draft model located."""
        if self.speculative_config is None:
            return None
        config = SpeculativeConfig.parse(self.speculative_config)
        if model_config.runner == "pooling":
            raise ValueError("speculative_config applies to generating models only.")
        if config.disable_by_batch_size is None and config.method == "ngram":
            config = config.with_batch_limit(self._ngram_batch_limit(model_config))
        if config.model is None:
            return config
        if config.method == "draft_model":
            return config.with_draft_model(self._draft_model_config(config, model_config))
        import os

        if not os.path.isdir(config.model):
            raise ValueError(
                f"speculative_config model {config.model!r} must be the folder of a "
                f"{config.method} checkpoint."
            )
        return config

    def _ngram_batch_limit(self, model_config: ModelConfig) -> int:
        """The most running requests that still get n-gram drafts: the platform's limit
        (wider where bfloat16 matmuls are native), else the config's default."""
        limit = get_platform(self._resolve_device()).ngram_batch_limit(model_config.dtype)
        return DEFAULT_DISABLE_BY_BATCH_SIZE if limit is None else limit

    def _draft_model_config(
        self, config: SpeculativeConfig, model_config: ModelConfig
    ) -> ModelConfig:
        """The draft model's ModelConfig: the target's dtype, length and weight format
        (a 4-bit GGUF target's int4 runs its draft in int4 too); its vocabulary must be the
        target's (they share the tokenizer)."""
        draft_args = EngineArgs(
            model=config.model, dtype=model_config.dtype, seed=self.seed,
            max_model_len=model_config.max_model_len,
            quantization=self.quantization or model_config.quantization,
            keep_dense_weights=self.keep_dense_weights,
        )
        draft = draft_args._create_model_config(self._resolve_device())
        if draft.runner != "generate":
            raise ValueError(f"speculative_config model {config.model!r} is not a generator.")
        target_vocab = model_config.hf_config.vocab_size
        if draft.hf_config.vocab_size != target_vocab:
            raise ValueError(
                f"speculative_config model {config.model!r} has a vocabulary of "
                f"{draft.hf_config.vocab_size} tokens, the target {target_vocab}: a draft "
                "model must share the target's tokenizer."
            )
        return draft

    def _pooler_config_overrides(self) -> PoolerConfig:
        """The user's pooler_config (a PoolerConfig, a dict or the CLI's JSON text)."""
        config = self.pooler_config
        if config is None:
            return PoolerConfig()
        if isinstance(config, PoolerConfig):
            return config
        config = parse_json_arg(config, "pooler_config")
        fields = {"pooling_type", "normalize", "softmax", "dimensions", "step_tag_id"}
        if not isinstance(config, dict) or set(config) - fields:
            raise ValueError(
                f"pooler_config must be a dict with keys among {sorted(fields)}, got {config!r}."
            )
        return PoolerConfig(**config)

    def _resolve_pooling(
        self, choice: RunnerChoice, model_dir: str, gguf_file: str | None
    ) -> tuple[PoolerConfig | None, int | None]:
        """The pooler config (overrides > sentence-transformers folder > the architecture's
        defaults) and the folder's max_seq_length; (None, None) for generation only."""
        from pagedllm.pooling.config import read_sentence_transformers

        overrides = self._pooler_config_overrides()
        if choice.supported_tasks == ("generate",):
            if self.pooler_config is not None:
                raise ValueError("pooler_config applies to pooling models only.")
            return None, None
        config = PoolerConfig(pooling_type=choice.default_pooling_type, normalize=True)
        setup = read_sentence_transformers(model_dir) if gguf_file is None else None
        if setup is not None:
            config = setup.pooler_config.merged_over(config)
        return overrides.merged_over(config), setup.max_seq_length if setup else None

    def _structured_outputs_config(self) -> StructuredOutputsConfig:
        config = self._structured_outputs_fields()
        if self.reasoning_parser is not None:  # --reasoning-parser wins over the dict's
            config = dataclasses.replace(config, reasoning_parser=self.reasoning_parser)
        return config

    def _structured_outputs_fields(self) -> StructuredOutputsConfig:
        config = self.structured_outputs_config
        if config is None:
            return StructuredOutputsConfig()
        if isinstance(config, StructuredOutputsConfig):
            return config
        config = parse_json_arg(config, "structured_outputs_config")
        keys = {"backend", "reasoning_parser", "enable_in_reasoning"}
        if not isinstance(config, dict) or set(config) - keys:
            raise ValueError(
                f"structured_outputs_config must be a dict with the keys {sorted(keys)}, got "
                f"{config!r}."
            )
        return StructuredOutputsConfig(**config)

    def _resolve_device(self) -> str:
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {self.device!r}.")
        if self.device != "auto":
            return self.device
        return current_platform().device_type

    def _resolve_quantization(
        self, model_dir: str, gguf_file: str | None, device: str
    ) -> str | None:
        """The weight-only method to use: the user's, else the checkpoint's (as vLLM does).

        A 4-bit GGUF runs its decoder matrices as int4 (an 8-bit one as int8) on CPU, where
        small decode steps are bound by weight reads; dense weights are kept as well for
        large steps unless keep_dense_weights is False. On CUDA they run on the Triton
        group kernel (W4A16 / W8A16, the file's codes as they are).
        """
        if self.quantization == "none":
            return None
        if self.quantization is not None:
            return self.quantization
        if gguf_file is None:
            return None
        import os

        from pagedllm.model_loader.gguf import gguf_weight_quantization

        if not get_platform(device).runs_gguf_codes():
            logger.warning(
                "%s has no kernel for quantized weights without triton: the GGUF's weights "
                "are dequantized to the model's dtype.", device,
            )
            return None

        return gguf_weight_quantization(os.path.join(model_dir, gguf_file))

    def _checkpoint_quantization(self, hf_config: Any) -> dict[str, Any] | None:
        """The checkpoint's GPTQ / AWQ `quantization_config`, checked against `quantization`.

        Raises:
            ValueError: an unsupported scheme (naming it), or a `quantization` that names
                another format.
        """
        raw = getattr(hf_config, "quantization_config", None)
        if raw is None:
            if self.quantization in CHECKPOINT_QUANTIZATIONS:
                raise ValueError(
                    f"quantization={self.quantization!r} but the checkpoint has no "
                    "quantization_config in its config.json."
                )
            return None
        config = raw if isinstance(raw, dict) else raw.to_dict()
        from pagedllm.model_loader.checkpoint_quantization import parse

        parse(config)  # ValueError naming an unknown method or an unsupported field
        method = str(config.get("quant_method", "")).lower()
        if self.quantization not in (None, "none", method):
            raise ValueError(
                f"quantization={self.quantization!r} but the checkpoint is quantized with "
                f"{method} (pass quantization={method!r}, or None)."
            )
        return config

    def _resolve_kv_cache_dtype(self) -> str:
        """The user's KV cache format, else the model's dtype ("auto"), as vLLM's default.

        The rule: an int8 cache becomes a default only where it is measured to keep the
        model's agreement and to be faster. On the default model (bf16 + int4 weights,
        2026-11-26, BENCHMARKS.md "The KV cache's default") it is neither: the bf16 cache
        agrees with float32 on 97.3% / 98.2% of next tokens (chat / natural text) against
        the int8 cache's 97.3% / 97.5%, and since the one-call decode stack reads both,
        decode is as fast (192 positions) or faster (1,900 positions: 9.7 against 12.3 ms a
        token); int8 halves the cache's memory, so it stays one `kv_cache_dtype="int8"`
        away.
        """
        return self.kv_cache_dtype if self.kv_cache_dtype is not None else "auto"

    def _resolve_dtype_and_quantization(
        self, hf_config: Any, model_dir: str, gguf_file: str | None,
        checkpoint_quantization: dict[str, Any] | None, runner: str, device: str,
    ) -> tuple[str, str | None]:
        """The dtype the model runs in and its weights' quantization, as the platform runs
        them: a checkpoint's own method or the GGUF's; dtype "auto" from the checkpoint,
        bfloat16 only where it is fast here."""
        from pagedllm.model_loader.hf_config import resolve_dtype

        if checkpoint_quantization is not None:
            from pagedllm.model_loader.checkpoint_quantization import kernel_method

            method = kernel_method(checkpoint_quantization)
            quantization = None if self.quantization == "none" else method
        else:
            quantization = self._resolve_quantization(model_dir, gguf_file, device)
        platform = get_platform(device)
        bf16_is_fast = True
        if self.dtype == "auto" and not platform.half_precision_native:
            bf16_is_fast = platform.bf16_is_fast(quantization)
        # A quantized checkpoint's "auto" dtype is bfloat16, as a GGUF's: its 4-bit kernels
        # take bfloat16 (its config's float16 or float32 describes the unquantized tensors).
        quantized_checkpoint = gguf_file is not None or checkpoint_quantization is not None
        dtype = resolve_dtype(self.dtype, hf_config, device, quantized_checkpoint, bf16_is_fast)
        if checkpoint_quantization is not None and not platform.runs_checkpoint_codes(dtype):
            # The byte kernels take bfloat16 on CPU; elsewhere the layers are dequantized.
            quantization = None
        if runner == "pooling" and self.dtype == "auto" and bf16_is_fast:
            # A pooled vector's agreement in bfloat16 is measured (cosine >= 0.999), and
            # encoders are bound by matmuls: where bfloat16 is native it is the default.
            dtype = "bfloat16" if dtype == "float32" else dtype
        return dtype, quantization

    def _create_model_config(self, device: str) -> ModelConfig:
        from pagedllm.model_loader.hf_config import (
            get_architecture,
            get_max_model_len,
            load_hf_config,
        )
        from pagedllm.model_loader.source import resolve_model_source
        from pagedllm.models.registry import check_model_config, resolve_runner

        if self.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"dtype must be one of {SUPPORTED_DTYPES}, got {self.dtype!r}.")
        if self.quantization not in (None, *QUANTIZATION_CHOICES):
            raise ValueError(
                f"quantization must be one of {QUANTIZATION_CHOICES} or None, "
                f"got {self.quantization!r}."
            )
        model_dir, gguf_file = resolve_model_source(self.model)
        hf_config = load_hf_config(model_dir, gguf_file)
        architecture = get_architecture(hf_config)
        choice = resolve_runner(architecture, self.runner, self.convert)
        pooler_config, max_seq_length = self._resolve_pooling(choice, model_dir, gguf_file)
        max_model_len = get_max_model_len(hf_config.get_text_config(), self.max_model_len)
        if self.max_model_len is None and max_seq_length:
            # sentence-transformers truncates there: longer inputs were never trained on.
            max_model_len = min(max_model_len, max_seq_length)
        check_model_config(architecture, hf_config, choice.runner, choice.convert)
        checkpoint_quantization = self._checkpoint_quantization(hf_config)
        dtype, quantization = self._resolve_dtype_and_quantization(
            hf_config, model_dir, gguf_file, checkpoint_quantization, choice.runner, device
        )
        return ModelConfig(
            model=self.model or model_dir,
            model_dir=model_dir,
            gguf_file=gguf_file,
            dtype=dtype,
            max_model_len=max_model_len,
            seed=self.seed,
            architecture=architecture,
            hf_config=hf_config,
            quantization=quantization,
            keep_dense_weights=self.keep_dense_weights,
            checkpoint_quantization=checkpoint_quantization,
            runner=choice.runner,
            convert=choice.convert,
            supported_tasks=choice.supported_tasks,
            pooler_config=pooler_config,
            enforce_eager=self.enforce_eager,
            max_logprobs=self.max_logprobs,
            enable_sleep_mode=self.enable_sleep_mode,
            enable_prompt_embeds=self.enable_prompt_embeds,
            **self._multimodal_options(architecture),
        )

    def _multimodal_options(self, architecture: str) -> dict[str, Any]:
        """limit_mm_per_prompt and mm_processor_kwargs, parsed (JSON on the command line).

        Raises:
            ValueError: for a malformed value, or either given for a text-only model.
        """
        from pagedllm.multimodal.processor import supports_multimodal

        limits = parse_json_arg(self.limit_mm_per_prompt, "limit_mm_per_prompt")
        kwargs = parse_json_arg(self.mm_processor_kwargs, "mm_processor_kwargs")
        if (limits or kwargs) and not supports_multimodal(architecture):
            raise ValueError(f"limit_mm_per_prompt / mm_processor_kwargs: {architecture} "
                             "takes no images or video.")
        if limits is not None and (not isinstance(limits, dict) or any(
            not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in limits.values()
        )):
            raise ValueError("limit_mm_per_prompt must map modalities to counts >= 0, such as "
                             '{"image": 2, "video": 0}.')
        if kwargs is not None and not isinstance(kwargs, dict):
            raise ValueError("mm_processor_kwargs must be a JSON object.")
        return {"limit_mm_per_prompt": limits, "mm_processor_kwargs": kwargs}

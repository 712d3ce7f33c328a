"""LLMEngine: the synchronous engine for offline use (`add_request` / `step`).

It ties the frontend pieces (tokenizer, InputProcessor, OutputProcessor) to an engine core
through an EngineCoreClient. Text stays here; the core only sees token ids.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import cloudpickle
import msgspec

from pagedllm.config import EngineConfig
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.engine.core_client import EngineCoreClient, InprocClient, SyncMPClient
from pagedllm.engine.input_processor import InputProcessor, PromptType, make_mm_processor
from pagedllm.engine.output_processor import OutputProcessor
from pagedllm.engine.protocol import EngineCoreRequest
from pagedllm.lora.request import LoRARequest
from pagedllm.metrics.reader import Metric, metrics_from_stats
from pagedllm.metrics.stats import SchedulerStats
from pagedllm.outputs import PoolingRequestOutput, RequestOutput
from pagedllm.pooling_params import PoolingParams
from pagedllm.sampling_params import SamplingParams
from pagedllm.tokenizer.tokenizer import get_end_of_turn_ids, get_eos_token_id, get_tokenizer
from pagedllm.utils.rpc import encode_rpc


class LLMEngine:
    """Add requests, call `step()` until `has_unfinished_requests()` is False.

    Example:
        engine = LLMEngine.from_engine_args(EngineArgs(model=path))
        engine.add_request("0", "Hello", SamplingParams(max_tokens=8))
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    print(output.outputs[0].text)
    """

    def __init__(
        self, engine_config: EngineConfig, engine_core: EngineCoreClient | None = None
    ) -> None:
        """Build the frontend; `engine_core` defaults to an in-process core (AsyncLLM passes
        a threaded one and awaits its outputs instead of calling `step()`).

        Raises:
            ValueError: data_parallel_size > 1 for a synchronous engine (its cores run
                behind AsyncLLM, e.g. `pagedllm serve -dp N`).
        """
        data_parallel_size = engine_config.parallel_config.data_parallel_size
        synchronous = engine_core is None or isinstance(engine_core, (InprocClient, SyncMPClient))
        if data_parallel_size > 1 and synchronous:
            raise ValueError(
                f"data_parallel_size={data_parallel_size}: data-parallel engine cores run "
                "behind AsyncLLM (`pagedllm serve -dp N`); offline, start one LLM per "
                "data-parallel rank."
            )
        model_config = engine_config.model_config
        self.engine_config = engine_config
        self.tokenizer = get_tokenizer(model_config.model_dir, model_config.gguf_file)
        eos_token_id = get_eos_token_id(self.tokenizer, model_config.text_config)
        vocab_size = model_config.text_config.vocab_size
        self.input_processor = InputProcessor(
            self.tokenizer, model_config.max_model_len, vocab_size, eos_token_id,
            engine_config.structured_outputs_config.resolved_backend,
            get_end_of_turn_ids(self.tokenizer, model_config.hf_config, eos_token_id),
            mm_processor=make_mm_processor(model_config),
            max_logprobs=model_config.max_logprobs,
            logits_processors=engine_config.logits_processors,
            prompt_embeds_hidden_size=(model_config.text_config.hidden_size
                                       if model_config.enable_prompt_embeds else None),
        )
        self.supported_tasks = model_config.supported_tasks
        self.input_processor.supported_tasks = self.supported_tasks
        self.input_processor.embedding_size = getattr(model_config.text_config, "hidden_size", None)
        self.output_processor = OutputProcessor(self.tokenizer)
        self.engine_core: EngineCoreClient = engine_core or InprocClient(engine_config)
        self._latest_stats: SchedulerStats | None = None
        self._loras: dict[int, LoRARequest] = {}  # adapters loaded through this frontend

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs, multiprocessing: bool = False) -> LLMEngine:
        """Resolve the arguments and build the engine (its core in a child process when
        `multiprocessing`; call `shutdown()` then)."""
        config = engine_args.create_engine_config()
        return cls(config, SyncMPClient(config) if multiprocessing else None)

    def shutdown(self) -> None:
        """Stop the engine core (its process, if it has one)."""
        self.engine_core.shutdown()

    def get_tokenizer(self) -> Any:
        """The model's tokenizer."""
        return self.tokenizer

    def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams | PoolingParams,
        arrival_time: float | None = None,
        add_special_tokens: bool = True,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> None:
        """Tokenize, validate and queue a request (raises ValueError on bad input).

        SamplingParams generate; PoolingParams (with its task set) pool, on a model that
        serves that task. `priority` matters under the "priority" scheduling policy: lower
        runs first (pooling requests have their own first-come queue).
        """
        if self.output_processor.is_live(request_id):
            raise ValueError(f"Request id {request_id!r} is already running.")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"priority must be an int, got {priority!r}.")
        if isinstance(params, PoolingParams):
            if lora_request is not None:
                raise ValueError("lora_request: LoRA adapters apply to generation only.")
            pooling_request, pooling_prompt = self.input_processor.process_pooling(
                request_id, prompt, params, arrival_time, add_special_tokens
            )
            self.output_processor.add_pooling_request(request_id, pooling_prompt.prompt_token_ids)
            self.engine_core.add_request(pooling_request)
            return
        if "generate" not in self.supported_tasks:
            raise ValueError(
                "This model does not support the 'generate' task; it serves: "
                f"{', '.join(self.supported_tasks)}."
            )
        request, processed = self.input_processor.process(
            request_id, prompt, params, arrival_time, add_special_tokens
        )
        request.priority = priority
        request.data.lora_request = self._check_lora(lora_request)
        core_params = request.data.sampling_params
        # best_of (>= n) sequences are sampled; the output processor returns the best n.
        num_seqs = core_params.num_sequences
        core_ids = [request_id] if num_seqs == 1 else [f"{i}_{request_id}" for i in range(num_seqs)]
        self.output_processor.add_request(
            request_id, processed.prompt, processed.prompt_token_ids, core_params, core_ids,
            request.arrival_time,
        )
        for index, core_id in enumerate(core_ids):
            self.engine_core.add_request(self._child_request(request, core_id, index, num_seqs))

    def _check_lora(self, lora_request: LoRARequest | None) -> LoRARequest | None:
        """The request's adapter, loaded in the core (and so checked) before it is queued."""
        if lora_request is None:
            return None
        if not isinstance(lora_request, LoRARequest):
            raise ValueError(
                f"lora_request must be a LoRARequest, got {type(lora_request).__name__}."
            )
        if self._loras.get(lora_request.lora_int_id) != lora_request:
            self.add_lora(lora_request)
        return lora_request

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load a LoRA adapter in the engine core now (vLLM's `add_lora`).

        Raises:
            ValueError: LoRA is off; the folder is missing; the adapter is unsupported, over
                max_lora_rank or made for another model; its id names another adapter.
        """
        self.start_add_lora(lora_request).result()
        return True

    def start_add_lora(self, lora_request: LoRARequest) -> Future[Any]:
        """`add_lora` without waiting: the cheap checks now (ValueError), the core's load
        as a future (AsyncLLM awaits it)."""
        lora_config = self.engine_config.lora_config
        if lora_config is None:
            raise ValueError(
                f"LoRA adapter {lora_request.lora_name!r} given but LoRA is off: start the "
                "engine with enable_lora=True."
            )
        known = self._loras.get(lora_request.lora_int_id)
        if known is not None and known.lora_path != lora_request.lora_path:
            raise ValueError(
                f"lora_int_id {lora_request.lora_int_id} is adapter {known.lora_name!r} "
                f"({known.lora_path}); give {lora_request.lora_name!r} its own lora_int_id."
            )
        from pagedllm.lora.peft_adapter import check_adapter_config, read_adapter_config

        # Cheap checks here; the core then reads the weights and fits them to the model.
        config = read_adapter_config(lora_request.lora_path)
        check_adapter_config(config, lora_request.lora_path, lora_config.max_lora_rank)
        future = self.engine_core.call_utility(
            "add_lora", lora_request.lora_name, lora_request.lora_int_id, lora_request.lora_path
        )

        def remember(done: Future[Any]) -> None:
            if done.exception() is None:
                self._loras[lora_request.lora_int_id] = lora_request

        future.add_done_callback(remember)
        return future

    def remove_lora(self, lora_int_id: int) -> bool:
        """Drop a LoRA adapter once the requests running it finish (False: not loaded)."""
        return bool(self.start_remove_lora(lora_int_id).result())

    def start_remove_lora(self, lora_int_id: int) -> Future[Any]:
        """`remove_lora` without waiting (the core's answer as a future)."""
        self._loras.pop(lora_int_id, None)
        return self.engine_core.call_utility("remove_lora", lora_int_id)

    def list_loras(self) -> set[int]:
        """Ids of the LoRA adapters loaded in the core."""
        return set(self.engine_core.call_utility("list_loras").result())

    def sleep(self, level: int = 1) -> None:
        """Give the KV cache (level 1) and the weights (level 2) back while idle (vLLM's
        sleep mode; needs enable_sleep_mode). ValueError while requests run."""
        self.engine_core.call_utility("sleep", level).result()

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Take back what `sleep` gave ("weights", "kv_cache"; None: both)."""
        self.engine_core.call_utility("wake_up", tags).result()

    def is_sleeping(self) -> bool:
        """True while the engine sleeps."""
        return bool(self.engine_core.call_utility("is_sleeping").result())

    def collective_rpc(
        self, method: str | Callable[..., Any], timeout: float | None = None,
        args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Run a Worker method (by name) or a function `method(worker, *args, **kwargs)` on
        every worker, between steps (vLLM's `collective_rpc`); one result per worker, in
        rank order. TimeoutError after `timeout` seconds (None: wait)."""
        payload = encode_rpc(method, args, kwargs)
        future = self.engine_core.call_utility("collective_rpc", payload)
        return list(cloudpickle.loads(future.result(timeout=timeout)))

    @staticmethod
    def _child_request(
        request: EngineCoreRequest, core_id: str, index: int, num_seqs: int
    ) -> EngineCoreRequest:
        if num_seqs == 1:
            return request
        params = request.data.sampling_params.clone()
        # Ranking best_of > n sequences needs each one's sampled-token logprobs (k = 0).
        if num_seqs > params.n and params.logprobs is None:
            params.logprobs = 0
        params.n, params.best_of = 1, None
        # One child is enough to score the shared prompt; the others may read the cache.
        if index > 0:
            params.prompt_logprobs = None
        # Distinct but reproducible samples for each of the sequences.
        if params.seed is not None:
            params.seed += index
        data = msgspec.structs.replace(request.data, sampling_params=params)
        return msgspec.structs.replace(request, request_id=core_id, data=data)

    def abort_request(self, request_ids: str | list[str]) -> None:
        """Abort user requests wherever they are; their KV blocks are freed at once."""
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        self.engine_core.abort_requests(self.output_processor.abort_requests(request_ids))

    def step(self) -> list[RequestOutput | PoolingRequestOutput]:
        """Run one engine step and return the outputs it produced."""
        core_outputs = self.engine_core.get_output()
        self._latest_stats = core_outputs.scheduler_stats or self._latest_stats
        outputs, to_abort = self.output_processor.process_outputs(core_outputs.outputs)
        self.engine_core.abort_requests(to_abort)
        return outputs

    def get_metrics(self) -> list[Metric]:
        """The engine's counters and gauges after its latest step (metrics/reader.py)."""
        return metrics_from_stats(self._latest_stats)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached KV block, so no later prompt reuses an earlier one's KV.

        Returns False (and changes nothing) while running requests hold blocks.
        """
        return bool(self.engine_core.reset_prefix_cache())  # type: ignore[attr-defined]

    def has_unfinished_requests(self) -> bool:
        """True while any request is waiting or running."""
        return self.output_processor.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        """Requests waiting or running."""
        return self.output_processor.get_num_unfinished_requests()

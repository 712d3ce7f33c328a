"""The pooling half of the offline `LLM`: embed, classify, score, encode and reward.

Each call queues one pooling request per input and runs the engine until all are done;
results come back in input order with vLLM's output types. A method whose task the model
does not serve raises ValueError naming the tasks it does.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tqdm.auto import tqdm

from pagedllm.engine.input_processor import PromptType
from pagedllm.entrypoints.score_utils import cosine_score, cross_encoder_prompt, pair_up
from pagedllm.outputs import (
    ClassificationRequestOutput,
    EmbeddingRequestOutput,
    PoolingOutput,
    PoolingRequestOutput,
    ScoringRequestOutput,
)
from pagedllm.pooling_params import PoolingParams

if TYPE_CHECKING:
    from pagedllm.engine.llm_engine import LLMEngine


class PoolingMethods:
    """vLLM's pooling methods of `LLM` (it provides `llm_engine` and `_request_counter`)."""

    llm_engine: LLMEngine
    _request_counter: itertools.count

    def embed(
        self,
        prompts: PromptType | Sequence[PromptType],
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = True,
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
    ) -> list[EmbeddingRequestOutput]:
        """One embedding per prompt (`dimensions`, `normalize` in the pooling params)."""
        outputs = self._pool(prompts, "embed", pooling_params, truncate_prompt_tokens, use_tqdm)
        return [EmbeddingRequestOutput.from_base(o) for o in outputs]

    def classify(
        self,
        prompts: PromptType | Sequence[PromptType],
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = True,
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
    ) -> list[ClassificationRequestOutput]:
        """Class probabilities per prompt (softmax; sigmoid for one label)."""
        outputs = self._pool(
            prompts, "classify", pooling_params, truncate_prompt_tokens, use_tqdm
        )
        return [ClassificationRequestOutput.from_base(o) for o in outputs]

    def reward(
        self,
        prompts: PromptType | Sequence[PromptType],
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = True,
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
    ) -> list[PoolingRequestOutput]:
        """A reward model's raw score(s) of each prompt (its last token's head output)."""
        return self._pool(prompts, "reward", pooling_params, truncate_prompt_tokens, use_tqdm)

    def encode(
        self,
        prompts: PromptType | Sequence[PromptType],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = True,
        pooling_task: str = "encode",
    ) -> list[PoolingRequestOutput]:
        """The raw pooled output of each prompt for `pooling_task` (default "encode": the
        model's pooling, not normalized)."""
        return self._pool(prompts, pooling_task, pooling_params, truncate_prompt_tokens, use_tqdm)

    def score(
        self,
        data_1: str | list[str],
        data_2: str | list[str],
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = True,
        pooling_params: PoolingParams | None = None,
    ) -> list[ScoringRequestOutput]:
        """Relevance of each (data_1, data_2) pair: one text against many, or pairwise.

        A cross-encoder reads each pair as one input; an embedding model gives the cosine
        of the two embeddings.
        """
        pairs = pair_up(data_1, data_2)
        tasks = self.llm_engine.supported_tasks
        if "score" in tasks:
            tokenizer = self.llm_engine.get_tokenizer()
            max_len = self.llm_engine.input_processor.max_model_len
            prompts: list[PromptType] = [
                cross_encoder_prompt(tokenizer, a, b, truncate_prompt_tokens, max_len)
                for a, b in pairs
            ]
            outputs = self._pool(prompts, "score", pooling_params, None, use_tqdm)
            return [ScoringRequestOutput.from_base(o) for o in outputs]
        if "embed" not in tasks:
            raise ValueError(
                "This model does not support the 'score' task; it serves: "
                f"{', '.join(tasks)}."
            )
        texts = list(dict.fromkeys(text for pair in pairs for text in pair))
        embedded = self._pool(texts, "embed", pooling_params, truncate_prompt_tokens, use_tqdm)
        by_text = dict(zip(texts, embedded, strict=True))
        results = []
        for index, (a, b) in enumerate(pairs):
            first, second = by_text[a], by_text[b]
            pooled = PoolingRequestOutput(
                str(index),
                PoolingOutput(cosine_score(first.outputs.data, second.outputs.data)),
                first.prompt_token_ids + second.prompt_token_ids,
            )
            results.append(ScoringRequestOutput.from_base(pooled))
        return results

    def _pool(
        self,
        prompts: PromptType | Sequence[PromptType],
        task: str,
        pooling_params: PoolingParams | Sequence[PoolingParams] | None,
        truncate_prompt_tokens: int | None,
        use_tqdm: bool,
    ) -> list[PoolingRequestOutput]:
        prompt_list = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        if not prompt_list:
            raise ValueError("prompts cannot be empty.")
        params_list = _params_for(pooling_params, len(prompt_list), task, truncate_prompt_tokens)
        engine = self.llm_engine
        request_ids: list[str] = []
        try:
            for prompt, params in zip(prompt_list, params_list, strict=True):
                request_id = str(next(self._request_counter))
                engine.add_request(request_id, prompt, params)
                request_ids.append(request_id)
        except Exception:
            engine.abort_request(request_ids)  # a bad input must not leave others queued
            raise
        finished: dict[str, PoolingRequestOutput] = {}
        with tqdm(total=len(request_ids), desc="Processed prompts", disable=not use_tqdm) as bar:
            while engine.has_unfinished_requests():
                for output in engine.step():
                    if isinstance(output, PoolingRequestOutput):
                        finished[output.request_id] = output
                        bar.update(1)
        return [finished[request_id] for request_id in request_ids]


def _params_for(
    pooling_params: PoolingParams | Sequence[PoolingParams] | None,
    num_prompts: int,
    task: str,
    truncate_prompt_tokens: int | None,
) -> list[PoolingParams]:
    """One PoolingParams per prompt, set for `task` (and the call's truncation)."""
    if pooling_params is None or isinstance(pooling_params, PoolingParams):
        given = [pooling_params or PoolingParams()] * num_prompts
    else:
        given = list(pooling_params)
        if len(given) != num_prompts:
            raise ValueError(
                f"The lengths of prompts ({num_prompts}) and pooling_params ({len(given)}) "
                "must be the same."
            )
    results = []
    for params in given:
        if not isinstance(params, PoolingParams):
            raise ValueError(
                f"pooling_params must be a PoolingParams, got {type(params).__name__}."
            )
        if params.task is not None and params.task != task:
            raise ValueError(f"pooling_params.task is {params.task!r} but this call is {task!r}.")
        truncate = params.truncate_prompt_tokens
        if truncate_prompt_tokens is not None:
            truncate = truncate_prompt_tokens
        results.append(PoolingParams(
            task, params.dimensions, params.normalize, params.activation, truncate
        ))  # fmt: skip
    return results

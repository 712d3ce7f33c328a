"""The pooling endpoints: /v1/embeddings, /pooling, /classify, /score and /rerank.

Every input becomes one engine pooling request (the engine packs them into shared steps and
serves them before generations); the handler waits for all, aborts them all if the client
leaves or one fails, and answers in vLLM's shapes. A task the model does not serve is a 400
naming the tasks it does. Text pairs are scored as a cross-encoder reads them when the model
serves "score", else by the cosine of their embeddings (entrypoints/score_utils.py).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import Any

import numpy as np
import torch
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from pagedllm.entrypoints.openai.errors import APIError
from pagedllm.entrypoints.openai.protocol import UsageInfo, random_uuid
from pagedllm.entrypoints.openai.protocol_pooling import (
    ClassificationData,
    ClassificationRequest,
    ClassificationResponse,
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    PoolingData,
    PoolingInput,
    PoolingRequest,
    PoolingResponse,
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
)
from pagedllm.entrypoints.openai.serving_engine import OpenAIServing, cancel_on_disconnect
from pagedllm.entrypoints.score_utils import cosine_score, cross_encoder_prompt, pair_up
from pagedllm.outputs import PoolingRequestOutput
from pagedllm.pooling_params import PoolingParams


class OpenAIServingPooling(OpenAIServing):
    """Handler of every pooling endpoint."""

    async def create_embedding(self, request: EmbeddingRequest, raw_request: Request) -> Response:
        """OpenAI embeddings: one vector per input, floats or base64."""
        self.check_base_model(request.model, "pooling")
        params = PoolingParams(
            "embed", request.dimensions, request.normalize, None, request.truncate_prompt_tokens
        )
        outputs = await self._run(raw_request, _prompts(request.input), params, request)
        if outputs is None:
            return Response(status_code=499)
        data = [
            EmbeddingData(index=i, embedding=_encode(o.outputs.data, request.encoding_format))
            for i, o in enumerate(outputs)
        ]
        response = EmbeddingResponse(model=self.model_name, data=data, usage=_usage(outputs))
        return JSONResponse(response.model_dump())

    async def create_pooling(self, request: PoolingRequest, raw_request: Request) -> Response:
        """The model's raw pooled output per input."""
        self.check_base_model(request.model, "pooling")
        task = request.task or "encode"
        params = PoolingParams(task, truncate_prompt_tokens=request.truncate_prompt_tokens)
        outputs = await self._run(raw_request, _prompts(request.input), params, request)
        if outputs is None:
            return Response(status_code=499)
        data = [
            PoolingData(index=i, data=_encode(o.outputs.data, request.encoding_format))
            for i, o in enumerate(outputs)
        ]
        response = PoolingResponse(model=self.model_name, data=data, usage=_usage(outputs))
        return JSONResponse(response.model_dump())

    async def create_classify(
        self, request: ClassificationRequest, raw_request: Request
    ) -> Response:
        """Class probabilities and the most likely label per input."""
        self.check_base_model(request.model, "pooling")
        params = PoolingParams(
            "classify", activation=request.activation,
            truncate_prompt_tokens=request.truncate_prompt_tokens,
        )  # fmt: skip
        outputs = await self._run(raw_request, _prompts(request.input), params, request)
        if outputs is None:
            return Response(status_code=499)
        labels = getattr(self.engine.get_model_config().hf_config, "id2label", None) or {}
        data = []
        for index, output in enumerate(outputs):
            probs = output.outputs.data.tolist()
            best = int(np.argmax(probs))
            data.append(ClassificationData(
                index=index, label=labels.get(best), probs=probs, num_classes=len(probs)
            ))  # fmt: skip
        response = ClassificationResponse(model=self.model_name, data=data, usage=_usage(outputs))
        return JSONResponse(response.model_dump())

    async def create_score(self, request: ScoreRequest, raw_request: Request) -> Response:
        """A score for each (text_1, text_2) pair."""
        self.check_base_model(request.model, "pooling")
        result = await self._score(
            raw_request, request, pair_up(request.text_1, request.text_2), request.activation
        )
        if result is None:
            return Response(status_code=499)
        scores, num_tokens = result
        data = [ScoreData(index=i, score=s) for i, s in enumerate(scores)]
        usage = UsageInfo(prompt_tokens=num_tokens, total_tokens=num_tokens)
        response = ScoreResponse(model=self.model_name, data=data, usage=usage)
        return JSONResponse(response.model_dump())

    async def create_rerank(self, request: RerankRequest, raw_request: Request) -> Response:
        """The documents ordered by relevance to the query (Jina / Cohere shape)."""
        self.check_base_model(request.model, "pooling")
        if not request.documents:
            raise APIError("documents cannot be empty.", param="documents")
        pairs = pair_up(request.query, request.documents)
        result = await self._score(raw_request, request, pairs, None)
        if result is None:
            return Response(status_code=499)
        scores, num_tokens = result
        ranked = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
        if request.top_n:
            ranked = ranked[: request.top_n]
        results = [
            RerankResult(
                index=i, relevance_score=scores[i],
                document=RerankDocument(text=request.documents[i])
                if request.return_documents else None,
            )
            for i in ranked
        ]  # fmt: skip
        response = RerankResponse(
            model=self.model_name, usage=RerankUsage(total_tokens=num_tokens), results=results
        )
        return JSONResponse(response.model_dump())

    async def _score(
        self,
        raw_request: Request,
        request: ScoreRequest | RerankRequest,
        pairs: list[tuple[str, str]],
        activation: bool | None,
    ) -> tuple[list[float], int] | None:
        """Scores of the pairs and the tokens read (None: the client left)."""
        truncate = request.truncate_prompt_tokens
        if "score" in self.engine.supported_tasks:
            prompts: list[Any] = [
                cross_encoder_prompt(self.tokenizer, a, b, truncate, self.max_model_len)
                for a, b in pairs
            ]
            params = PoolingParams("score", activation=activation)
            outputs = await self._run(raw_request, prompts, params, request)
            if outputs is None:
                return None
            return [float(o.outputs.data.reshape(-1)[0]) for o in outputs], _num_tokens(outputs)
        self.check_task("score", also_ok="embed")
        texts = list(dict.fromkeys(text for pair in pairs for text in pair))
        params = PoolingParams("embed", truncate_prompt_tokens=truncate)
        outputs = await self._run(raw_request, list(texts), params, request)
        if outputs is None:
            return None
        by_text = {text: output.outputs.data for text, output in zip(texts, outputs, strict=True)}
        scores = [float(cosine_score(by_text[a], by_text[b])) for a, b in pairs]
        return scores, _num_tokens(outputs)

    async def _run(
        self,
        raw_request: Request,
        prompts: list[Any],
        params: PoolingParams,
        request: Any,
    ) -> list[PoolingRequestOutput] | None:
        """Queue one engine request per prompt and wait for all (None: the client left)."""
        assert params.task is not None
        self.check_task(params.task)
        base_id = f"pool-{random_uuid()}"
        engine_ids = [f"{base_id}-{i}" for i in range(len(prompts))]
        streams: list[AsyncIterator[Any]] = []
        try:
            for prompt, engine_id in zip(prompts, engine_ids, strict=True):
                streams.append(await self.engine.add_request(
                    engine_id, prompt, params, 0, request.add_special_tokens
                ))  # fmt: skip
            return await cancel_on_disconnect(raw_request, _gather(streams))
        finally:
            await self.engine.abort(engine_ids)  # only the unfinished ones remain


def _prompts(value: PoolingInput) -> list[Any]:
    """The engine prompts of an `input` field: texts, or token-id lists."""
    if isinstance(value, str):
        return [value]
    if not value:
        raise APIError("input cannot be empty.", param="input")
    if all(isinstance(item, int) for item in value):
        return [{"prompt_token_ids": list(value)}]
    if all(isinstance(item, str) for item in value):
        return list(value)
    if all(isinstance(item, list) for item in value):
        return [{"prompt_token_ids": list(item)} for item in value]  # type: ignore[arg-type]
    raise APIError("input must be a string, a list of strings or of token ids.", param="input")


async def _gather(streams: list[AsyncIterator[Any]]) -> list[PoolingRequestOutput]:
    """The one output of every stream, in order."""

    async def last(stream: AsyncIterator[Any]) -> PoolingRequestOutput:
        result = None
        async for output in stream:
            result = output
        if not isinstance(result, PoolingRequestOutput):
            raise APIError("The request was aborted.", HTTPStatus.INTERNAL_SERVER_ERROR)
        return result

    return list(await asyncio.gather(*(last(s) for s in streams)))


def _encode(data: torch.Tensor, encoding_format: str) -> list[Any] | str:
    """Floats (nested for a matrix), or base64 of the little-endian float32 bytes."""
    if encoding_format == "base64":
        array = data.float().numpy().astype("<f4")
        return base64.b64encode(array.tobytes()).decode()
    return data.tolist()


def _num_tokens(outputs: list[PoolingRequestOutput]) -> int:
    return sum(len(o.prompt_token_ids) for o in outputs)


def _usage(outputs: list[PoolingRequestOutput]) -> UsageInfo:
    num_tokens = _num_tokens(outputs)
    return UsageInfo(prompt_tokens=num_tokens, total_tokens=num_tokens)

"""Pydantic models of the pooling endpoints, in vLLM's shapes: /v1/embeddings (OpenAI's),
/pooling, /classify, /score and the Jina/Cohere-style /rerank.

Inputs are a string, a list of strings, a list of token ids or a list of such lists. No
engine code is imported here.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from pagedllm.entrypoints.openai.protocol import OpenAIBaseModel, UsageInfo, random_uuid

# What `input` may be: text, texts, token ids, or lists of token ids.
PoolingInput = str | list[str] | list[int] | list[list[int]]


class _PoolingRequestBase(OpenAIBaseModel):
    """Fields every pooling request has (vLLM's extras included)."""

    model: str | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    add_special_tokens: bool = True
    priority: int = 0

    @model_validator(mode="after")
    def _no_priority(self) -> _PoolingRequestBase:
        if self.priority != 0:
            raise ValueError("priority is not built for pooling requests (they run first).")
        return self


class EmbeddingRequest(_PoolingRequestBase):
    """POST /v1/embeddings (OpenAI's, plus vLLM's `normalize` and `truncate_prompt_tokens`)."""

    input: PoolingInput
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    normalize: bool | None = None
    # vLLM embeds chat conversations too; not built here (400 rather than ignored).
    messages: Any = None

    @model_validator(mode="after")
    def _no_messages(self) -> EmbeddingRequest:
        if self.messages is not None:
            raise ValueError("messages (chat embeddings) are not supported; send input.")
        return self


class PoolingRequest(_PoolingRequestBase):
    """POST /pooling: the model's raw pooled output (`task`: encode unless given)."""

    input: PoolingInput
    encoding_format: Literal["float", "base64"] = "float"
    task: Literal["encode", "embed", "classify", "reward"] | None = None


class ClassificationRequest(_PoolingRequestBase):
    """POST /classify: class probabilities of each input."""

    input: PoolingInput
    activation: bool | None = None


class ScoreRequest(_PoolingRequestBase):
    """POST /score: relevance of text_1 to each text_2 (one to many, or pairwise)."""

    text_1: str | list[str]
    text_2: str | list[str]
    activation: bool | None = None


class RerankRequest(_PoolingRequestBase):
    """POST /rerank, /v1/rerank, /v2/rerank (Jina / Cohere): documents by relevance."""

    query: str
    documents: list[str]
    top_n: int = Field(default=0, ge=0)
    return_documents: bool = True


class _ListResponse(BaseModel):
    """What every pooling answer but /rerank carries beside its `data`."""

    object: str = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    usage: UsageInfo


class EmbeddingData(BaseModel):
    """One embedding: floats, or base64 of little-endian float32 values."""

    index: int
    object: str = "embedding"
    embedding: list[float] | str


class EmbeddingResponse(_ListResponse):
    """The /v1/embeddings answer."""

    id: str = Field(default_factory=lambda: f"embd-{random_uuid()}")
    data: list[EmbeddingData]


class PoolingData(BaseModel):
    """One raw pooled output (nested lists for a matrix)."""

    index: int
    object: str = "pooling"
    data: list[Any] | str


class PoolingResponse(_ListResponse):
    """The /pooling answer."""

    id: str = Field(default_factory=lambda: f"pool-{random_uuid()}")
    data: list[PoolingData]


class ClassificationData(BaseModel):
    """One input's classes: the most likely label and every probability."""

    index: int
    label: str | None
    probs: list[float]
    num_classes: int


class ClassificationResponse(_ListResponse):
    """The /classify answer."""

    id: str = Field(default_factory=lambda: f"classify-{random_uuid()}")
    data: list[ClassificationData]


class ScoreData(BaseModel):
    """One pair's score."""

    index: int
    object: str = "score"
    score: float


class ScoreResponse(_ListResponse):
    """The /score answer."""

    id: str = Field(default_factory=lambda: f"score-{random_uuid()}")
    data: list[ScoreData]


class RerankDocument(BaseModel):
    """A reranked document's text."""

    text: str


class RerankResult(BaseModel):
    """One document: its index in the request, its text and its relevance."""

    index: int
    document: RerankDocument | None = None
    relevance_score: float


class RerankUsage(BaseModel):
    """Tokens read by a rerank request."""

    total_tokens: int


class RerankResponse(BaseModel):
    """The /rerank answer: results best first, at most top_n of them."""

    id: str = Field(default_factory=lambda: f"rerank-{random_uuid()}")
    model: str
    usage: RerankUsage
    results: list[RerankResult]

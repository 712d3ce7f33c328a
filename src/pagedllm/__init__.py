"""pagedllm: high-throughput LLM inference with a paged KV cache and continuous batching.

The public API mirrors vLLM's: `LLM`, `SamplingParams`, `RequestOutput`, `LLMEngine`.
"""

from pagedllm.config import EngineConfig
from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.outputs import (
    ClassificationOutput,
    ClassificationRequestOutput,
    CompletionOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    Logprob,
    PoolingOutput,
    PoolingRequestOutput,
    RequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from pagedllm.pooling_params import PoolingParams
from pagedllm.sampling_params import (
    BeamSearchParams,
    GuidedDecodingParams,
    RequestOutputKind,
    SamplingParams,
    StructuredOutputsParams,
)

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "AsyncLLM",
    "AsyncLLMEngine",
    "LLMEngine",
    "BeamSearchParams",
    "ClassificationOutput",
    "ClassificationRequestOutput",
    "CompletionOutput",
    "EmbeddingOutput",
    "EmbeddingRequestOutput",
    "EngineArgs",
    "EngineConfig",
    "GuidedDecodingParams",
    "Logprob",
    "PoolingOutput",
    "PoolingParams",
    "PoolingRequestOutput",
    "RequestOutput",
    "RequestOutputKind",
    "ScoringOutput",
    "ScoringRequestOutput",
    "SamplingParams",
    "StructuredOutputsParams",
    "__version__",
]


def __getattr__(name: str):  # noqa: ANN202 - lazy re-exports
    # LLM and LLMEngine pull in torch and transformers; import them only when asked for.
    if name == "LLM":
        from pagedllm.entrypoints.llm import LLM

        return LLM
    if name in ("AsyncLLM", "AsyncLLMEngine"):
        from pagedllm.engine import async_llm

        return getattr(async_llm, name)
    if name == "LLMEngine":
        from pagedllm.engine.llm_engine import LLMEngine

        return LLMEngine
    raise AttributeError(f"module 'pagedllm' has no attribute {name!r}")

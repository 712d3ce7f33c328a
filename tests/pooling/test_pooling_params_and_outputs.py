"""PoolingParams validation and the pooling output views, with vLLM's names and fields."""

from __future__ import annotations

import pytest
import torch

from pagedllm.outputs import (
    ClassificationRequestOutput,
    EmbeddingRequestOutput,
    PoolingOutput,
    PoolingRequestOutput,
    ScoringRequestOutput,
)
from pagedllm.pooling_params import PoolingParams


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"task": "generate"}, "task"), ({"dimensions": 0}, "dimensions"),
     ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
     ({"truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
     ({"task": "classify", "dimensions": 8}, "dimensions")],
)  # fmt: skip
def test_bad_params_name_the_field(kwargs, field) -> None:
    with pytest.raises(ValueError, match=field):
        PoolingParams(**kwargs)


def test_verify_names_the_tasks_the_model_serves() -> None:
    params = PoolingParams(dimensions=4).verify("embed", ("embed",))
    assert (params.task, params.dimensions) == ("embed", 4)
    with pytest.raises(ValueError, match="does not support the 'classify' task; it serves: embed"):
        PoolingParams().verify("classify", ("embed",))
    with pytest.raises(ValueError, match="task is 'embed'"):
        PoolingParams(task="embed").verify("score", ("embed", "score"))


def _base(data: torch.Tensor) -> PoolingRequestOutput:
    return PoolingRequestOutput("r1", PoolingOutput(data), [1, 2, 3])


def test_output_views() -> None:
    embedded = EmbeddingRequestOutput.from_base(_base(torch.tensor([0.6, 0.8])))
    assert embedded.outputs.embedding == pytest.approx([0.6, 0.8])
    assert embedded.outputs.hidden_size == 2
    assert (embedded.request_id, embedded.prompt_token_ids, embedded.finished) == (
        "r1", [1, 2, 3], True)  # fmt: skip
    classified = ClassificationRequestOutput.from_base(_base(torch.tensor([0.25, 0.75])))
    assert classified.outputs.num_classes == 2
    scored = ScoringRequestOutput.from_base(_base(torch.tensor([0.9])))
    assert scored.outputs.score == pytest.approx(0.9)
    with pytest.raises(ValueError, match="one value"):
        ScoringRequestOutput.from_base(_base(torch.tensor([0.1, 0.2])))
    with pytest.raises(ValueError, match="one vector"):
        EmbeddingRequestOutput.from_base(_base(torch.zeros(2, 2)))

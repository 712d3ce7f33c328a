"""speculative_config: vLLM's keys from a dict, JSON or the CLI; bad keys and values name
themselves."""

from __future__ import annotations

import pytest

from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.spec_decode.config import SpeculativeConfig


def test_ngram_defaults_and_bounds():
    config = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 3})
    assert (config.prompt_lookup_min, config.prompt_lookup_max) == (5, 5)
    config = SpeculativeConfig.parse({"num_speculative_tokens": 4, "prompt_lookup_max": 3})
    assert config.method == "ngram"
    assert (config.prompt_lookup_min, config.prompt_lookup_max) == (3, 3)
    config = SpeculativeConfig.parse('{"method": "ngram", "prompt_lookup_min": 2}')
    assert (config.prompt_lookup_min, config.prompt_lookup_max) == (2, 5)
    assert config.num_speculative_tokens == 5


def test_method_defaults_to_draft_model_with_a_model():
    config = SpeculativeConfig.parse({"model": "/some/draft", "num_speculative_tokens": 2})
    assert config.method == "draft_model"


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({"method": "ngram", "bogus": 1}, "bogus"),
        ({"method": "lookahead"}, "method"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": "3"}, "num_speculative_tokens"),
        ({"method": "ngram", "prompt_lookup_min": 0}, "prompt_lookup_min"),
        ({"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "prompt_lookup_min"),
        ({"method": "ngram", "model": "x"}, "model"),
        ({"method": "eagle"}, "model"),
        ({"method": "ngram", "disable_by_batch_size": 0}, "disable_by_batch_size"),
        ("{not json", "JSON"),
        ([1, 2], "dict"),
    ],
)
def test_bad_key_or_value_raises_naming_it(value, named):
    with pytest.raises(ValueError, match=named):
        SpeculativeConfig.parse(value)


def test_engine_args_resolve_it(tiny_llama_dir):
    config = EngineArgs(
        model=str(tiny_llama_dir),
        speculative_config='{"method": "ngram", "num_speculative_tokens": 2}',
    ).create_engine_config()
    assert config.speculative_config == SpeculativeConfig(
        method="ngram", num_speculative_tokens=2, prompt_lookup_min=5, prompt_lookup_max=5,
        disable_by_batch_size=4,  # a float32 model: the compute-bound default
    )
    assert EngineArgs(model=str(tiny_llama_dir)).create_engine_config().speculative_config is None
    with pytest.raises(ValueError, match="prompt_lookup_max"):
        EngineArgs(
            model=str(tiny_llama_dir), speculative_config={"prompt_lookup_max": -1}
        ).create_engine_config()


def test_cli_flag(tiny_llama_dir):
    from pagedllm.entrypoints.cli import parse_serve_args

    text = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}'
    _, engine_args = parse_serve_args(["serve", str(tiny_llama_dir), "--speculative-config", text])
    assert engine_args.speculative_config == text
    config = engine_args.create_engine_config().speculative_config
    assert config is not None and config.num_speculative_tokens == 3
    assert (config.prompt_lookup_min, config.prompt_lookup_max) == (2, 2)


@pytest.mark.parametrize(("native_bf16", "limit"), [(True, 32), (False, 4)])
def test_ngram_batch_limit_follows_the_cpu(tiny_llama_dir, monkeypatch, native_bf16, limit):
    """Documented policy: n-gram drafts up to 32 running requests where bfloat16 matmuls
    are native (AMX), else up to 4; an explicit value wins."""
    import types

    from pagedllm.platform import cpu_platform
    from pagedllm.platform.cpu import CpuPlatform

    monkeypatch.setattr(CpuPlatform, "plan", types.SimpleNamespace(native_bf16=native_bf16))
    assert cpu_platform().plan.native_bf16 is native_bf16
    args = dict(model=str(tiny_llama_dir), dtype="bfloat16", device="cpu")
    config = EngineArgs(**args, speculative_config={"method": "ngram"}).create_engine_config()
    assert config.speculative_config.max_batch_size == limit
    explicit = {"method": "ngram", "disable_by_batch_size": 7}
    config = EngineArgs(**args, speculative_config=explicit).create_engine_config()
    assert config.speculative_config.max_batch_size == 7

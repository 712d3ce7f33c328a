"""OpenAI request fields → SamplingParams, with vLLM's defaults and checks.

Values resolve in vLLM's order: the request's value, then the model's generation_config.json,
then OpenAI's default. A parameter the engine does not implement yet (its SamplingParams field
is missing) is accepted at its neutral value and answered with a 400 otherwise, never
silently ignored. Validation of values stays in SamplingParams (ValueError → 400).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from pagedllm.entrypoints.openai.errors import APIError
from pagedllm.entrypoints.openai.protocol import SamplingExtras
from pagedllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams
from pagedllm.structured_output import check_constraint

_LOGIT_BIAS_LIMIT = 100.0
# Keys of generation_config.json that become server-side sampling defaults.
_GENERATION_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# Fields that only exist once the engine supports them, with their neutral value.
_OPTIONAL_FIELDS: dict[str, Any] = {
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "logit_bias": None,
    "allowed_token_ids": None,
    "bad_words": None,
    "logprobs": None,
    "prompt_logprobs": None,
    "logprob_token_ids": None,
    "best_of": None,
}


def sampling_params_fields() -> set[str]:
    """Names of the fields SamplingParams has (checked per call: cheap, and always current)."""
    return {f.name for f in dataclasses.fields(SamplingParams)}


def load_generation_defaults(model_dir: str) -> dict[str, Any]:
    """Sampling defaults the model ships in generation_config.json (only the keys it sets)."""
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {key: config[key] for key in _GENERATION_DEFAULT_KEYS if key in config}


def _parse_logit_bias(logit_bias: dict[str, float] | None) -> dict[int, float] | None:
    if logit_bias is None:
        return None
    parsed, bad = {}, []
    for key, value in logit_bias.items():
        try:
            token_id = int(key)
        except ValueError:
            bad.append(key)  # every bad key is named, not only the first
            continue
        parsed[token_id] = max(-_LOGIT_BIAS_LIMIT, min(_LOGIT_BIAS_LIMIT, float(value)))
    if bad:
        listed = ", ".join(repr(key) for key in bad)
        raise APIError(
            f"logit_bias keys must be token ids (integers as strings), got {listed}.",
            param="logit_bias",
        )
    return parsed


# Request fields beam search here does not combine with (each would change the answer):
# per-token logprobs, constraints and sampling-time adjustments of the logits.
_NOT_WITH_BEAM_SEARCH = (
    "logprobs", "prompt_logprobs", "logprob_token_ids", "response_format",
    "structured_outputs", "guided_json",
    "guided_regex", "guided_choice", "guided_grammar", "structural_tag", "tools",
    "logit_bias", "allowed_token_ids", "bad_words", "stop", "stop_token_ids", "min_tokens",
    "repetition_penalty", "presence_penalty", "frequency_penalty", "best_of", "cache_salt",
)


def _check_beam_search(request: SamplingExtras) -> None:
    """use_beam_search (beam width = n) refuses the fields it would silently ignore."""
    neutral = {"logprobs": (None, False), "min_tokens": (0,), "presence_penalty": (0.0,),
               "frequency_penalty": (0.0,), "repetition_penalty": (None, 1.0)}
    for name in _NOT_WITH_BEAM_SEARCH:
        value = getattr(request, name, None)
        if value not in neutral.get(name, (None,)) and value != []:
            raise APIError(f"use_beam_search with {name} is not supported yet.",
                           param="use_beam_search")


def _check_unsupported(request: SamplingExtras, grammar_backend: str) -> None:
    if request.use_beam_search:
        _check_beam_search(request)
    if request.guided_whitespace_pattern is not None:
        raise APIError(
            "guided_whitespace_pattern is not supported (the grammar backend takes "
            "structured_outputs.disable_any_whitespace instead).",
            param="guided_whitespace_pattern",
        )
    if request.guided_decoding_backend not in (None, "auto", grammar_backend):
        raise APIError(
            f"guided_decoding_backend {request.guided_decoding_backend!r} is not available: "
            f"this server's engine uses {grammar_backend} (--structured-outputs-config).",
            param="guided_decoding_backend",
        )


def _response_format_constraint(response_format: dict[str, Any]) -> dict[str, Any] | None:
    """OpenAI's response_format as StructuredOutputsParams fields (None for text)."""
    kind = response_format.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise APIError(
                "response_format json_schema needs a 'json_schema' object with a 'schema'.",
                param="response_format",
            )
        # OpenAI's "strict" only asks for what the grammar always does: a valid output.
        return {"json": spec.get("schema", {})}
    raise APIError(
        f"response_format type must be 'text', 'json_object' or 'json_schema', got {kind!r}.",
        param="response_format",
    )


def build_structured_outputs(
    request: SamplingExtras, grammar_backend: str = "xgrammar"
) -> StructuredOutputsParams | None:
    """The request's constraint, from whichever field gives it (at most one may).

    Raises:
        APIError: (400, naming the field) for two constraints or a malformed one.
    """
    given: list[tuple[str, dict[str, Any]]] = []
    if request.structured_outputs is not None:
        given.append(("structured_outputs", dict(request.structured_outputs)))
    for name, key in (("guided_json", "json"), ("guided_regex", "regex"),
                      ("guided_choice", "choice"), ("guided_grammar", "grammar"),
                      ("structural_tag", "structural_tag")):
        value = getattr(request, name)
        if value is not None:
            given.append((name, {key: value}))
    from_format = _response_format_constraint(request.response_format or {})
    if from_format is not None:
        given.append(("response_format", from_format))
    if not given:
        return None
    if len(given) > 1:
        raise APIError(
            f"Give one structured output constraint, got {[name for name, _ in given]}.",
            param=given[1][0],
        )
    name, fields = given[0]
    try:
        params = StructuredOutputsParams(**fields)
        check_constraint(params, grammar_backend)
    except (TypeError, ValueError) as exc:
        raise APIError(str(exc), param=name) from None
    return params


def build_sampling_params(
    request: SamplingExtras,
    max_tokens: int | None,
    logprobs: int | None,
    defaults: dict[str, Any],
    tool_constraint: StructuredOutputsParams | None = None,
    grammar_backend: str = "xgrammar",
) -> SamplingParams:
    """The SamplingParams of one prompt of `request`.

    Args:
        max_tokens: resolved output budget (None: up to max_model_len).
        logprobs: number of top logprobs per token, or None.
        defaults: the model's generation_config.json sampling defaults.
        tool_constraint: the grammar of a forced tool choice (the request may not bring
            another constraint besides).
        grammar_backend: the engine's structured-outputs library (constraints are checked
            for it).

    Raises:
        APIError: a parameter pagedllm does not support yet.
        ValueError: an invalid value (SamplingParams' own checks).
    """
    _check_unsupported(request, grammar_backend)

    def pick(name: str, openai_default: Any) -> Any:
        value = getattr(request, name)
        if value is not None:
            return value
        return defaults.get(name, openai_default)

    kwargs: dict[str, Any] = dict(
        n=request.n,
        temperature=pick("temperature", 1.0),
        top_p=pick("top_p", 1.0),
        top_k=pick("top_k", 0),
        min_p=pick("min_p", 0.0),
        seed=request.seed,
        stop=request.stop,
        stop_token_ids=request.stop_token_ids,
        ignore_eos=request.ignore_eos,
        max_tokens=max_tokens,
        min_tokens=request.min_tokens,
        include_stop_str_in_output=request.include_stop_str_in_output,
        skip_special_tokens=request.skip_special_tokens,
        spaces_between_special_tokens=request.spaces_between_special_tokens,
        output_kind=RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY,
        extra_args=_extra_args(request),
    )
    optional = {
        "presence_penalty": request.presence_penalty or 0.0,
        "frequency_penalty": request.frequency_penalty or 0.0,
        "repetition_penalty": pick("repetition_penalty", 1.0),
        "logit_bias": _parse_logit_bias(request.logit_bias),
        "allowed_token_ids": request.allowed_token_ids,
        "bad_words": request.bad_words or None,
        "logprobs": logprobs,
        "prompt_logprobs": request.prompt_logprobs,
        "logprob_token_ids": request.logprob_token_ids or None,
        "best_of": None if request.best_of in (None, request.n) else request.best_of,
    }
    kwargs.update(_supported_optional(optional))
    kwargs["structured_outputs"] = build_structured_outputs(request, grammar_backend)
    if tool_constraint is not None:
        if kwargs["structured_outputs"] is not None:
            raise APIError(
                "tool_choice 'required' or a named function cannot be combined with "
                "response_format or another structured output constraint.",
                param="tool_choice",
            )
        kwargs["structured_outputs"] = tool_constraint
    return SamplingParams(**kwargs)


def _supported_optional(values: dict[str, Any]) -> dict[str, Any]:
    """The optional values SamplingParams can take; 400 for a non-neutral one it cannot."""
    fields = sampling_params_fields()
    supported = {}
    for name, value in values.items():
        if name in fields:
            if value is not None:
                supported[name] = value
        elif value != _OPTIONAL_FIELDS[name]:
            raise APIError(f"{name} is not supported yet by this server.", param=name)
    return supported


def _extra_args(request: Any) -> dict[str, Any] | None:
    """SamplingParams.extra_args: vllm_xargs, and kv_transfer_params where vLLM puts it."""
    extra = dict(request.vllm_xargs or {})
    if request.kv_transfer_params is not None:
        extra["kv_transfer_params"] = request.kv_transfer_params
    return extra or None

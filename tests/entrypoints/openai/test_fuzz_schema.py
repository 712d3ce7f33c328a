"""schemathesis against the server's own OpenAPI schema: every operation, examples that fit
the schema and examples that break it, each sent with and without the API key. Pass: no
answer is a 5xx (a stream's error events included), and every 4xx is the OpenAI error JSON
`{"error": {"message", "type", "param", "code"}}` with `code` its status.

The example count per operation is bounded (FUZZ_EXAMPLES, default 12 per mode) so the
suite stays short; raise it to fuzz harder locally.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from collections.abc import Iterator

import httpx
import pytest
import requests
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable

from .conftest import API_KEY, MODEL_NAME, RunningServer, start_server, stop_server

schemathesis = pytest.importorskip("schemathesis")

STATUSES: defaultdict[tuple[str, bool], Counter[int]] = defaultdict(Counter)
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "12"))
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def fuzz_server(tiny_llama_dir, tmp_path_factory) -> Iterator[RunningServer]:
    """One server that generates and embeds (so the pooling handlers are reached too); a
    short context (128) and n <= 32 bound what any generated request can cost."""
    server = start_server(
        [str(tiny_llama_dir), "--runner", "generate", "--convert", "embed",
         "--served-model-name", MODEL_NAME, "--api-key", API_KEY,
         "--max-model-len", "128", "--max-num-seqs", "16", "--num-gpu-blocks-override", "512",
         # Generated requests may still run at the end (background responses): the
         # drain on SIGTERM is not what this test checks, so it does not wait for them.
         "--shutdown-timeout", "1"],
        tmp_path_factory.mktemp("fuzz") / "server.log",
        # n up to vLLM's 16384 is valid, and costs minutes on this machine: bound it.
        env={"PAGEDLLM_MAX_N_SEQUENCES": "32"})
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def schema(fuzz_server):
    raw = httpx.get(f"{fuzz_server.base_url}/openapi.json", timeout=30).json()
    return schemathesis.openapi.from_dict(raw)


def _operations(schema) -> list:
    return [result.ok() for result in schema.get_all_operations()]


def check_response(response, label: str) -> None:
    """No 5xx; a 4xx is the OpenAI error JSON (Anthropic's on /v1/messages, past the API
    key check); a stream carries no 5xx error event."""
    where = f"{label} -> {response.status_code}: {response.text[:300]}"
    assert response.status_code < 500, where
    if response.status_code >= 400 and "/v1/messages" in label and response.status_code != 401:
        body = response.json()
        assert body.get("type") == "error" and isinstance(body.get("error"), dict), where
        assert isinstance(body["error"].get("message"), str), where
    elif response.status_code >= 400:
        body = response.json()
        error = body.get("error")
        assert isinstance(error, dict), where
        assert isinstance(error.get("message"), str) and error["message"], where
        assert isinstance(error.get("type"), str), where
        assert error.get("code") == response.status_code, where
        assert "param" in error, where
    elif any(v.startswith("text/event-stream") for v in response.headers.get("content-type", [])):
        for line in response.text.splitlines():
            if line.startswith("data: {") and '"error"' in line:
                event = json.loads(line[6:])
                assert event["error"]["code"] < 500, where


def test_every_operation_with_and_without_the_key(fuzz_server, schema):
    operations = _operations(schema)
    assert len(operations) >= 15  # every route of the server is in its schema
    session = requests.Session()
    for operation in operations:
        for mode in schemathesis.GenerationMode:
            _fuzz(operation, mode, fuzz_server.base_url, session)
    # Still healthy; and the examples reached the handlers, not only the validation.
    assert httpx.get(f"{fuzz_server.base_url}/health", timeout=30).status_code == 200
    handlers = ("/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/score",
                "/tokenize", "/detokenize")
    answered = Counter()
    for path in handlers:
        answered.update(STATUSES[(path, True)])
    # How many examples get past validation varies with the generator; in all, many do.
    assert answered[200] >= 5 and answered[400] >= 5, answered
    assert STATUSES[("/v1/completions", True)][200] > 0, STATUSES[("/v1/completions", True)]
    print({f"{path} key={key}": dict(counts) for (path, key), counts in STATUSES.items()})


def _fuzz(operation, mode, base_url: str, session: requests.Session) -> None:
    label = f"{operation.method.upper()} {operation.path} ({mode.value})"

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              phases=[Phase.generate, Phase.shrink],
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case) -> None:
        if mode == schemathesis.GenerationMode.POSITIVE and isinstance(case.body, dict):
            # A random model name only ever gets the 404, and the schema lets `prompt` out
            # (vLLM's prompt_embeds alternative): reach the handlers behind those checks.
            case.body["model"] = MODEL_NAME
            if operation.path == "/v1/completions" and not case.body.get("prompt"):
                case.body["prompt"] = "Fuzz"
        for headers in (AUTH, {}):
            response = case.call(base_url=base_url, session=session, headers=headers,
                                 timeout=120)
            check_response(response, f"{label} {case.body!r:.200}")
            STATUSES[(operation.path, bool(headers))][response.status_code] += 1
            if os.environ.get("FUZZ_DEBUG") and headers and mode.value == "positive":
                print(label, response.status_code, response.text[:200])
            if not headers and operation.path.startswith("/v1/"):
                assert response.status_code == 401, label

    try:
        run()
    except Unsatisfiable:
        # Nothing to break in an operation without parameters or body (GET /health).
        assert mode == schemathesis.GenerationMode.NEGATIVE, label

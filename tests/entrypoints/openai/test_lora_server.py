"""`pagedllm serve --enable-lora --lora-modules`: adapters chosen by `model`, listed in
/v1/models, loaded and unloaded at run time under traffic, with 4xx errors naming what is
wrong. Completions equal the offline engine's, which equal transformers + peft."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.lora.request import LoRARequest
from tests.entrypoints.openai.conftest import API_KEY, http_client, start_server, stop_server
from tests.lora.adapters import MAX_TOKENS, make_adapter, reference_tokens

PROMPTS = [[5, 17, 99, 3, 42, 7], [11, 12, 13, 14, 15, 16, 17, 18, 19], [200, 4, 81]]
LONG_TOKENS = 160


@pytest.fixture(scope="module")
def adapters(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """Three adapters (the third of rank 32, over the server's limit) and, per adapter name,
    the offline engine's greedy text and token ids for every prompt."""
    folder = tmp_path_factory.mktemp("server_adapters")
    paths = {
        "alpha": make_adapter(tiny_llama_dir, folder / "alpha", 8, 16, ["q_proj", "v_proj"],
                              False, seed=1),
        "beta": make_adapter(tiny_llama_dir, folder / "beta", 4, 8,
                             ["o_proj", "gate_proj", "down_proj"], False, seed=2),
        "gamma": make_adapter(tiny_llama_dir, folder / "gamma", 16, 16, ["up_proj"], True,
                              seed=3),
        "huge": make_adapter(tiny_llama_dir, folder / "huge", 32, 32, ["q_proj"], False,
                             seed=4),
    }
    llm = LLM(str(tiny_llama_dir), dtype="float32", enable_lora=True, max_loras=3,
              max_lora_rank=16, max_model_len=256)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    want = {}
    for index, name in enumerate([None, "alpha", "beta", "gamma"]):
        lora = None if name is None else LoRARequest(name, index, str(paths[name]))
        outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params,
                               use_tqdm=False, lora_request=lora)
        want[name] = [(o.outputs[0].text, list(o.outputs[0].token_ids)) for o in outputs]
    long_params = SamplingParams(temperature=0.0, max_tokens=LONG_TOKENS, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], long_params,
                           use_tqdm=False, lora_request=LoRARequest("beta", 2, str(paths["beta"])))
    want["beta_long"] = [o.outputs[0].text for o in outputs]
    # The offline engine is itself checked against transformers + peft (one adapter here;
    # tests/lora covers them all).
    peft_tokens = reference_tokens(tiny_llama_dir, paths["beta"], PROMPTS)
    assert [ids for _, ids in want["beta"]] == peft_tokens
    return paths, want


@pytest.fixture(scope="module")
def lora_server(tiny_llama_dir: Path, adapters, tmp_path_factory: pytest.TempPathFactory):
    paths, _ = adapters
    tmp = tmp_path_factory.mktemp("lora_server")
    beta = json.dumps({"name": "beta", "path": str(paths["beta"]),
                       "base_model_name": "tiny-base"})
    running = start_server(
        [str(tiny_llama_dir), "--dtype", "float32", "--max-model-len", "256",
         "--served-model-name", "tiny-base", "--api-key", API_KEY,
         "--enable-lora", "--max-loras", "2", "--max-lora-rank", "16",
         "--lora-modules", f"alpha={paths['alpha']}", beta],
        tmp / "server.log", env={"PAGEDLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"},
    )
    yield running
    stop_server(running)


def _complete(http: httpx.Client, model: str, prompt: list[int], stream: bool = False) -> str:
    body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
            "stream": stream}
    if not stream:
        response = http.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["model"] == model
        return response.json()["choices"][0]["text"]
    text = ""
    with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                assert chunk["model"] == model
                text += chunk["choices"][0]["text"]
    return text


def _complete_all(server, jobs: list[tuple[str, list[int]]], stream: bool = False) -> list[str]:
    """Run the completions concurrently (one thread each, so they share engine steps)."""
    results: list[str | BaseException] = [""] * len(jobs)

    def run(index: int, model: str, prompt: list[int]) -> None:
        try:
            with http_client(server) as http:
                results[index] = _complete(http, model, prompt, stream)
        except BaseException as error:  # noqa: BLE001 - re-raised below
            results[index] = error

    threads = [threading.Thread(target=run, args=(i, *job)) for i, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return [str(r) for r in results]


def test_models_lists_adapters_with_parent(lora_server, adapters):
    paths, _ = adapters
    with http_client(lora_server) as http:
        cards = {c["id"]: c for c in http.get("/v1/models").json()["data"]}
    assert set(cards) == {"tiny-base", "alpha", "beta"}
    assert cards["alpha"]["parent"] == "tiny-base" and cards["alpha"]["root"] == str(
        paths["alpha"])
    assert cards["beta"]["parent"] == "tiny-base"
    assert cards["tiny-base"]["parent"] is None


def test_adapters_and_base_mixed_in_one_batch(lora_server, adapters):
    _, want = adapters
    jobs = [(model, prompt) for prompt in PROMPTS for model in ("tiny-base", "alpha", "beta")]
    texts = _complete_all(lora_server, jobs)
    for (model, prompt), text in zip(jobs, texts, strict=True):
        key = None if model == "tiny-base" else model
        assert text == want[key][PROMPTS.index(prompt)][0], model
    streamed = _complete_all(lora_server, jobs[:3], stream=True)
    assert streamed == texts[:3]


def test_chat_picks_the_adapter(lora_server):
    with http_client(lora_server) as http:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                "temperature": 0}
        replies = {}
        for model in ("tiny-base", "alpha"):
            response = http.post("/v1/chat/completions", json={**body, "model": model})
            assert response.status_code == 200, response.text
            assert response.json()["model"] == model
            replies[model] = response.json()["choices"][0]["message"]["content"]
    assert replies["tiny-base"] != replies["alpha"]


def test_unknown_model_is_404(lora_server):
    with http_client(lora_server) as http:
        response = http.post("/v1/completions",
                             json={"model": "delta", "prompt": "x", "max_tokens": 2})
    assert response.status_code == 404
    assert "delta" in response.json()["error"]["message"]


def test_load_errors_name_the_problem(lora_server, adapters, tmp_path):
    paths, _ = adapters
    cases = [
        ({"lora_name": "x"}, 400, "lora_path"),
        ({"lora_name": "x", "lora_path": str(tmp_path / "nowhere")}, 404, "nowhere"),
        ({"lora_name": "x", "lora_path": str(paths["huge"])}, 400, "rank 32"),
        ({"lora_name": "alpha", "lora_path": str(paths["gamma"])}, 400, "already been loaded"),
        ({"lora_name": "tiny-base", "lora_path": str(paths["gamma"])}, 400, "already"),
        ({"lora_name": "x", "lora_path": str(tmp_path)}, 400, "adapter_config.json"),
    ]
    with http_client(lora_server) as http:
        for body, status, words in cases:
            response = http.post("/v1/load_lora_adapter", json=body)
            assert response.status_code == status, (body, response.text)
            assert words in response.json()["error"]["message"], response.text
        response = http.post("/v1/unload_lora_adapter", json={"lora_name": "nope"})
        assert response.status_code == 404 and "nope" in response.json()["error"]["message"]
        assert http.get("/health").status_code == 200
        names = {c["id"] for c in http.get("/v1/models").json()["data"]}
    assert names == {"tiny-base", "alpha", "beta"}


def test_load_and_unload_under_traffic(lora_server, adapters):
    """gamma is loaded while base and alpha requests stream, then serves exact outputs;
    beta is unloaded while its requests stream: they finish with beta's exact text, and
    new requests for beta get 404."""
    paths, want = adapters
    background = [("tiny-base", p) for p in PROMPTS] + [("alpha", p) for p in PROMPTS]
    results: list[list[str]] = []
    traffic = threading.Thread(
        target=lambda: results.append(_complete_all(lora_server, background, stream=True)))
    traffic.start()
    with http_client(lora_server) as http:
        response = http.post("/v1/load_lora_adapter",
                             json={"lora_name": "gamma", "lora_path": str(paths["gamma"])})
        assert response.status_code == 200, response.text
        assert "gamma" in response.text
    traffic.join(180)
    assert [results[0][i] for i in range(len(PROMPTS))] == [t for t, _ in want[None]]
    assert results[0][len(PROMPTS):] == [t for t, _ in want["alpha"]]
    gamma = _complete_all(lora_server, [("gamma", p) for p in PROMPTS])
    assert gamma == [t for t, _ in want["gamma"]]

    # Unload beta while three long beta streams run (each has its first tokens).
    streams = [_BetaStream(lora_server, prompt) for prompt in PROMPTS]
    for stream in streams:
        assert stream.started.wait(60), stream.error
    with http_client(lora_server) as http:
        response = http.post("/v1/unload_lora_adapter", json={"lora_name": "beta"})
        assert response.status_code == 200, response.text
        unloaded_at = time.monotonic()
        after = http.post("/v1/completions", json={"model": "beta", "prompt": "x",
                                                    "max_tokens": 2})
        assert after.status_code == 404
    for stream in streams:
        stream.thread.join(180)
        assert stream.error is None
    assert [s.text for s in streams] == want_long_beta(adapters)
    # The streams were in flight: tokens kept coming after the unload answered.
    assert max(s.last_chunk_at for s in streams) > unloaded_at
    with http_client(lora_server) as http:
        names = {c["id"] for c in http.get("/v1/models").json()["data"]}
        assert names == {"tiny-base", "alpha", "gamma"}
        # Loading it again under the same name serves it again.
        response = http.post("/v1/load_lora_adapter",
                             json={"lora_name": "beta", "lora_path": str(paths["beta"])})
        assert response.status_code == 200, response.text
    assert _complete_all(lora_server, [("beta", PROMPTS[0])]) == [want["beta"][0][0]]



def want_long_beta(adapters) -> list[str]:
    """beta's offline greedy text for every prompt, LONG_TOKENS long."""
    return adapters[1]["beta_long"]


class _BetaStream:
    """A streaming beta completion of LONG_TOKENS tokens in its own thread."""

    def __init__(self, server, prompt: list[int]) -> None:
        self.started = threading.Event()
        self.text = ""
        self.last_chunk_at = 0.0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(server, prompt))
        self.thread.start()

    def _run(self, server, prompt: list[int]) -> None:
        body = {"model": "beta", "prompt": prompt, "max_tokens": LONG_TOKENS,
                "temperature": 0, "ignore_eos": True, "stream": True}
        try:
            with http_client(server) as http, http.stream(
                "POST", "/v1/completions", json=body
            ) as response:
                assert response.status_code == 200
                for line in response.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        self.text += json.loads(line[6:])["choices"][0]["text"]
                        self.last_chunk_at = time.monotonic()
                        self.started.set()
        except BaseException as error:  # noqa: BLE001 - checked by the test
            self.error = error
            self.started.set()


def test_runtime_updates_are_closed_without_the_env(server, http):
    """Without PAGEDLLM_ALLOW_RUNTIME_LORA_UPDATING the endpoints do not exist (as in vLLM)."""
    response = http.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "/x"})
    assert response.status_code == 404


def test_lora_modules_need_enable_lora_and_a_valid_folder(tiny_llama_dir, adapters, tmp_path,
                                                          capsys):
    paths, _ = adapters
    with pytest.raises(RuntimeError, match="--enable-lora"):
        start_server([str(tiny_llama_dir), "--lora-modules", f"a={paths['alpha']}"],
                     tmp_path / "a.log")
    with pytest.raises(RuntimeError, match="rank 32"):
        start_server([str(tiny_llama_dir), "--enable-lora", "--lora-modules",
                      f"a={paths['huge']}"], tmp_path / "b.log")
    # A malformed entry is refused while the flags are read (no engine is started for it).
    from pagedllm.entrypoints.cli import parse_serve_args

    with pytest.raises(SystemExit):
        parse_serve_args(["serve", str(tiny_llama_dir), "--enable-lora", "--lora-modules",
                          "nopath"])
    assert "name=path" in capsys.readouterr().err

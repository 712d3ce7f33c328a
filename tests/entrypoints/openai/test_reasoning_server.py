"""--reasoning-parser in chat: a reply `<think>…</think>answer` comes back as
`reasoning_content` (and `reasoning`) beside `content`, whole and streamed as deltas, the
same either way; tool calls are read from the answer only; structured outputs (choices,
JSON schemas, a required tool call) constrain only the answer after the reasoning, or the
whole reply when the prompt already closed the reasoning.

The model is scripted: a tiny Llama whose layers add nothing (zero output projections), so
each next token depends on the current one alone, and whose LM head maps each token of a
fixed script to the next: greedy decoding then writes `<think>` x y `</think>` z w EOS
after the chat prompt, whatever the prompt's text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from .conftest import RunningServer, http_client, start_server, stop_server

MODEL = "thinker"


def make_scripted_model(out: Path, tokenizer_dir: Path) -> tuple[Path, list[str]]:
    """A model whose greedy reply to any chat prompt is <think>, 2 tokens, </think>, 2
    tokens, EOS; returns its folder and the 4 inner tokens' texts."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.add_tokens(["<think>", "</think>"])  # plain (not special): they decode
    vocab = len(tokenizer)
    start, end = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    words = [tokenizer.encode(w, add_special_tokens=False)[0] for w in ("ab", "cd", "ef", "gh")]
    # The chat prompt ends with the generation prompt's last token: it leads to <think>.
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    prompt_end = tokenizer.encode(text, add_special_tokens=False)[-1]
    script = [prompt_end, start, words[0], words[1], end, words[2], words[3],
              tokenizer.eos_token_id]
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=False,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        embed = torch.randn(vocab, 64) * 0.02
        head = torch.zeros(vocab, 64)
        for position, token in enumerate(script[:-1]):
            embed[token] = 0.0
            embed[token, position] = 1.0  # orthogonal rows for the script's tokens
            head[script[position + 1]] += 10.0 * embed[token]
        model.model.embed_tokens.weight.copy_(embed)
        model.lm_head.weight.copy_(head)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out, [tokenizer.decode([w]) for w in words]


@pytest.fixture(scope="module")
def scripted(tiny_tokenizer_dir, tmp_path_factory) -> tuple[Path, list[str]]:
    return make_scripted_model(tmp_path_factory.mktemp("thinker"), tiny_tokenizer_dir)


@pytest.fixture(scope="module")
def server(scripted, tmp_path_factory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("reasoning_server")
    running = start_server(
        [str(scripted[0]), "--served-model-name", MODEL, "--max-model-len", "256",
         "--num-gpu-blocks-override", "128", "--reasoning-parser", "deepseek_r1",
         "--enable-auto-tool-choice", "--tool-call-parser", "hermes"], tmp / "server.log")
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def http(server) -> Iterator[httpx.Client]:
    with http_client(server) as client:
        yield client


BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20,
        "temperature": 0}


def test_reply_is_split_whole_and_streamed(http, scripted):
    words = scripted[1]
    message = http.post("/v1/chat/completions", json=BODY).json()["choices"][0]["message"]
    assert message["reasoning_content"] == message["reasoning"] == words[0] + words[1]
    assert message["content"] == words[2] + words[3]
    reasoning, content = "", ""
    with http.stream("POST", "/v1/chat/completions", json={**BODY, "stream": True}) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:])["choices"]:
                    delta = choice["delta"]
                    assert "<think>" not in str(delta) and "</think>" not in str(delta)
                    reasoning += delta.get("reasoning_content") or ""
                    content += delta.get("content") or ""
    assert (reasoning, content) == (words[0] + words[1], words[2] + words[3])


def test_tool_parser_reads_the_answer_only(http, scripted):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    response = http.post("/v1/chat/completions", json={**BODY, "tools": tools})
    message = response.json()["choices"][0]["message"]
    assert message["reasoning_content"] and message["content"] == "".join(scripted[1][2:])
    assert message["tool_calls"] == []


CHOICES = ["yes", "no"]


def _content_and_reasoning_streamed(http, body):
    reasoning, content = "", ""
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:])["choices"]:
                    reasoning += choice["delta"].get("reasoning_content") or ""
                    content += choice["delta"].get("content") or ""
    return reasoning or None, content


@pytest.mark.parametrize("constraint", [
    {"structured_outputs": {"choice": CHOICES}},
    {"guided_choice": CHOICES},
])
def test_structured_outputs_constrain_only_the_answer(http, scripted, constraint):
    # The reasoning stays the model's own (unconstrained: the script's two words); only the
    # answer after </think> is held to the choice (the script alone would write words 2-3).
    body = {**BODY, **constraint}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    assert message["reasoning_content"] == "".join(scripted[1][:2])
    assert message["content"] in CHOICES
    assert _content_and_reasoning_streamed(http, body) == (
        message["reasoning_content"], message["content"])


def test_json_schema_after_reasoning_parses(http, scripted):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    response = http.post("/v1/chat/completions", json={
        **BODY, "max_tokens": 40,
        "structured_outputs": {"json": schema, "disable_any_whitespace": True}})
    message = response.json()["choices"][0]["message"]
    assert message["reasoning_content"] == "".join(scripted[1][:2])
    assert isinstance(json.loads(message["content"])["ok"], bool)


def test_a_prompt_that_closed_the_reasoning_is_constrained_from_the_start(http):
    # The assistant turn is continued after a finished reasoning block: the whole reply is
    # the answer (the grammar holds from its first token), and no reasoning is reported.
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "<think>done</think>"}]
    body = {**BODY, "messages": messages, "add_generation_prompt": False,
            "continue_final_message": True, "structured_outputs": {"choice": CHOICES}}
    message = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    assert message.get("reasoning_content") is None and message["content"] in CHOICES
    assert _content_and_reasoning_streamed(http, body) == (None, message["content"])


def test_tool_choice_required_is_read_after_the_reasoning(http, scripted):
    tools = [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {}}}}]
    response = http.post("/v1/chat/completions", json={
        **BODY, "max_tokens": 60, "tools": tools, "tool_choice": "required"})
    message = response.json()["choices"][0]["message"]
    assert message["reasoning_content"] == "".join(scripted[1][:2])
    assert [call["function"]["name"] for call in message["tool_calls"]] == ["f"]

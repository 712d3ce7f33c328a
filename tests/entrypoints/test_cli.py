"""`pagedllm serve` argument parsing: flags from dataclass fields, YAML config, precedence."""

from __future__ import annotations

import dataclasses

import pytest

from pagedllm.engine.arg_utils import EngineArgs
from pagedllm.entrypoints.cli import make_parser, parse_serve_args
from pagedllm.entrypoints.openai.server_args import ServerArgs


def test_every_field_is_a_flag_with_help():
    _, serve = make_parser()
    text = serve.format_help()
    for cls in (ServerArgs, EngineArgs):
        for field in dataclasses.fields(cls):
            assert "--" + field.name.replace("_", "-") in text
    for action in serve._actions:
        assert action.help, action.dest
    for flag in ("--host", "--port", "--api-key", "--served-model-name", "--max-model-len",
                 "--max-num-seqs", "--max-num-batched-tokens", "--block-size", "--dtype",
                 "--enable-prefix-caching", "--no-enable-prefix-caching", "--chat-template",
                 "--config"):
        assert flag in text


def test_positional_model_and_types():
    server, engine = parse_serve_args([
        "serve", "/models/x", "--port", "9001", "--max-num-seqs", "4", "--dtype", "float32",
        "--no-enable-prefix-caching", "--served-model-name", "a", "b",
    ])
    assert engine.model == "/models/x" and engine.max_num_seqs == 4
    assert engine.dtype == "float32" and engine.enable_prefix_caching is False
    assert server.port == 9001 and server.served_model_name == ["a", "b"]
    assert server.host == "127.0.0.1"


def test_defaults_match_the_dataclasses():
    server, engine = parse_serve_args(["serve"])
    assert server == ServerArgs() and engine == EngineArgs()


def test_yaml_config_and_precedence(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("host: 0.0.0.0\nport: 7000\nmax-num-seqs: 8\nmodel: /m\n"
                      "enable-prefix-caching: false\nserved-model-name: one\n")
    server, engine = parse_serve_args(["serve", "--config", str(config), "--port", "7001"])
    assert server.host == "0.0.0.0" and server.port == 7001
    assert engine.max_num_seqs == 8 and engine.model == "/m"
    assert engine.enable_prefix_caching is False and server.served_model_name == ["one"]


@pytest.mark.parametrize("body", ["nonsense-key: 1\n", "- a list\n", "port: [1, 2\n",
                                  "max-num-seqs: many\n"])
def test_bad_yaml_is_a_usage_error(tmp_path, body):
    config = tmp_path / "config.yaml"
    config.write_text(body)
    with pytest.raises(SystemExit):
        parse_serve_args(["serve", "--config", str(config)])


def test_conflicting_model_arguments():
    with pytest.raises(SystemExit):
        parse_serve_args(["serve", "/a", "--model", "/b"])


def test_bad_choice_is_rejected():
    with pytest.raises(SystemExit):
        parse_serve_args(["serve", "--dtype", "int3"])


def test_api_key_from_environment(monkeypatch):
    monkeypatch.setenv("PAGEDLLM_API_KEY", "from-env")
    assert ServerArgs().resolved_api_key() == "from-env"
    assert ServerArgs(api_key="flag").resolved_api_key() == "flag"
    monkeypatch.delenv("PAGEDLLM_API_KEY")
    assert ServerArgs().resolved_api_key() is None


def test_api_key_middleware_guards_only_v1():
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from pagedllm.entrypoints.openai.api_server import APIKeyMiddleware

    app = FastAPI()
    app.get("/v1/models")(lambda: {"ok": True})
    app.get("/health")(lambda: {"ok": True})
    app.add_middleware(APIKeyMiddleware, api_key="k")
    client = TestClient(app)
    assert client.get("/health").status_code == 200
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Bearer k"}).status_code == 200


def test_chat_template_file_or_inline(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages }}")
    assert ServerArgs(chat_template=str(path)).resolved_chat_template() == "{{ messages }}"
    assert ServerArgs(chat_template="{{ x }}").resolved_chat_template() == "{{ x }}"


def test_tool_calling_flags():
    server, _ = parse_serve_args(["serve", "--enable-auto-tool-choice",
                                  "--tool-call-parser", "llama3_json"])
    assert server.enable_auto_tool_choice and server.tool_call_parser == "llama3_json"


@pytest.mark.parametrize("argv", [["--enable-auto-tool-choice"],
                                  ["--tool-call-parser", "nope"]])
def test_bad_tool_calling_flags_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit):
        parse_serve_args(["serve", *argv])
    assert "tool-call-parser" in capsys.readouterr().err


def test_the_prefill_cap_beside_decodes_is_a_flag_off_by_default():
    _, engine = parse_serve_args(["serve"])
    assert engine.prefill_tokens_per_decode == 0  # vLLM's behaviour: no cap
    _, engine = parse_serve_args(["serve", "--prefill-tokens-per-decode", "3"])
    assert engine.prefill_tokens_per_decode == 3

"""benchmarks/serving.py starts llama.cpp's own server the way a llama.cpp user runs it
(continuous batching, one slot per concurrent client, each slot the model length) and runs
each concurrency level of `--max-concurrency 8,32` against each server."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import load_benchmark


@pytest.fixture
def serving(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    yield load_benchmark("serving")
    sys.modules.pop("common", None)


def _args(serving, *argv: str):
    return serving.parse_args(["--launch", "llama-server", *argv])


def test_llama_server_runs_continuous_batching_with_a_slot_per_client(serving, tmp_path):
    binary = tmp_path / "llama-server"
    args = _args(serving, "--llama-server", str(binary), "--max-concurrency", "8,32",
                 "--max-model-len", "512", "--threads", "2")
    assert serving.concurrency_levels(args) == [8, 32]
    command = serving.server_command("llama-server", "m.gguf", 9000, args)
    assert command[0] == str(binary)
    flags = dict(zip(command[1::2], command[2::2], strict=False))
    assert flags["-m"] == "m.gguf" and flags["--port"] == "9000" and flags["-t"] == "2"
    assert flags["--parallel"] == "32" and flags["-c"] == str(512 * 32)
    assert "--cont-batching" in command and command[command.index("-fa") + 1] == "on"


def test_without_a_concurrency_cap_every_prompt_gets_a_slot(serving, tmp_path):
    args = _args(serving, "--llama-server", str(tmp_path / "s"), "--num-prompts", "12")
    assert serving.concurrency_levels(args) == [None]
    command = serving.server_command("llama-server", "m.gguf", 9000, args)
    assert command[command.index("--parallel") + 1] == "12"


def test_a_missing_llama_server_is_a_clear_error(serving, monkeypatch):
    monkeypatch.delenv("LLAMA_SERVER", raising=False)
    monkeypatch.setenv("PATH", "")
    with pytest.raises(SystemExit, match="llama-server not found"):
        serving.server_command("llama-server", "m.gguf", 9000, _args(serving))


def test_the_length_lever_is_the_ignore_eos_field_where_a_server_takes_it(serving):
    extra = {"logit_bias": {"2": -100}}
    args = _args(serving, "--length-lever", "ignore_eos")
    assert serving.request_extra("llama-server", extra, args) == {"ignore_eos": True}
    assert serving.request_extra("pagedllm", extra, args) == {"ignore_eos": True}
    assert serving.request_extra("llamacpp", extra, args) == extra  # llama-cpp-python: bias
    assert serving.request_extra("pagedllm", extra, _args(serving)) == extra  # the default


def test_each_concurrency_level_sends_prompts_no_other_level_sent(serving):
    """A server's prefix cache would otherwise answer a later level's prompts from an
    earlier level's blocks (and the warm-up's from its own)."""
    args = _args(serving, "--num-prompts", "6", "--input-len", "16")
    args.gguf = None
    sets, warm, tokenizer, extra = serving.build_prompts(args, 2)
    assert len(sets) == 2 and all(len(prompts) == 6 for prompts in sets)
    assert len(warm) == 2
    # No two prompts share even their first tokens (a prefix-cache block's worth).
    starts = [tuple(tokenizer.encode(p, add_special_tokens=False)[:4])
              for p in [*sets[0], *sets[1], *warm]]
    assert len(set(starts)) == len(starts) == 14
    assert "logit_bias" in extra

"""ServerArgs: the HTTP server's own settings (the engine's are EngineArgs).

Each field's `help` metadata becomes its `--flag` help text; the CLI derives the flags from
these fields. Nothing here starts a server.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from pagedllm import envs
from pagedllm.entrypoints.openai.served_models import parse_lora_modules
from pagedllm.multimodal.media import video_num_frames
from pagedllm.tool_calling import get_tool_parser


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass
class ServerArgs:
    """Settings of the OpenAI-compatible HTTP server."""

    host: str = field(default="127.0.0.1", metadata=_help(
        "Address to listen on (0.0.0.0 for every interface, e.g. in a container)."))
    port: int = field(default=8000, metadata=_help("TCP port to listen on."))
    api_key: str | None = field(default=None, metadata=_help(
        "Require `Authorization: Bearer KEY` on /v1/* (default: env PAGEDLLM_API_KEY). "
        "/health, /ping, /version and /metrics stay open."))
    served_model_name: list[str] | None = field(default=None, metadata=_help(
        "Name(s) clients pass as `model`; the first is reported in responses (default: the "
        "model argument)."))
    lora_modules: list[str] | None = field(default=None, metadata=_help(
        "LoRA adapters to serve (needs --enable-lora), each `name=path` or JSON "
        "'{\"name\": ..., \"path\": ..., \"base_model_name\": ...}'; clients pick one "
        "by passing its name as `model`."))
    chat_template: str | None = field(default=None, metadata=_help(
        "Jinja chat template, as a file path or inline, overriding the model's own."))
    uvicorn_log_level: str = field(default="info", metadata=_help(
        "uvicorn's log level: critical, error, warning, info, debug or trace."))
    disable_log_stats: bool = field(default=False, metadata=_help(
        "Turn off the periodic stats log line and the Prometheus request metrics."))
    timeout_keep_alive: int = field(default=5, metadata=_help(
        "Seconds an idle HTTP keep-alive connection stays open."))
    shutdown_timeout: float = field(default=30.0, metadata=_help(
        "On SIGTERM, the most seconds to let running requests finish (new ones get 503) "
        "before stopping; a second SIGTERM or SIGINT stops at once."))
    multiprocessing: bool = field(default=True, metadata=_help(
        "Run the engine core (scheduler + model) in its own process, so HTTP and text "
        "processing overlap with model execution; --no-multiprocessing keeps it in a thread "
        "of the server process (debugging)."))

    enable_auto_tool_choice: bool = field(default=False, metadata=_help(
        "Let the model decide when to call tools (tool_choice \"auto\", the default when "
        "a request has tools); needs --tool-call-parser."))
    tool_call_parser: str | None = field(default=None, metadata=_help(
        "How tool calls are read from the model's text: hermes (Hermes, Qwen), llama3_json "
        "(Llama 3.1/3.2 JSON), mistral or pythonic (Llama 3.2/4 pythonic, ToolACE)."))
    exclude_tools_when_tool_choice_none: bool = field(default=False, metadata=_help(
        "Leave `tools` out of the chat template when a request sets tool_choice \"none\"."))
    allowed_local_media_path: str = field(default="", metadata=_help(
        "Let image_url parts read file:// URLs below this folder (off when empty: a "
        "security risk on a shared machine)."))
    allowed_media_domains: list[str] | None = field(default=None, metadata=_help(
        "The only hosts http(s) image URLs may name (default: any)."))
    media_io_kwargs: str | None = field(default=None, metadata=_help(
        "Options of media loading, as JSON: {\"video\": {\"num_frames\": N}} keeps at most N "
        "frames of a video_url's video, spread evenly (default 32)."))

    root_path: str = field(default="", metadata=_help(
        "The path prefix a reverse proxy serves this server under (e.g. /llm): routes answer "
        "both with and without it, and generated URLs carry it."))
    enable_request_id_headers: bool = field(default=False, metadata=_help(
        "Answer every request with an X-Request-Id header: the client's own, else a new id."))
    enable_force_include_usage: bool = field(default=False, metadata=_help(
        "Put usage on every streamed response (a final usage chunk), as if each request "
        "asked for stream_options.include_usage."))
    generation_config: str = field(default="auto", metadata=_help(
        "Where requests' sampling defaults come from: auto (the model's "
        "generation_config.json), vllm (none: the built-in defaults), or a folder holding a "
        "generation_config.json."))
    enable_tokenizer_info_endpoint: bool = field(default=False, metadata=_help(
        "Serve GET /tokenizer_info (the tokenizer's class, special tokens, chat template)."))
    enable_server_load_tracking: bool = field(default=False, metadata=_help(
        "Count the requests in flight and serve the count at GET /load."))
    enable_prompt_tokens_details: bool = field(default=False, metadata=_help(
        "vLLM's switch for usage.prompt_tokens_details; accepted for compatibility: this "
        "server always reports it (cached_tokens)."))
    show_hidden_metrics_for_version: str | None = field(default=None, metadata=_help(
        "vLLM's switch for metrics it hid in a release; accepted for compatibility: this "
        "server hides none."))
    enable_per_request_metrics: bool = field(default=False, metadata=_help(
        "Put each request's timing (time to first token, queue time, mean inter-token "
        "latency, tokens/s) in its response's `metrics` (a stream's: on the usage chunk); "
        "not for responses of several prompts or choices."))
    return_tokens_as_token_ids: bool = field(default=False, metadata=_help(
        "Write logprobs tokens as 'token_id:N' (vLLM's flag: ids survive tokens that are not "
        "valid UTF-8 alone); a request's return_tokens_as_token_ids overrides it."))

    def __post_init__(self) -> None:
        parse_lora_modules(self.lora_modules)  # ValueError naming a malformed entry
        video_num_frames(self.media_io_kwargs)  # ValueError naming a bad option
        if self.tool_call_parser is not None:
            get_tool_parser(self.tool_call_parser)  # ValueError naming the known ones
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser.")

    def resolved_api_key(self) -> str | None:
        """The API key in force: --api-key, else PAGEDLLM_API_KEY, else none."""
        return self.api_key or envs.api_key()

    def resolved_chat_template(self) -> str | None:
        """The --chat-template text (read from the file when it names one)."""
        template = self.chat_template
        if template and os.path.isfile(template):
            with open(template, encoding="utf-8") as f:
                return f.read()
        return template

"""ServerArgs: the HTTP server's own settings (the engine's are EngineArgs).

Each field's `help` metadata becomes its `--flag` help text; the CLI derives the flags from
these fields. Nothing here starts a server.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from pagedllm import envs


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
    chat_template: str | None = field(default=None, metadata=_help(
        "Jinja chat template, as a file path or inline, overriding the model's own."))
    uvicorn_log_level: str = field(default="info", metadata=_help(
        "uvicorn's log level: critical, error, warning, info, debug or trace."))
    disable_log_stats: bool = field(default=False, metadata=_help(
        "Turn off the periodic stats log line and the Prometheus request metrics."))
    timeout_keep_alive: int = field(default=5, metadata=_help(
        "Seconds an idle HTTP keep-alive connection stays open."))
    multiprocessing: bool = field(default=True, metadata=_help(
        "Run the engine core (scheduler + model) in its own process, so HTTP and text "
        "processing overlap with model execution; --no-multiprocessing keeps it in a thread "
        "of the server process (debugging)."))

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

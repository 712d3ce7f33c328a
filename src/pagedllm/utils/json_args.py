"""Config arguments given as a dict in Python or as JSON text on the CLI. No torch here."""

from __future__ import annotations

import json
from typing import Any


def parse_json_arg(value: Any, name: str) -> Any:
    """`value` itself, or parsed when it is JSON text (`--x-config '{...}'`).

    Raises:
        ValueError: naming `name` when the text is not valid JSON.
    """
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name} is not valid JSON: {exc}") from None

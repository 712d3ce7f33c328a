"""The tool-call parsers: one module per model family's format (base.py: the interface and
registry; forced.py: readers of forced choices). Importing this package registers hermes,
llama3_json, mistral and pythonic."""

from pagedllm.tool_calling.parsers import hermes, llama3_json, mistral, pythonic

__all__ = ["hermes", "llama3_json", "mistral", "pythonic"]

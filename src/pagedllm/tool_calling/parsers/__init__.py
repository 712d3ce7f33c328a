"""The tool-call parsers: one module per model family's format, plus the forced-choice
readers. Importing this package registers hermes, llama3_json, mistral and pythonic."""

from pagedllm.tool_calling.parsers import hermes, llama3_json, mistral, pythonic
from pagedllm.tool_calling.parsers.base import (
    ToolCall,
    ToolParse,
    ToolParser,
    get_tool_parser,
    register_tool_parser,
    tool_parser_names,
)
from pagedllm.tool_calling.parsers.forced import NamedToolOutput, RequiredToolOutput

__all__ = [
    "NamedToolOutput", "RequiredToolOutput", "ToolCall", "ToolParse", "ToolParser",
    "get_tool_parser", "hermes", "llama3_json", "mistral", "pythonic", "register_tool_parser",
    "tool_parser_names",
]

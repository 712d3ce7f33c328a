"""Tool calling: the tool-call parsers (`--tool-call-parser`), the grammars that enforce
`tool_choice="required"` or a named function, and the streamer that turns a choice's text into
tool-call deltas. Used by the OpenAI server's chat endpoint; it calls no engine code.
"""

from pagedllm.tool_calling import parsers  # noqa: F401 - registers the parsers
from pagedllm.tool_calling.parsers.base import (
    ToolCall,
    ToolParse,
    ToolParser,
    get_tool_parser,
    register_tool_parser,
    tool_parser_names,
)
from pagedllm.tool_calling.parsers.forced import NamedToolOutput, RequiredToolOutput
from pagedllm.tool_calling.streaming import StreamDelta, ToolCallDelta, ToolCallStreamer
from pagedllm.tool_calling.tools import named_function, resolve_tool_choice, tool_choice_constraint

__all__ = [
    "NamedToolOutput", "RequiredToolOutput", "StreamDelta", "ToolCall", "ToolCallDelta",
    "ToolCallStreamer", "ToolParse", "ToolParser", "get_tool_parser", "named_function",
    "register_tool_parser", "resolve_tool_choice", "tool_choice_constraint",
    "tool_parser_names",
]

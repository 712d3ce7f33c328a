"""How one chat request uses tools: the tools its template sees, the grammar of a forced
choice, the parser of its reply, and the reply's message and finish_reason.

tool_choice "none": the reply is text (the template still sees the tools unless the server
says otherwise). "auto": the server's `--tool-call-parser` reads calls out of the text.
"required" or a named function: a grammar forces the calls, so their arguments validate
against the tools' schemas, and the forced shape is read back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagedllm.entrypoints.openai.errors import APIError
from pagedllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    FunctionCall,
    ResponseMessage,
    ToolCall,
)
from pagedllm.entrypoints.openai.serving_engine import ServingConfig
from pagedllm.sampling_params import SamplingParams, StructuredOutputsParams
from pagedllm.structured_output import check_constraint
from pagedllm.tool_calling import (
    NamedToolOutput,
    RequiredToolOutput,
    ToolCallStreamer,
    ToolParser,
    get_tool_parser,
    named_function,
    resolve_tool_choice,
    tool_choice_constraint,
)


@dataclass
class ChatToolUse:
    """A request's tool settings, resolved.

    Attributes:
        template_tools: the tools given to the chat template (None: none).
        constraint: the grammar forcing the tool choice (None unless forced).
        parser: reads tool calls out of each choice's text (None: the reply is text).
        max_calls: 1 when `parallel_tool_calls` is false (later calls are dropped).
    """

    template_tools: list[dict[str, Any]] | None = None
    constraint: StructuredOutputsParams | None = None
    parser: ToolParser | None = None
    max_calls: int | None = None

    def adjust(self, params: SamplingParams) -> None:
        """Settings the parser needs in the request (markers kept in the text)."""
        if self.parser is not None:
            self.parser.adjust_params(params)

    def message(self, role: str, text: str) -> ResponseMessage:
        """A finished choice's message: content and tool calls."""
        if self.parser is None:
            return ResponseMessage(role=role, content=text)
        content, calls = self.parser.extract(text)
        calls = calls[:self.max_calls]
        return ResponseMessage(role=role, content=content, tool_calls=[
            ToolCall(id=call.id, function=FunctionCall(name=call.name, arguments=call.arguments))
            for call in calls
        ])

    def streamer(self) -> ToolCallStreamer | None:
        """A streamer for one choice (None when the reply is plain text)."""
        if self.parser is None:
            return None
        return ToolCallStreamer(self.parser, self.max_calls)


def finish_reason(reason: str | None, called_tools: bool) -> str | None:
    """OpenAI's "tool_calls" for a reply that ended by itself with tool calls."""
    return "tool_calls" if called_tools and reason == "stop" else reason


def plan_tool_use(
    request: ChatCompletionRequest, config: ServingConfig, tokenizer: Any
) -> ChatToolUse:
    """Resolve `tools` / `tool_choice` / `parallel_tool_calls` against the server's settings.

    Raises:
        APIError: 400 naming `tool_choice` or `tools` when they cannot be served.
    """
    tools = [tool.model_dump(exclude_none=True) for tool in request.tools or []]
    try:
        choice = resolve_tool_choice(tools, request.tool_choice)
    except ValueError as exc:
        raise APIError(str(exc), param="tool_choice") from None
    if choice == "none":
        hide = config.exclude_tools_when_tool_choice_none or not tools
        return ChatToolUse(template_tools=None if hide else tools)
    use = ChatToolUse(template_tools=tools,
                      max_calls=1 if request.parallel_tool_calls is False else None)
    if choice == "auto":
        if not (config.enable_auto_tool_choice and config.tool_call_parser):
            raise APIError(
                '"auto" tool choice requires --enable-auto-tool-choice and '
                "--tool-call-parser to be set.", param="tool_choice",
            )
        strict = [t["function"]["name"] for t in tools if t["function"].get("strict")]
        if strict:
            raise APIError(
                f"strict function schemas are enforced with tool_choice 'required' or a named "
                f"function; with 'auto' they are not supported yet (tools {strict}).",
                param="tools",
            )
        use.parser = get_tool_parser(config.tool_call_parser)(tokenizer)
        return use
    try:
        use.constraint = tool_choice_constraint(tools, choice, request.parallel_tool_calls
                                                is not False)
        assert use.constraint is not None
        check_constraint(use.constraint, config.grammar_backend)
    except ValueError as exc:
        raise APIError(f"tools: a function's parameters are not a usable JSON schema: {exc}",
                       param="tools") from None
    name = named_function(choice)
    use.parser = RequiredToolOutput(tokenizer) if name is None else NamedToolOutput(
        name, tokenizer)
    return use

"""OpenAI's harmony format (gpt-oss), read as reasoning and answer (`openai_gptoss`).

A harmony reply is a run of messages, each a header and a body:
`<|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…<|return|>`.
The header names the channel (`analysis`, `commentary`, `final`), maybe a recipient
(` to=functions.get_weather`) and a format (`<|constrain|>json`); a body ends at `<|end|>`,
`<|return|>` or `<|call|>`. As vLLM reads it: `analysis` bodies are reasoning; `final` bodies
and `commentary` bodies without a recipient are the answer; bodies addressed to a tool are
tool calls, left out of both. Bodies of one kind are joined with a newline. The markers are
special tokens, so requests keep special tokens in their text. A reply that does not open
with a header is all answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedllm.reasoning.parsers import ReasoningParser, ReasoningSplit, _partial_tag_length

_MESSAGE = "<|message|>"
_BODY_ENDS = ("<|end|>", "<|return|>", "<|call|>")
_HEADER_STARTS = ("<|channel|>", "<|start|>")


@dataclass(frozen=True)
class HarmonyReasoningParser(ReasoningParser):
    """The `openai_gptoss` parser (also `gpt_oss`)."""

    name: str = "openai_gptoss"
    needs_special_tokens: bool = True

    def streamer(self, answer_from_start: bool = False) -> HarmonyStreamer:
        """A streamer for one reply."""
        return HarmonyStreamer(plain=answer_from_start)

    def ended_in(self, prompt_text: str) -> bool:
        """The prompt opened a final-channel message (the reply is its body)."""
        tail = prompt_text[prompt_text.rfind("<|start|>"):]
        return "<|channel|>final" in tail and tail.rstrip().endswith(_MESSAGE)


@dataclass
class HarmonyStreamer:
    """Splits one harmony reply, fed as deltas (see the module docstring)."""

    plain: bool = False  # no headers: everything is answer
    decided: bool = False
    in_header: bool = True
    header: str = ""
    pending: str = ""
    kind: str = ""  # the current body's: "reasoning", "content" or "tool"
    channel: str = ""  # the current body's channel
    emitted: frozenset[str] = frozenset()  # kinds that have had a body (for the newlines)

    @property
    def in_answer(self) -> bool:
        """True inside the final channel's body (or a plain reply): a commentary preamble is
        answer text, but what a constraint binds is the final message."""
        return self.plain or (not self.in_header and self.channel == "final")

    def feed(self, delta: str, final: bool = False) -> ReasoningSplit:
        """The reasoning and answer text `delta` completes (`final`: the reply ended)."""
        self.pending += delta
        if self.plain:
            content, self.pending = self.pending, ""
            return ReasoningSplit(None, content or None)
        if not self.decided and not self._decide(final):
            return ReasoningSplit()
        parts = {"reasoning": "", "content": ""}
        while self.pending:
            if self.in_header:
                if not self._read_header():
                    break
                continue
            text, closed = self._read_body(final)
            if self.kind in parts and text:
                parts[self.kind] += text
            if not closed:
                break
        if self.plain:
            parts["content"] += self.pending
            self.pending = ""
        return ReasoningSplit(parts["reasoning"] or None, parts["content"] or None)

    def _decide(self, final: bool) -> bool:
        """Headers or plain text; False while too short to tell."""
        text = self.pending.lstrip()
        if any(text.startswith(marker) for marker in _HEADER_STARTS):
            self.decided = True
            return True
        if not final and any(marker.startswith(text) for marker in _HEADER_STARTS):
            return False
        self.decided = self.plain = True
        return True

    def _read_header(self) -> bool:
        """Consume a whole header; False while it is incomplete."""
        index = self.pending.find(_MESSAGE)
        if index < 0:
            return False
        header = self.pending[:index]
        self.pending = self.pending[index + len(_MESSAGE):]
        self.kind = _body_kind(header)
        self.channel = _channel(header)
        if self.kind in self.emitted and self.kind != "tool":
            self.pending = "\n" + self.pending  # bodies of one kind are joined by newlines
        self.emitted = self.emitted | {self.kind}
        self.in_header = False
        return True

    def _read_body(self, final: bool) -> tuple[str, bool]:
        """The body text that is certain, and whether the body ended."""
        hits = [(self.pending.find(end), end) for end in _BODY_ENDS if end in self.pending]
        if hits:
            index, end = min(hits)
            text = self.pending[:index]
            self.pending = self.pending[index + len(end):]
            self.in_header = True
            return text, True
        keep = 0 if final else max(_partial_tag_length(self.pending, end) for end in _BODY_ENDS)
        text = self.pending[: len(self.pending) - keep]
        self.pending = self.pending[len(self.pending) - keep:]
        return text, False


def _channel(header: str) -> str:
    """A message header's channel name ("" when it names none)."""
    channel = header.split("<|channel|>", 1)[-1] if "<|channel|>" in header else ""
    return channel.split("<|", 1)[0].split(" ", 1)[0].strip()


def _body_kind(header: str) -> str:
    """What a message's body is, from its header."""
    if " to=" in header or header.startswith("to="):
        return "tool"
    return "reasoning" if _channel(header) == "analysis" else "content"

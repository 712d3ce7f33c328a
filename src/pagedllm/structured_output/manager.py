"""The engine core's side of structured outputs: compiling grammars off the step loop, and
each step's token bitmask.

Compiling a JSON schema for a 49k-token vocabulary takes tens to hundreds of milliseconds,
so it runs in a small thread pool; a request waits in the scheduler until its grammar is
ready, without holding back the others (`RequestGrammar.is_ready`). Compiled grammars are
kept in an LRU cache keyed by the constraint, so a repeated schema compiles once. Each
request gets its own matcher, the state that survives preemption (it lives on the request,
not in the worker), advanced by the scheduler with every accepted token.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from pagedllm.logger import init_logger
from pagedllm.reasoning import ReasoningParser, get_reasoning_parser
from pagedllm.sampling_params import StructuredOutputsParams
from pagedllm.structured_output.backend import GrammarBackend, GrammarMatcher
from pagedllm.structured_output.reasoning_gate import ReasoningGate

logger = init_logger(__name__)

_DEFAULT_CACHE_SIZE = 128
# How much of a prompt's end is read for a closed reasoning (Qwen3: `<think>\n\n</think>`).
_PROMPT_TAIL_TOKENS = 64


def cache_key(params: StructuredOutputsParams) -> tuple[Any, ...]:
    """What makes two constraints compile to the same grammar."""
    value: Any = getattr(params, params.kind)
    if isinstance(value, dict):
        value = json.dumps(value, sort_keys=True)
    elif isinstance(value, list):
        value = tuple(value)
    return (params.kind, value, params.disable_any_whitespace)


class RequestGrammar:
    """One request's grammar: a compile in flight, then the request's matcher.

    Args:
        compiled: the (possibly pending) compiled grammar.
        make_matcher: builds the matcher from the compiled grammar.
    """

    def __init__(
        self,
        compiled: Future,
        make_matcher: Callable[[Any], GrammarMatcher],
        stop_token_ids: Sequence[int] = (),
        gate: ReasoningGate | None = None,
    ) -> None:
        self._compiled = compiled
        self.stop_token_ids = frozenset(stop_token_ids)
        self._make_matcher = make_matcher
        self._matcher: GrammarMatcher | None = None
        # With a reasoning parser: the grammar applies once the reply reaches its answer.
        self.gate = gate

    def _reasoning(self) -> bool:
        return self.gate is not None and not self.gate.in_answer

    def is_ready(self) -> bool:
        """True once compiling ended (successfully or not: see `error`)."""
        return self._compiled.done()

    @property
    def error(self) -> str | None:
        """Why compiling failed, or None (call when ready)."""
        exc = self._compiled.exception()
        return None if exc is None else str(exc)

    @property
    def matcher(self) -> GrammarMatcher:
        """The request's matcher (made on first use; the grammar must be ready)."""
        if self._matcher is None:
            self._matcher = self._make_matcher(self._compiled.result())
        return self._matcher

    def accept_tokens(self, token_ids: list[int]) -> bool:
        """Advance over sampled tokens; False if the grammar refused one. Tokens of the
        reasoning go to the gate instead."""
        gate = self.gate
        while token_ids and gate is not None and not gate.in_answer:
            gate.feed(token_ids[0])
            token_ids = token_ids[1:]
        return self.matcher.accept_tokens(token_ids) if token_ids else True

    def is_terminated(self) -> bool:
        """True once the grammar is complete and a stop token was accepted."""
        return not self._reasoning() and self.matcher.is_terminated()

    def num_valid_tokens(self, token_ids: list[int]) -> int:
        """How many leading `token_ids` (draft tokens) the grammar allows from its
        current state; the state is left unchanged. Drafts in the reasoning are free; those
        after the reasoning's end (looked ahead with a copy of the gate) are checked."""
        if self.gate is not None and not self.gate.in_answer:
            gate = self.gate.clone()
            for index, token_id in enumerate(token_ids):
                gate.feed(token_id)
                if gate.in_answer:
                    return index + 1 + self._num_valid_answer_tokens(token_ids[index + 1:])
            return len(token_ids)
        return self._num_valid_answer_tokens(token_ids)

    def _num_valid_answer_tokens(self, token_ids: list[int]) -> int:
        if not token_ids:
            return 0
        if self.matcher.is_terminated():
            return 0
        count = self.matcher.num_valid_tokens(token_ids)
        # Nothing follows a stop token: keep the drafts up to the first that ends it.
        for index, token_id in enumerate(token_ids[:count]):
            if token_id in self.stop_token_ids:
                return index + 1
        return count

    def fill_bitmask_rows(self, bitmask: torch.Tensor, row: int, drafts: list[int]) -> None:
        """Rows row .. row + len(drafts): the tokens allowed next now, and after each
        prefix of `drafts` (valid ones: see num_valid_tokens); the state is left as is.
        Rows in the reasoning allow everything."""
        if self.gate is not None and not self.gate.in_answer:
            bitmask[row].fill_(-1)
            gate = self.gate.clone()
            for offset, token_id in enumerate(drafts, start=1):
                gate.feed(token_id)
                if gate.in_answer:  # the rest of the drafts are the answer's
                    self._fill_answer_rows(bitmask, row + offset, drafts[offset:])
                    return
                bitmask[row + offset].fill_(-1)
            return
        self._fill_answer_rows(bitmask, row, drafts)

    def _fill_answer_rows(self, bitmask: torch.Tensor, row: int, drafts: list[int]) -> None:
        matcher = self.matcher
        matcher.fill_bitmask(bitmask, row)
        for offset, token_id in enumerate(drafts, start=1):
            accepted = matcher.accept_tokens([token_id])
            assert accepted, "a draft token the grammar refuses was scheduled"
            if matcher.is_terminated():
                # A draft stop token ends the request if accepted: the token after it is
                # never used, so its row allows everything.
                bitmask[row + offset].fill_(-1)
            else:
                matcher.fill_bitmask(bitmask, row + offset)
        if drafts:
            matcher.rollback(len(drafts))


class StructuredOutputManager:
    """Compiles grammars in threads with an LRU cache, and fills each step's bitmask.

    Args:
        load_tokenizer: returns the model's tokenizer (called once, in a compile thread).
        vocab_size: the model's logits width.
        backend: "xgrammar" or "guidance" (llguidance).
        max_workers: compile threads.
        cache_size: compiled grammars kept.
        reasoning_parser: the model's reasoning format: grammars then constrain only the
            answer after the reasoning (reasoning_gate.py).
        enable_in_reasoning: constrain the reasoning too.
    """

    def __init__(
        self,
        load_tokenizer: Callable[[], Any],
        vocab_size: int,
        backend: str = "xgrammar",
        max_workers: int = 2,
        cache_size: int = _DEFAULT_CACHE_SIZE,
        reasoning_parser: str | None = None,
        enable_in_reasoning: bool = False,
    ) -> None:
        self._load_tokenizer = load_tokenizer
        self._tokenizer: Any = None
        # Constrain only the answer after the reasoning (unless enable_in_reasoning).
        self.reasoning_parser: ReasoningParser | None = (
            get_reasoning_parser(reasoning_parser)
            if reasoning_parser is not None and not enable_in_reasoning else None
        )
        self.vocab_size = vocab_size
        self.backend_name = backend
        self._backend: GrammarBackend | None = None
        self._backend_lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._max_workers = max_workers
        self._cache: OrderedDict[tuple[Any, ...], Future] = OrderedDict()
        self._cache_size = cache_size
        self._bitmask: torch.Tensor | None = None

    # ------------------------------------------------------------------- compiling

    def _get_backend(self) -> GrammarBackend:
        with self._backend_lock:
            if self._backend is None:
                self._backend = _load_backend(self.backend_name, self._load_tokenizer(),
                                              self.vocab_size)
            return self._backend

    def _compile(self, params: StructuredOutputsParams) -> Any:
        return self._get_backend().compile(params)

    def grammar_for(
        self, params: StructuredOutputsParams, stop_token_ids: Sequence[int],
        prompt_token_ids: Sequence[int] = (),
    ) -> RequestGrammar:
        """The grammar of a new request: compiled in the background unless cached; with a
        reasoning parser, gated until the reply (after `prompt_token_ids`) reaches its
        answer."""
        key = cache_key(params)
        future = self._cache.get(key)
        if future is None or (future.done() and future.exception() is not None):
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    self._max_workers, thread_name_prefix="pagedllm-grammar"
                )
            future = self._executor.submit(self._compile, params)
            self._cache[key] = future
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        stops = list(stop_token_ids)
        return RequestGrammar(
            future, lambda compiled: self._get_backend().matcher(compiled, stops), stops,
            gate=self._reasoning_gate(prompt_token_ids),
        )

    def _reasoning_gate(self, prompt_token_ids: Sequence[int]) -> ReasoningGate | None:
        parser = self.reasoning_parser
        if parser is None:
            return None
        if self._tokenizer is None:
            self._tokenizer = self._load_tokenizer()
        tokenizer = self._tokenizer

        def decode(token_ids: list[int]) -> str:
            return str(tokenizer.decode(token_ids, skip_special_tokens=False))

        # The prompt's end tells whether its template already closed the reasoning.
        prompt_end = decode(list(prompt_token_ids[-_PROMPT_TAIL_TOKENS:]))
        return ReasoningGate(parser, decode, answer_from_start=parser.ended_in(prompt_end))

    # -------------------------------------------------------------------- each step

    @property
    def in_use(self) -> bool:
        """False until a constrained request arrives (the step loop then skips all this)."""
        return bool(self._cache)

    def grammar_bitmask(
        self, grammars: Sequence[RequestGrammar], drafts: Sequence[list[int]] | None = None
    ) -> torch.Tensor:
        """The tokens each grammar allows next, one row per grammar, or with `drafts`
        (speculative decoding) 1 + len(drafts[i]) rows for grammar i: next, and after each
        prefix of its drafts. A view of a reused buffer."""
        backend = self._get_backend()
        drafts = drafts or [[] for _ in grammars]
        num_rows = sum(len(d) + 1 for d in drafts)
        if self._bitmask is None or self._bitmask.shape[0] < num_rows:
            self._bitmask = backend.allocate_bitmask(max(num_rows, 8))
        bitmask = self._bitmask[:num_rows]
        row = 0
        for grammar, grammar_drafts in zip(grammars, drafts, strict=True):
            grammar.fill_bitmask_rows(bitmask, row, grammar_drafts)
            row += len(grammar_drafts) + 1
        return bitmask

    def shutdown(self) -> None:
        """Stop the compile threads (pending compiles are dropped)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


def _load_backend(name: str, tokenizer: Any, vocab_size: int) -> GrammarBackend:
    """The backend called `name` for `tokenizer` (its library imported here, on first use)."""
    if name == "guidance":
        from pagedllm.structured_output.guidance_backend import GuidanceBackend

        return GuidanceBackend(tokenizer, vocab_size)
    from pagedllm.structured_output.xgrammar_backend import XgrammarBackend

    return XgrammarBackend(tokenizer, vocab_size)

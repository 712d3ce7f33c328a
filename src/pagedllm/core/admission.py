"""Admission checks: the conditions a queued request must meet to join this step.

The scheduler's one admission loop (scheduler.py `_admit`) takes requests from a queue
(admission_queues.py: waiting, swapped, pooling) and asks, in order, the scheduler's
eligibility checks (not preempted this step, grammar compiled, a LoRA slot free), the
queue's own order rules (swapped before waiting unless outranked), and then, from where the
request starts (its prefix-cache hit...), the capacity checks: the token budget, and KV
blocks, which allocate and so come last. The first that does not admit decides. A new
condition (an encoder's budget, remote KV still loading) is a new check in one of the
scheduler's lists, built from its configs.

A check may fill in what admitting the request takes (its token count, its new blocks) on
the `Candidate`; it never changes a request's status or queue.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from pagedllm.config import SchedulerConfig
from pagedllm.core.kv_cache_manager import BlockIds, KVCacheBlocks, KVCacheManager
from pagedllm.core.step_plan import StepPlan
from pagedllm.logger import init_logger
from pagedllm.multimodal.encoder_cache import EncoderPlan, EncoderScheduler
from pagedllm.request import Request, RequestStatus

logger = init_logger(__name__)


class Verdict(enum.Enum):
    """A check's answer about a request this step."""

    # This check lets it run.
    ADMIT = "admit"
    # Not this step: it keeps its place, and later requests may go first (where the queue
    # lets them pass; elsewhere this stops admission like STOP).
    SKIP = "skip"
    # Not this step, and nobody after it from this queue either.
    STOP = "stop"
    # It can never run: it ends now (`Candidate.fail_status`).
    FAIL = "fail"


@dataclass
class Candidate:
    """A request considered for this step, and what admitting it takes.

    Attributes:
        request: the request.
        num_computed_tokens: where it starts: its prefix-cache hit (a waiting request), its
            computed tokens (a swapped one), 0 (a pooling one).
        computed_blocks: its prefix-cache hit's blocks (waiting requests), else None.
        whole: its whole rest must fit this step (pooling; every prompt without chunked
            prefill).
        reserve: budget tokens it must leave to others (pooling leaves one per running
            request).
        num_new_tokens: set by the token budget check.
        new_block_ids: set by the KV blocks check.
        encoder_plan: set by the encoder inputs check (a request with images).
        fail_status: the finished status a FAIL ends it with (set by the check that fails
            it; aborted by default).
        num_external_tokens: tokens a KV connector provides after the prefix-cache hit
            (counted in num_computed_tokens; their blocks are allocated and loaded).
        load_is_async: the connector loads them asynchronously: the request waits for
            them, parked (core/remote_kv.py), instead of running this step.
    """

    request: Request
    num_computed_tokens: int
    computed_blocks: KVCacheBlocks | None = None
    whole: bool = False
    reserve: int = 0
    num_new_tokens: int = 0
    new_block_ids: BlockIds = ()
    encoder_plan: EncoderPlan | None = None
    fail_status: RequestStatus = RequestStatus.FINISHED_ABORTED
    num_external_tokens: int = 0
    load_is_async: bool = False


class AdmissionCheck(ABC):
    """One condition a request must meet to join this step."""

    @abstractmethod
    def check(self, candidate: Candidate, plan: StepPlan) -> Verdict:
        """ADMIT, or why not; may fill in the candidate's token count or blocks."""


class NotPreemptedThisStep(AdmissionCheck):
    """A request preempted in this step waits for the next: re-admitting it now would only
    thrash (and nobody behind it goes first)."""

    def check(self, candidate: Candidate, plan: StepPlan) -> Verdict:
        """STOP for a request preempted this step."""
        preempted = candidate.request.request_id in plan.preempted_ids
        return Verdict.STOP if preempted else Verdict.ADMIT


class GrammarReady(AdmissionCheck):
    """A constrained request waits while its grammar compiles (keeping its place) and fails
    when it did not compile."""

    def check(self, candidate: Candidate, plan: StepPlan) -> Verdict:
        """SKIP while compiling, FAIL on a compile error."""
        grammar = candidate.request.structured_output
        if grammar is None:
            return Verdict.ADMIT
        if not grammar.is_ready():
            return Verdict.SKIP
        if grammar.error is not None:
            logger.error("Request %s: its grammar did not compile: %s",
                         candidate.request.request_id, grammar.error)
            return Verdict.FAIL
        return Verdict.ADMIT


class LoRASlots(AdmissionCheck):
    """At most `max_loras` adapters in one step: a request of one more waits."""

    def __init__(self, max_loras: int) -> None:
        self.max_loras = max_loras

    def fits(self, request: Request, plan: StepPlan) -> bool:
        """True unless `request`'s adapter would be one more than max_loras this step."""
        lora = request.lora_request
        if lora is None or lora.lora_int_id in plan.lora_ids:
            return True
        return len(plan.lora_ids) < self.max_loras

    def check(self, candidate: Candidate, plan: StepPlan) -> Verdict:
        """SKIP when its adapter does not fit."""
        return Verdict.ADMIT if self.fits(candidate.request, plan) else Verdict.SKIP


class TokenBudget(AdmissionCheck):
    """How many tokens the request computes now, within the step's budget (for a prompt
    chunk, the prefill cap's too: StepPlan.budget_for), max_model_len and (without
    chunked prefill, or for a `whole` candidate) all of its rest at once."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.max_model_len = config.max_model_len
        self.chunked = config.enable_chunked_prefill

    def num_tokens(self, request: Request, budget: int, start: int, whole: bool = False) -> int:
        """Tokens `request` computes now from `start` (0: none fits)."""
        num_remaining = request.num_tokens - start
        num_tokens = min(num_remaining, self.max_model_len - start, budget)
        if (whole or not self.chunked) and num_tokens < num_remaining:
            return 0  # its whole rest must fit this step
        return max(0, num_tokens)

    def check(self, candidate: Candidate, plan: StepPlan) -> Verdict:
        """STOP when nothing fits; else the count goes on the candidate."""
        candidate.num_new_tokens = self.num_tokens(
            candidate.request,
            plan.budget_for(candidate.request, candidate.num_computed_tokens, candidate.whole)
            - candidate.reserve,
            candidate.num_computed_tokens, candidate.whole,
        )
        return Verdict.ADMIT if candidate.num_new_tokens > 0 else Verdict.STOP


class EncoderInputs(AdmissionCheck):
    """A request with images computes only as far as the encoder's budget and cache
    allow this step (multimodal/encoder_cache.py): its chunk stops before the first item
    that does not fit, and the items it reads are planned (committed once it runs). Without
    chunked prefill (or for a `whole` candidate) a cut chunk waits for the next step
    instead."""

    def __init__(self, encoder: EncoderScheduler, chunked: bool = True,
                 tokens: TokenBudget | None = None) -> None:
        self.encoder = encoder
        self.chunked = chunked
        self.tokens = tokens  # to retry a chunk the prefill cap cut before an image

    def plan_chunk(self, request: Request, start: int, num_tokens: int, full_budget: int,
                   whole: bool = False) -> EncoderPlan | None:
        """The encoder plan of `request`'s chunk of `num_tokens` from `start` (for a
        waiting candidate and a running request alike), or None for a request without
        encoder inputs. An image that must be computed in one step and that only the
        prefill cap cuts off is planned within the step's `full_budget` instead, or the
        request would wait for as long as requests decode."""
        if not request.mm_features:
            return None
        encoder_plan = self.encoder.plan(request.request_id, request.mm_features, start,
                                         num_tokens)
        if encoder_plan.num_new_tokens or self.tokens is None:
            return encoder_plan
        uncapped = self.tokens.num_tokens(request, full_budget, start, whole)
        if uncapped <= num_tokens:
            return encoder_plan
        return self.encoder.plan(request.request_id, request.mm_features, start, uncapped)

    def check(self, candidate: Candidate, plan: StepPlan) -> Verdict:
        """STOP when not one token fits; else the cut count and the plan go on the
        candidate."""
        encoder_plan = self.plan_chunk(
            candidate.request, candidate.num_computed_tokens, candidate.num_new_tokens,
            plan.token_budget - candidate.reserve, candidate.whole,
        )
        if encoder_plan is None:
            return Verdict.ADMIT
        if encoder_plan.num_new_tokens < candidate.num_new_tokens and (
            candidate.whole or not self.chunked
        ):
            return Verdict.STOP
        candidate.num_new_tokens = encoder_plan.num_new_tokens
        candidate.encoder_plan = encoder_plan
        return Verdict.ADMIT if encoder_plan.num_new_tokens > 0 else Verdict.STOP


class LookaheadSlots:
    """KV slots a request takes past its tokens of a step for a drafter's own KV
    (speculative decoding with a draft model or EAGLE): only when it samples in the step,
    within its final length; freed again after the step (post_step.py)."""

    def __init__(self, num_slots: int, max_model_len: int) -> None:
        self.num_slots = num_slots
        self.max_model_len = max_model_len

    def __call__(self, request: Request, num_new_tokens: int, start: int) -> int:
        """Slots past `num_new_tokens` computed from `start`."""
        if not self.num_slots or request.is_pooling:
            return 0
        end = start + num_new_tokens
        if end < request.num_tokens:
            return 0  # mid-prefill: it samples nothing this step
        final = min(self.max_model_len, request.num_prompt_tokens + request.max_tokens)
        return max(0, min(self.num_slots, final - end))


class KVBlocks(AdmissionCheck):
    """The blocks for the candidate's tokens (plus lookahead slots), allocated now; STOP
    when the cache is full. It allocates, so it is the last check."""

    def __init__(
        self, manager: KVCacheManager, has_kv_cache: bool,
        lookahead: Callable[[Request, int, int], int],
    ) -> None:
        self.manager = manager
        self.has_kv_cache = has_kv_cache
        self.lookahead = lookahead

    def check(self, candidate: Candidate, plan: StepPlan) -> Verdict:
        """Allocate (a model without KV cache takes none)."""
        if not self.has_kv_cache:
            return Verdict.ADMIT
        request, num_tokens = candidate.request, candidate.num_new_tokens
        num_tokens += self.lookahead(request, num_tokens, candidate.num_computed_tokens)
        # A connector's tokens need blocks too (their KV is loaded into them).
        num_tokens += candidate.num_external_tokens
        block_ids = self.manager.allocate_slots(request, num_tokens, candidate.computed_blocks)
        if block_ids is None:
            return Verdict.STOP
        candidate.new_block_ids = block_ids
        return Verdict.ADMIT


def ask(checks: list[AdmissionCheck], candidate: Candidate, plan: StepPlan) -> Verdict:
    """The first verdict among `checks` that does not admit, or ADMIT."""
    for check in checks:
        verdict = check.check(candidate, plan)
        if verdict is not Verdict.ADMIT:
            return verdict
    return Verdict.ADMIT


def check_ever_fits(
    request: Request, config: SchedulerConfig, manager: KVCacheManager, has_kv_cache: bool
) -> None:
    """Refuse, at arrival, a request that could never be admitted: a pooling request is
    computed whole in one step (its prompt must fit the budget and the cache); any other
    must fit the cache alone at its final length (the engine sizes the cache so that one
    of max_model_len does), or it would wait forever.

    Raises:
        ValueError: naming the request and the limit.
    """
    request_id, num_usable = request.request_id, manager.num_usable_blocks
    if request.is_pooling:
        budget = config.max_num_batched_tokens
        if request.num_prompt_tokens > budget:
            raise ValueError(
                f"Pooling request {request_id!r} has {request.num_prompt_tokens} tokens, more "
                f"than max_num_batched_tokens={budget}; it is computed in one step. Raise "
                "max_num_batched_tokens or truncate the input."
            )
        num_blocks = manager.get_num_blocks_needed(request.num_prompt_tokens)
        if has_kv_cache and num_blocks > num_usable:
            raise ValueError(
                f"Pooling request {request_id!r} needs {num_blocks} KV blocks but the cache "
                f"has only {num_usable}."
            )
        return
    final_num_tokens = min(
        request.num_prompt_tokens + request.max_tokens,
        max(config.max_model_len, request.num_prompt_tokens + 1),
    )
    # The last sampled token is never computed.
    num_blocks = manager.get_num_blocks_needed(final_num_tokens - 1)
    if num_blocks > num_usable:
        raise ValueError(
            f"Request {request_id!r} may need {num_blocks} KV blocks but the cache has only "
            f"{num_usable}; give the KV cache more memory or lower max_tokens / max_model_len."
        )

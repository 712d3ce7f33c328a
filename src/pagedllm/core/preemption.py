"""Preemption: taking running requests off the device when KV blocks run out, or when a
waiting request the policy ranks higher needs room.

A victim is swapped out (its blocks copied to host blocks, `preemption_mode="swap"`, when
the host pool has room) or recomputed (its blocks freed, `num_computed_tokens` back to 0,
queued at the front of the waiting queue). Victims come from the running batch's tail
(the newest request; under the priority policy the lowest-priority one). The scheduler
owns the batch and its queues; this part decides and moves requests between them.
"""

from __future__ import annotations

from collections.abc import Callable

from pagedllm.config import SchedulerConfig
from pagedllm.core.kv_cache_manager import BlockIds, KVCacheManager
from pagedllm.core.request_queue import RequestQueue
from pagedllm.core.step_plan import StepPlan
from pagedllm.core.swap_manager import SwapManager
from pagedllm.logger import init_logger
from pagedllm.request import Request, RequestStatus

logger = init_logger(__name__)

# Log the preemption warning on the first preemption and then every this many, as vLLM does,
# so that a thrashing cache does not flood the log.
_PREEMPTION_LOG_INTERVAL = 50


class Preemption:
    """Preempts requests of the scheduler's running batch.

    Args:
        config: the preemption mode.
        manager / swap_manager: the device and host blocks.
        waiting / swapped: the queues victims go to (the waiting one is also the policy).
        on_preempted: the scheduler's bookkeeping for a preempted request (the worker must
            drop its state: it comes back as a new one).
    """

    def __init__(
        self, config: SchedulerConfig, manager: KVCacheManager, swap_manager: SwapManager,
        waiting: RequestQueue, swapped: RequestQueue, on_preempted: Callable[[Request], None],
    ) -> None:
        self.swaps = config.preemption_mode == "swap"
        self.manager = manager
        self.swap_manager = swap_manager
        self.waiting = waiting
        self.swapped = swapped
        self.on_preempted = on_preempted
        self.count = 0

    def allocate_or_preempt(
        self, request: Request, num_new_tokens: int, plan: StepPlan, running: list[Request],
        num_lookahead: int = 0,
    ) -> BlockIds | None:
        """Allocate for `request`, preempting `running`'s tail until it fits.

        Returns the new block ids, or None if `request` itself had to be preempted. The head
        of `running` always fits once everyone else is preempted, because every request
        fits in the cache alone (admission.check_ever_fits), so the head always advances.
        """
        while True:
            new_block_ids = self.manager.allocate_slots(request, num_new_tokens + num_lookahead)
            if new_block_ids is not None:
                return new_block_ids
            victim = running.pop()
            assert victim.request_id not in plan.num_scheduled_tokens, "victim already ran"
            self.preempt(victim, plan)
            plan.num_preempted_running += 1
            if victim is request:
                return None

    def for_waiting(
        self, plan: StepPlan, running: list[Request], can_admit: Callable[[Request], bool]
    ) -> None:
        """Preempt running requests the waiting head outranks until the head fits (only
        the priority policy lets a waiting request outrank a running one)."""
        while self.waiting and running:
            head, victim = self.waiting.peek(), running[-1]
            if not self.waiting.outranks(head, victim) or can_admit(head):
                return
            running.pop()
            self.preempt(victim, plan)

    def preempt(self, request: Request, plan: StepPlan) -> None:
        """Take `request` (already out of the running batch) off the device: swap, else
        recompute."""
        assert request.status == RequestStatus.RUNNING
        request.spec_token_ids = []  # proposed for a step it will not run
        is_swapped = self._swap_out(request, plan)
        if not is_swapped:
            self.manager.free(request)
            request.status = RequestStatus.PREEMPTED
            request.num_computed_tokens = 0
            self.waiting.prepend(request)
        request.num_preemptions += 1
        if self.count % _PREEMPTION_LOG_INTERVAL == 0:
            logger.warning(
                "Sequence group %s is preempted by %s mode because there is not enough KV "
                "cache space. This can hurt end-to-end performance; give the KV cache more "
                "memory or lower max_num_seqs / max_num_batched_tokens. "
                "total_num_cumulative_preemption=%d",
                request.request_id,
                "swap" if is_swapped else "recompute",
                self.count + 1,
            )
        self.count += 1
        plan.preempted_ids.add(request.request_id)
        self.on_preempted(request)

    def _swap_out(self, request: Request, plan: StepPlan) -> bool:
        """Move `request`'s KV to host blocks (swap mode); False if it must recompute."""
        if not self.swaps:
            return False
        # Blocks that left a sliding window are not worth copying.
        self.manager.remove_skipped_blocks(request)
        num_blocks = self.manager.get_num_blocks_held(request.num_computed_tokens)
        block_ids = self.manager.get_block_ids(request.request_id)
        assert sum(len([i for i in t if i]) for t in block_ids) == num_blocks, (
            "a preempted request holds unused blocks"
        )
        if num_blocks == 0 or not self.swap_manager.can_swap_out(num_blocks):
            return False
        pairs = self.swap_manager.swap_out(request.request_id, block_ids)
        plan.blocks_to_swap_out.extend(pairs)
        # Freed device blocks keep their cached hashes; the worker copies them out before
        # this step's forward pass can overwrite them.
        self.manager.free(request)
        request.status = RequestStatus.SWAPPED
        self.swapped.prepend(request)
        return True

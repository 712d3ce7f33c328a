"""Utility calls: EngineCore methods the frontend may call by name, between steps.

A call (`UtilityRequest`) runs on the core's own thread or process, where the core is never
mid-step, and is answered once (`UtilityResult`). Bad input (ValueError) comes back to the
caller as a ValueError with the core's message; any other failure as a RuntimeError. The
core lives on either way.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from pagedllm.engine.protocol import UtilityRequest, UtilityResult

# EngineCore methods the frontend may call by name.
UTILITY_METHODS = frozenset({
    "reset_prefix_cache", "has_unfinished_requests", "add_lora", "remove_lora", "list_loras",
    "dashboard_snapshot", "collective_rpc", "sleep", "wake_up", "is_sleeping",
})


def run_utility(engine_core: Any, call: UtilityRequest) -> UtilityResult:
    """Run `call` on the core; its result, or its error as text."""
    if call.method not in UTILITY_METHODS:
        return UtilityResult(call.call_id, error=f"Unknown utility method {call.method!r}.")
    try:
        return UtilityResult(call.call_id, getattr(engine_core, call.method)(*call.args))
    except Exception as error:  # noqa: BLE001 - the caller gets the error, the core lives
        kind = "ValueError" if isinstance(error, ValueError) else type(error).__name__
        message = str(error) if isinstance(error, ValueError) else repr(error)
        return UtilityResult(call.call_id, error=message, error_type=kind)


def settle(future: Future[Any], result: UtilityResult) -> None:
    """Complete the caller's future with the call's result or error."""
    if result.error is None:
        future.set_result(result.result)
    elif result.error_type == "ValueError":
        future.set_exception(ValueError(result.error))
    else:
        future.set_exception(RuntimeError(result.error))


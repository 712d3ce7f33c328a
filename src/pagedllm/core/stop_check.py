"""Stop conditions the engine core checks on token ids: EOS, stop token ids and lengths.

Stop strings need text and live in the frontend. These functions only read a request's
sampling parameters and token counts and set its finished status; they never touch blocks
or queues. This module must not import torch or anything outside `core/`.
"""

from __future__ import annotations

from pagedllm.request import Request, RequestStatus


def append_and_check_stop(request: Request, token_ids: list[int], max_model_len: int) -> list[int]:
    """Append sampled tokens one by one, stopping at the first that finishes the request.

    Returns:
        The tokens appended (a prefix of `token_ids`).
    """
    appended: list[int] = []
    for token_id in token_ids:
        request.append_output_token_ids([token_id])
        appended.append(token_id)
        if check_stop(request, token_id, max_model_len):
            break
    return appended


def check_stop(request: Request, token_id: int, max_model_len: int) -> bool:
    """Set a finished status if `token_id` (just appended) ends the request."""
    params = request.sampling_params
    if request.num_output_tokens >= params.min_tokens:
        if not params.ignore_eos and token_id == request.eos_token_id:
            request.status = RequestStatus.FINISHED_STOPPED
            return True
        if token_id in (params.stop_token_ids or ()):
            request.status = RequestStatus.FINISHED_STOPPED
            request.stop_reason = token_id
            return True
    if request.num_output_tokens >= request.max_tokens or request.num_tokens >= max_model_len:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False

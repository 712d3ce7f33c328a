"""N-gram prompt lookup: draft tokens copied from earlier in the request's own tokens.

For each request the last n tokens (n from `prompt_lookup_max` down to `prompt_lookup_min`)
are looked up in everything before them; the k tokens that followed their latest earlier
occurrence are proposed (the latest one followed by k tokens, when there is one: inside a
repeated run the very latest occurrence is followed by fewer). Outputs that quote or
rewrite their prompt (code edits, extraction, summaries with citations) are accepted in
long runs; anything else simply gets no drafts.

The lookup is vectorised over the batch: the requests' tokens are laid out as one padded
[B, L] array (kept between steps, grown with the new tokens only) and each n is one pass of
array comparisons, with no Python loop per position.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Padding of the token matrix: never a token id, so it never matches.
_PAD = -1


class NgramProposer:
    """Proposes up to k tokens per request by n-gram lookup in its own history.

    Args:
        num_speculative_tokens: k.
        min_n / max_n: n-gram lengths tried, longest first.
    """

    def __init__(self, num_speculative_tokens: int, min_n: int, max_n: int) -> None:
        self.k = num_speculative_tokens
        self.min_n = min_n
        self.max_n = max_n
        # request id -> its tokens so far (the worker's copy only grows; see `forget`).
        self._tokens: dict[str, np.ndarray] = {}
        self._lengths: dict[str, int] = {}

    def forget(self, request_ids: Sequence[str]) -> None:
        """Drop finished or preempted requests (a resumed one is relearned in full)."""
        for request_id in request_ids:
            self._tokens.pop(request_id, None)
            self._lengths.pop(request_id, None)

    def _history(self, request_id: str, token_ids: Sequence[int]) -> np.ndarray:
        """The request's tokens as an array, appending only what is new since last time."""
        length = self._lengths.get(request_id, 0)
        buffer = self._tokens.get(request_id)
        if buffer is None or length > len(token_ids):
            buffer, length = np.empty(max(64, 2 * len(token_ids)), dtype=np.int64), 0
        if len(token_ids) > len(buffer):
            grown = np.empty(2 * len(token_ids), dtype=np.int64)
            grown[:length] = buffer[:length]
            buffer = grown
        buffer[length : len(token_ids)] = token_ids[length:]
        self._tokens[request_id] = buffer
        self._lengths[request_id] = len(token_ids)
        return buffer[: len(token_ids)]

    def propose(
        self, request_ids: Sequence[str], token_ids: Sequence[Sequence[int]]
    ) -> list[list[int]]:
        """Drafts for each request (possibly none) from its tokens so far."""
        histories = [self._history(r, t) for r, t in zip(request_ids, token_ids, strict=True)]
        return propose_ngram(histories, self.k, self.min_n, self.max_n)


def propose_ngram(
    histories: Sequence[np.ndarray], k: int, min_n: int, max_n: int
) -> list[list[int]]:
    """For each history, the up-to-k tokens after the latest earlier occurrence (followed by
    k tokens if any is) of its longest matching suffix of length in [min_n, max_n]; [] where
    nothing matches."""
    num_rows = len(histories)
    if num_rows == 0:
        return []
    lengths = np.array([len(h) for h in histories], dtype=np.int64)  # [B]
    width = int(lengths.max())
    tokens = np.full((num_rows, width), _PAD, dtype=np.int64)  # [B, L]
    for row, history in enumerate(histories):
        tokens[row, : len(history)] = history
    # Per row: where the proposal starts (the position after the match), -1 while unmatched.
    proposal_start = np.full(num_rows, -1, dtype=np.int64)
    for n in range(max_n, min_n - 1, -1):
        open_rows = (proposal_start < 0) & (lengths > n)
        if not open_rows.any():
            continue
        proposal_start[open_rows] = _latest_match(tokens[open_rows], lengths[open_rows], n, k)
    drafts: list[list[int]] = []
    for row, start in enumerate(proposal_start.tolist()):
        if start < 0:
            drafts.append([])
        else:
            end = min(start + k, int(lengths[row]))
            drafts.append(tokens[row, start:end].tolist())
    return drafts


def _latest_match(tokens: np.ndarray, lengths: np.ndarray, n: int, k: int) -> np.ndarray:
    """Per row: the position just after the latest earlier occurrence of the row's last n
    tokens that is followed by k tokens, else by at least one; -1 if there is none."""
    num_rows, width = tokens.shape
    num_windows = width - n + 1
    suffix_index = lengths[:, None] - n + np.arange(n)[None, :]  # [B, n]
    suffix = np.take_along_axis(tokens, suffix_index, axis=1)  # [B, n]
    matches = np.ones((num_rows, num_windows), dtype=bool)  # window start s matches?
    for offset in range(n):  # n passes over [B, W], not a loop over positions
        matches &= tokens[:, offset : offset + num_windows] == suffix[:, offset : offset + 1]
    # The suffix itself (start = length - n) is not an earlier occurrence.
    starts = np.arange(num_windows)[None, :]
    matches &= starts < (lengths - n)[:, None]
    full: np.ndarray = matches & (starts <= (lengths - n - k)[:, None])
    has_full = np.any(full, axis=1)
    matches = np.where(has_full[:, None], full, matches)
    last = num_windows - 1 - np.argmax(matches[:, ::-1], axis=1)  # [B]
    found = matches[np.arange(num_rows), last]
    return np.where(found, last + n, -1)

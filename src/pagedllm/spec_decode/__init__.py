"""Speculative decoding: proposers of draft tokens and the rejection sampler that verifies them.

The scheduler (core/spec_tokens.py) schedules a request's drafts after its real tokens and
rolls back the rejected ones; the model runner lays a verification step out
(spec_decode/verify.py), verifies the drafts with `RejectionSampler` and asks the proposer
for the next drafts after sampling. Proposers: n-gram lookup in the request's own tokens
(ngram_proposer.py). The configuration is vLLM's `speculative_config` (config.py).

Nothing is imported here: config.py is read by torch-free layers (config, engine args).
"""


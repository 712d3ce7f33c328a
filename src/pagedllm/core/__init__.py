"""Scheduling and KV-block accounting. Pure Python: no torch, no device, no tokenizer."""

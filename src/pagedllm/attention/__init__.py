"""Attention over the paged KV cache: metadata, backends and their registry."""

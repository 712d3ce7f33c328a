"""Every PAGEDLLM_* environment variable, typed and documented, in one place."""

from __future__ import annotations

import os


def cpu_kv_cache_space_bytes() -> int:
    """PAGEDLLM_CPU_KVCACHE_SPACE: default KV cache budget on CPU, in GiB (default 1)."""
    gib = float(os.environ.get("PAGEDLLM_CPU_KVCACHE_SPACE", "1"))
    return int(gib * (1 << 30))


def num_threads() -> int | None:
    """PAGEDLLM_NUM_THREADS: torch intra-op threads on CPU (default: torch's choice)."""
    value = os.environ.get("PAGEDLLM_NUM_THREADS")
    return int(value) if value else None


def api_key() -> str | None:
    """PAGEDLLM_API_KEY: API key the OpenAI server requires when --api-key is not given."""
    return os.environ.get("PAGEDLLM_API_KEY") or None

"""Every PAGEDLLM_* environment variable, typed and documented, in one place.

Nothing else in the package reads `os.environ` for a PAGEDLLM_* name: the functions here
are read at the moment of use, so tests can set a variable with monkeypatch.
"""

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


def cpu_isa() -> str | None:
    """PAGEDLLM_CPU_ISA: force one CPU kernel variant (avx512, avx2_vnni, avx2, neon_dotprod,
    neon or scalar) instead of the best one the CPU runs (kernels/variants.py)."""
    return os.environ.get("PAGEDLLM_CPU_ISA") or None


def cache_dir() -> str:
    """PAGEDLLM_CACHE_DIR: where built kernels (and other caches) are kept (default
    $XDG_CACHE_HOME/pagedllm, i.e. ~/.cache/pagedllm)."""
    root = os.environ.get("PAGEDLLM_CACHE_DIR")
    if root:
        return root
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "pagedllm")


def c_compiler() -> str | None:
    """CC: the C compiler to build the kernels with (default: cc, gcc or clang on PATH)."""
    return os.environ.get("CC") or None


def fused_ops_enabled() -> bool:
    """PAGEDLLM_FUSED_OPS=torch turns the fused C element-wise ops off (default "c")."""
    return os.environ.get("PAGEDLLM_FUSED_OPS", "c") != "torch"


def attention_kernel_enabled() -> bool:
    """PAGEDLLM_ATTENTION_KERNEL=torch makes CPU attention use torch's grouped backend
    instead of the C kernels (default "c")."""
    return os.environ.get("PAGEDLLM_ATTENTION_KERNEL", "c") != "torch"


def attention_backend() -> str | None:
    """PAGEDLLM_ATTENTION_BACKEND: the attention backend by name ("torch" (the reference),
    "torch_grouped", "cpu", "triton"),
    instead of the device's default (unset: the default)."""
    return os.environ.get("PAGEDLLM_ATTENTION_BACKEND") or None


def quantized_matmul() -> str | None:
    """PAGEDLLM_QUANTIZED_MATMUL=triton: quantized layers take the Triton group format
    (layers/quantization/triton_groups.py) on any device Triton runs on (with TRITON_INTERPRET=1
    on CPU: tests); "native" keeps the device's own formats. Unset: Triton on CUDA."""
    value = os.environ.get("PAGEDLLM_QUANTIZED_MATMUL") or None
    if value not in (None, "triton", "native"):
        raise ValueError(f"PAGEDLLM_QUANTIZED_MATMUL must be 'triton' or 'native', got {value!r}.")
    return value


def emulate_cuda_graphs() -> bool:
    """PAGEDLLM_EMULATE_CUDA_GRAPHS=1 builds the decode-graph runner on a device without
    CUDA graphs, replaying by running the forward again on its buffers (tests on CPU)."""
    return os.environ.get("PAGEDLLM_EMULATE_CUDA_GRAPHS", "0") == "1"


def decode_stack_enabled() -> bool:
    """PAGEDLLM_DECODE_STACK=python runs decode steps through the Python layers instead of
    the one-call C decoder stack (default "c")."""
    return os.environ.get("PAGEDLLM_DECODE_STACK", "c") != "python"



def dense_from_tokens() -> int | str:
    """PAGEDLLM_DENSE_FROM_TOKENS: steps of at least this many tokens use the dense bfloat16
    weights instead of W4A8/W8A8 (when keep_dense_weights keeps them); "never" keeps every
    step on W4A8/W8A8; "auto" (the default) measures where dense wins, once per process
    (layers/quantization/crossover.py).

    Returns:
        "auto", "never", or the number of tokens.

    Raises:
        ValueError: for a value that is neither "auto", "never" nor a positive integer.
    """
    value = os.environ.get("PAGEDLLM_DENSE_FROM_TOKENS", "").strip().lower() or "auto"
    if value in ("auto", "never"):
        return value
    if not value.isdigit() or int(value) < 1:
        raise ValueError(
            "PAGEDLLM_DENSE_FROM_TOKENS must be 'auto', 'never' or a positive integer, "
            f"not {value!r}."
        )
    return int(value)


def bf16_panels() -> int | str:
    """PAGEDLLM_BF16_PANELS: where dense bfloat16 weights on CPU run our C kernel
    (layers/quantization/bf16_panels.py): "auto" (the default) measures it against torch's
    matmul once per process, "always" uses it for every step, "never" keeps torch's, a
    positive integer N uses it for steps of up to N tokens (torch's dense copy beyond).

    Raises:
        ValueError: for any other value.
    """
    value = os.environ.get("PAGEDLLM_BF16_PANELS", "").strip().lower() or "auto"
    if value in ("auto", "always", "never"):
        return value
    if not value.isdecimal() or not value.isascii() or int(value) < 1:
        raise ValueError("PAGEDLLM_BF16_PANELS must be 'auto', 'always', 'never' or a "
                         f"positive integer, not {value!r}.")
    return int(value)


def allow_runtime_lora_updating() -> bool:
    """PAGEDLLM_ALLOW_RUNTIME_LORA_UPDATING=true opens POST /v1/load_lora_adapter and
    /v1/unload_lora_adapter on the server (default off, as in vLLM)."""
    value = os.environ.get("PAGEDLLM_ALLOW_RUNTIME_LORA_UPDATING", "")
    return value.strip().lower() in ("1", "true")


def shm_all_reduce() -> bool:
    """PAGEDLLM_SHM_ALL_REDUCE: "0" sends tensor-parallel all-reduces of CPU ranks on one node
    through gloo instead of shared memory (default: shared memory)."""
    return os.environ.get("PAGEDLLM_SHM_ALL_REDUCE", "1") != "0"


def inject_nonfinite_token_id() -> int | None:
    """PAGEDLLM_INJECT_NONFINITE_TOKEN_ID: a fault for tests. Prompt positions holding this
    token id get NaN embeddings, so the requests that contain it produce non-finite logits
    (worker/fault_injection.py). Unset (the default): nothing is injected."""
    value = os.environ.get("PAGEDLLM_INJECT_NONFINITE_TOKEN_ID", "").strip()
    return int(value) if value else None


def max_n_sequences() -> int:
    """PAGEDLLM_MAX_N_SEQUENCES: the largest `n` (and `best_of`) a request may ask for
    (default 16384, vLLM's VLLM_MAX_N_SEQUENCES)."""
    return int(os.environ.get("PAGEDLLM_MAX_N_SEQUENCES", "16384"))


def cpu_kv_cache_prefault() -> bool:
    """PAGEDLLM_CPU_KVCACHE_PREFAULT=1 writes the whole CPU KV cache at start, so its memory
    is resident from the first moment: a container's memory limit is met at start-up, not
    hours into serving, and resident memory stays flat under load. Default off: the pages of
    the cache become resident as blocks are first used (small runs stay small)."""
    return os.environ.get("PAGEDLLM_CPU_KVCACHE_PREFAULT", "").strip().lower() in ("1", "true")


def image_fetch_timeout() -> float:
    """PAGEDLLM_IMAGE_FETCH_TIMEOUT: seconds to wait for an http(s) image (vLLM's
    VLLM_IMAGE_FETCH_TIMEOUT; default 5)."""
    return float(os.environ.get("PAGEDLLM_IMAGE_FETCH_TIMEOUT", "5"))


def media_max_bytes() -> int:
    """PAGEDLLM_MEDIA_MAX_BYTES: the largest image (or video) a URL may give, in bytes
    (default 20 MiB)."""
    return int(os.environ.get("PAGEDLLM_MEDIA_MAX_BYTES", str(20 << 20)))

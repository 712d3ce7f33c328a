"""The CPU platform: the CPU's features and kernel plan, read once, and what follows.

The plan (cpu_plan.py) picks the C kernel variant from the CPU's features (cpu_features.py);
this class loads it once (logging why, or warning what its absence costs) and answers the
engine's questions from it: the "cpu" attention backend where the kernels serve the dtype,
the W4A8 / W8A8 byte kernels for quantized bfloat16 weights (with a vector variant only:
the scalar reference is slower than torch), oneDNN's packed bf16 layout where bf16
matmuls are native, and the one-call decode stack.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from pagedllm import envs
from pagedllm.kernels import build
from pagedllm.kernels.loader import KernelLibrary, load_variant
from pagedllm.kernels.variants import Variant, runnable_variants
from pagedllm.logger import init_logger
from pagedllm.platform.cpu_features import detect
from pagedllm.platform.cpu_plan import CpuPlan, cpu_plan
from pagedllm.platform.interface import Platform

logger = init_logger(__name__)

_NO_KERNELS_COST = (
    "decode of quantized models several times slower, no int8 KV cache writer, attention "
    "on gathered dense copies"
)
# n-gram drafts where bfloat16 matmuls are native (AMX: a batch of 32 verifying its drafts
# ran 1.19x the tokens/s of plain decoding; AVX2: the same batch is compute-bound and ran
# 0.94x, so the config's default of 4 stays there; BENCHMARKS.md).
_NATIVE_BF16_NGRAM_BATCH_LIMIT = 32


class CpuPlatform(Platform):
    """A CPU: C kernels of the variant its features allow, torch ops elsewhere."""

    device_type = "cpu"
    full_sort_is_slow = True
    shares_host_memory = True
    half_precision_native = False

    def __init__(self) -> None:
        self._library: KernelLibrary | None = None
        self._loaded = False

    @property
    def total_store_order(self) -> bool:
        """x86-64: stores become visible to other cores in program order (the shared-memory
        all-reduce's flags rely on it)."""
        return detect().arch == "x86_64"

    @property
    def plan(self) -> CpuPlan:
        """The kernel plan decided from the CPU's features (read once per process)."""
        return cpu_plan()

    def kernel_library(self) -> KernelLibrary | None:
        """The planned variant's library, built and loaded on first use (logged once)."""
        if not self._loaded:
            self._loaded = True
            self._library = self._load_planned()
        return self._library

    def _load_planned(self) -> KernelLibrary | None:
        plan = self.plan
        if plan.variant is None:
            logger.warning(
                "%s. The C kernels are not built, so torch's dense paths run instead (%s). "
                "Install gcc or clang (or set CC) to get them.", plan.reason, _NO_KERNELS_COST,
            )
            return None
        for variant in self._variants_to_try():
            try:
                loaded = load_variant(variant.name)
            except (build.BuildError, OSError) as exc:
                logger.warning("The %s CPU kernels could not be built (%s).", variant.name, exc)
                continue
            openmp = build.supports_openmp(build.find_compiler() or "cc")
            fallback = "" if variant == plan.variant else f" (built {variant.name} instead)"
            logger.info("%s%s%s.", plan.reason, fallback,
                        "" if openmp else " (no OpenMP: one thread)")
            return loaded
        logger.warning("No CPU kernels could be built; torch's dense paths run instead (%s).",
                       _NO_KERNELS_COST)
        return None

    def _variants_to_try(self) -> list[Variant]:
        """The planned variant, then (unless PAGEDLLM_CPU_ISA forced it) the ones below it
        this CPU runs: a compiler too old for one instruction set (gcc < 10 and AVX-512
        BF16) still builds the next."""
        planned = self.plan.variant
        assert planned is not None
        if envs.cpu_isa() is not None:
            return [planned]
        runnable = runnable_variants(detect())
        return runnable[runnable.index(planned):] if planned in runnable else [planned]

    @contextmanager
    def use_kernels(self, library: KernelLibrary | None) -> Iterator[None]:
        """Make `library` (or none) this process's kernels inside the block (tests)."""
        saved = (self._loaded, self._library)
        self._loaded, self._library = True, library
        try:
            yield
        finally:
            self._loaded, self._library = saved

    def runs_triton(self) -> bool:
        """Only in Triton's CPU interpreter (TRITON_INTERPRET: the tests)."""
        from pagedllm.platform.triton import triton_installed, triton_interpreting

        return triton_installed() and triton_interpreting()

    def _default_attention_backend(self, dtype: torch.dtype) -> str:
        return "cpu" if self.attention_kernels(dtype) else "torch_grouped"

    def attention_kernels(self, dtype: torch.dtype) -> bool:
        """The C kernels serve float32 and bfloat16 unless PAGEDLLM_ATTENTION_KERNEL=torch."""
        return (
            envs.attention_kernel_enabled()
            and self.cpu_kernel_dtype(dtype)
            and self.kernel_library() is not None
        )

    def dense_attention_kernel(self, dtype: torch.dtype) -> bool:
        """bfloat16 where the kernels score with the CPU's bf16 dot product (the
        avx512_bf16 variant) and no matrix units run torch's attention GEMMs. Measured
        against scaled_dot_product_attention on CLIP-B/16's shapes: 2.1x faster on AVX-512
        BF16, about even on AVX2 (3.9 against 3.6 ms), 44x slower on the scalar reference;
        AMX was not measured, so torch keeps it."""
        library = self.kernel_library()
        return (
            dtype == torch.bfloat16
            and self.attention_kernels(dtype)
            and library is not None
            and library.variant.name == "avx512_bf16"
            and "amx_bf16" not in detect().flags
        )

    def byte_dot_kernels(self, dtype: torch.dtype) -> bool:
        """bfloat16 models with a vector variant loaded (never the scalar reference)."""
        library = self.kernel_library()
        return dtype == torch.bfloat16 and library is not None and library.variant.simd

    def packs_dense_weights(self, dtype: torch.dtype) -> bool:
        """bfloat16 where oneDNN runs bf16 matmuls natively (elsewhere it refuses or
        emulates them)."""
        return (
            dtype == torch.bfloat16
            and torch.backends.mkldnn.is_available()
            and self.plan.native_bf16
        )

    def measures_dense_crossover(self, dtype: torch.dtype) -> bool:
        """Native bf16 matmuls beside the byte kernels: matrix units (AMX) may win."""
        return self.plan.native_bf16 and self.byte_dot_kernels(dtype)

    def bf16_matrix_units(self) -> bool:
        """Whether the loaded kernels multiply dense bfloat16 panels on matrix units (the
        amx_bf16 variant, where Linux granted the tiles)."""
        library = self.kernel_library()
        return library is not None and bool(library.lib.bf16_matrix_units())

    def fused_ops(self) -> bool:
        """With the kernels built, unless PAGEDLLM_FUSED_OPS=torch."""
        return envs.fused_ops_enabled() and self.kernel_library() is not None

    def lora_kernel(self, dtype: torch.dtype) -> bool:
        """bfloat16 with the kernels built."""
        return dtype == torch.bfloat16 and self.kernel_library() is not None

    def native_bf16_matmuls(self) -> bool:
        """AVX-512 BF16, AMX or Arm's BF16 extension (and torch's oneDNN agrees)."""
        return self.plan.native_bf16

    def decode_step_kind(self) -> str | None:
        """The C decode stack (PAGEDLLM_DECODE_STACK=python: none); with
        PAGEDLLM_EMULATE_CUDA_GRAPHS=1 the graph runner, replayed by rerunning (tests)."""
        if envs.emulate_cuda_graphs():
            return "cuda_graphs"
        return "cpu_stack" if envs.decode_stack_enabled() else None

    def bf16_is_fast(self, quantization: str | None) -> bool:
        """Native bf16 matmuls, or int4 / fp8 weights on the byte kernels (which take bf16
        activations and leave no dense matmul). Logs the plan's reason when not."""
        plan = self.plan
        fast = plan.native_bf16 or (quantization in ("int4", "fp8") and plan.byte_dot_kernels)
        if not fast:
            logger.info(
                "bfloat16 would be emulated here, so dtype auto means float32 (%s).", plan.reason
            )
        return fast

    def runs_checkpoint_codes(self, dtype: str) -> bool:
        """bfloat16 models take a checkpoint's 4-bit codes as int4 groups."""
        return dtype == "bfloat16" or super().runs_checkpoint_codes(dtype)

    def runs_gguf_codes(self) -> bool:
        """Always: the byte kernels or torch's weight-only kernels."""
        return True

    @property
    def default_preemption_mode(self) -> str:
        """Recompute: host and device pools are the same memory here."""
        return "recompute"

    def ngram_batch_limit(self, dtype: str) -> int | None:
        """32 running requests for bfloat16 with native bf16 matmuls."""
        if dtype == "bfloat16" and self.plan.native_bf16:
            return _NATIVE_BF16_NGRAM_BATCH_LIMIT
        return None

    def kv_cache_budget_bytes(self, gpu_memory_utilization: float) -> int:
        """PAGEDLLM_CPU_KVCACHE_SPACE GiB."""
        del gpu_memory_utilization
        return envs.cpu_kv_cache_space_bytes()

    def prefaults_kv_cache(self) -> bool:
        """With PAGEDLLM_CPU_KVCACHE_PREFAULT=1."""
        return envs.cpu_kv_cache_prefault()

    def describe(self) -> str:
        """The plan's reason line."""
        return self.plan.reason

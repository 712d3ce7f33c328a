"""Platform: what one device kind can do, read once, and the choices that follow from it.

vLLM's `current_platform` in our shape: one object per device kind ("cpu", "cuda") holds
the facts (the CPU's features and kernel variant, whether Triton runs, how much memory
there is) and answers every question the engine asks about the hardware: which attention
backend, which kernels serve a weight format (layers/quantization/selection.py turns that
into a linear method), which decode-step fast path the worker builds, and the defaults
`EngineArgs` resolves (dtype speed, preemption mode, KV cache format). No other module
decides anything by device type or CPU capability (tests/platform/test_no_checks_outside.py);
the C kernels' wrappers only assert that a tensor is in host memory, which their C
functions read.

Facts are read once per process; choices that environment variables can steer (a test's
PAGEDLLM_ATTENTION_BACKEND, say) read them when asked, i.e. once per engine load.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from pagedllm import envs

if TYPE_CHECKING:
    import torch

    from pagedllm.kernels.loader import KernelLibrary

# The model dtypes the C attention kernels serve.
_CPU_KERNEL_DTYPES = ("float32", "bfloat16")


class Platform(ABC):
    """One device kind's capabilities and the engine's choices on it.

    The defaults describe a device with none of the special kernels: torch ops throughout.
    """

    device_type: str = "abstract"
    # Host staging buffers are pinned (page-locked) for asynchronous copies to the device.
    pin_memory: bool = False
    # torch.distributed's backend for groups of ranks on this device.
    dist_backend: str = "gloo"
    # Sorting a [B, V] row batch is several times slower than a partial top-k selection:
    # top-p first looks for its cut among the largest candidates (layers/sampler.py).
    full_sort_is_slow: bool = False
    # Tensors live in host memory: ranks can exchange them through shared memory.
    shares_host_memory: bool = False
    # Half-precision matmuls are what the device is built for. Where they are not (CPUs),
    # dtype "auto" turns float16 into bfloat16, an unrecorded dtype into float32, and
    # bfloat16 into float32 unless `bf16_is_fast` says otherwise.
    half_precision_native: bool = True

    # -- facts -------------------------------------------------------------------------

    def kernel_library(self) -> KernelLibrary | None:
        """The C kernel library of this process (CPU), or None."""
        return None

    @abstractmethod
    def runs_triton(self) -> bool:
        """Whether Triton kernels run on this device's tensors."""

    # -- attention -----------------------------------------------------------------------

    def attention_backend(self, dtype: torch.dtype) -> str:
        """The attention backend's name for a model of `dtype` (attention/registry.py).
        PAGEDLLM_ATTENTION_BACKEND names one outright (vLLM's VLLM_ATTENTION_BACKEND)."""
        return envs.attention_backend() or self._default_attention_backend(dtype)

    def _default_attention_backend(self, dtype: torch.dtype) -> str:
        del dtype
        return "torch_grouped"  # torch ops, fast; "torch" is the reference

    def attention_kernels(self, dtype: torch.dtype) -> bool:
        """Whether the C attention kernels (and int8 KV writer) serve `dtype` here."""
        del dtype
        return False

    def dense_attention_kernel(self, dtype: torch.dtype) -> bool:
        """Whether the C dense attention (a vision tower's images) beats torch's
        scaled_dot_product_attention for `dtype` here."""
        del dtype
        return False

    # -- weights -------------------------------------------------------------------------

    def byte_dot_kernels(self, dtype: torch.dtype) -> bool:
        """Whether int4 / int8 weights of a `dtype` model run on the W4A8 / W8A8 C kernels."""
        del dtype
        return False

    def packs_dense_weights(self, dtype: torch.dtype) -> bool:
        """Whether dense weights of `dtype` take oneDNN's packed layout."""
        del dtype
        return False

    def measures_dense_crossover(self, dtype: torch.dtype) -> bool:
        """Whether dense matmuls may beat the byte kernels on large steps here, so the step
        size from which they do is measured at load (layers/quantization/crossover.py)."""
        del dtype
        return False

    def group_weights_on_triton(self) -> bool:
        """Whether quantized weights run as group codes on the Triton kernel here (every
        step: no dense copy). PAGEDLLM_QUANTIZED_MATMUL=triton forces it where Triton runs;
        =native refuses it."""
        choice = envs.quantized_matmul()
        if choice == "triton":
            return self.runs_triton()
        return choice is None and self._triton_groups_by_default()

    def _triton_groups_by_default(self) -> bool:
        return False

    def fused_ops(self) -> bool:
        """Whether the fused bfloat16 element-wise C ops (RMSNorm, RoPE, SiLU) serve here."""
        return False

    def lora_kernel(self, dtype: torch.dtype) -> bool:
        """Whether the C multi-LoRA kernel adds the deltas of a `dtype` model."""
        del dtype
        return False

    def native_bf16_matmuls(self) -> bool:
        """Whether bfloat16 matmuls run in hardware here (not emulated)."""
        return True

    # -- the step ------------------------------------------------------------------------

    def decode_step_kind(self) -> str | None:
        """The decode-step fast path the worker builds here: "cpu_stack" (every layer in
        one C call), "cuda_graphs" (captured forwards), or None."""
        return None

    # -- defaults for EngineArgs ---------------------------------------------------------

    def bf16_is_fast(self, quantization: str | None) -> bool:
        """Whether bfloat16 runs at speed for these weights (dtype "auto" picks it)."""
        del quantization
        return True

    def runs_checkpoint_codes(self, dtype: str) -> bool:
        """Whether a GPTQ / AWQ / compressed-tensors checkpoint's codes run as they are for a
        model of `dtype` (else its layers are dequantized)."""
        del dtype
        return self.group_weights_on_triton()

    def runs_gguf_codes(self) -> bool:
        """Whether a GGUF's quantized weights run quantized here (else dequantized)."""
        return self.group_weights_on_triton()

    def keeps_file_codes(self, quantization: str | None, dtype: torch.dtype) -> bool:
        """Whether the loader hands a GGUF's code tensors to the layers as they are (the
        kernels that run them hold the file's codes exactly)."""
        if quantization not in ("int4", "int8"):
            return False
        return self.group_weights_on_triton() or self.byte_dot_kernels(dtype)

    @property
    @abstractmethod
    def default_preemption_mode(self) -> str:
        """"swap" where device memory is scarce and host copies cheap, else "recompute"."""

    def ngram_batch_limit(self, dtype: str) -> int | None:
        """The most running requests that still get n-gram drafts (None: the config's
        default)."""
        del dtype
        return None

    @abstractmethod
    def kv_cache_budget_bytes(self, gpu_memory_utilization: float) -> int:
        """Bytes the KV cache may take when the user gave no budget."""

    def prefaults_kv_cache(self) -> bool:
        """Whether the KV cache is made resident at start (else pages arrive with use)."""
        return False

    def captures_graphs(self) -> bool:
        """Whether decode steps are captured as real CUDA graphs (else the graph runner
        replays by rerunning the forward: tests on CPU)."""
        return False

    def describe(self) -> str:
        """One line for logs and `python -m pagedllm.platform`."""
        return self.device_type

    @staticmethod
    def dtype_name(dtype: torch.dtype) -> str:
        """"float32" for torch.float32, etc."""
        return str(dtype).removeprefix("torch.")

    def cpu_kernel_dtype(self, dtype: torch.dtype) -> bool:
        """Whether the C kernels take activations of `dtype`."""
        return self.dtype_name(dtype) in _CPU_KERNEL_DTYPES

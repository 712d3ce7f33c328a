"""CrossoverMethod: two methods of one weight, the second from a step size on; and from how
many tokens a step is faster on dense bfloat16 weights than on W4A8, on this CPU.

The W4A8/W8A8 kernels read 4-8 bits per weight, so they win wherever reading weights is
the cost: small steps, and every step on CPUs whose bf16 matmuls are vector instructions
(AVX-512 BF16: 2-3x faster than oneDNN's bf16 at every size, BENCHMARKS.md). A CPU with
matrix units (Intel AMX) multiplies bf16 tiles several times faster than any vector
kernel: there oneDNN's dense matmul beats W4A8 from a few dozen tokens on (2.5-5x at 64 and
more). Which case holds cannot be read from the feature flags alone (ONEDNN_MAX_CPU_ISA, the
kernel a oneDNN version picks, the core count), so it is measured once per process at load:
both matmuls on one 1024 -> 4096 matrix at a few step sizes, about 0.1 s. With a crossover,
quantized linear layers also keep their dense weight (unless keep_dense_weights=False) and
use it for steps of that many tokens or more. PAGEDLLM_DENSE_FROM_TOKENS overrides.

The same shape serves torch's weight-only int4/int8 weights, which win only steps of a few
tokens (weight_only.QUANTIZED_MAX_TOKENS) and keep a dense copy for the rest.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache

import torch

from pagedllm import envs
from pagedllm.layers.quantization.base import LinearMethod
from pagedllm.layers.quantization.byte_dot import quantize_w4a8
from pagedllm.layers.quantization.dense import pack_weight_for_cpu, packed_linear
from pagedllm.logger import init_logger
from pagedllm.platform import cpu_platform

logger = init_logger(__name__)

# Step sizes tried, and the matrix (in, out) timed: the size of a small model's MLP.
CANDIDATE_TOKENS = (8, 16, 32, 64, 128)
_IN_FEATURES, _OUT_FEATURES = 1024, 4096
# Dense must be this much faster to be chosen: keeping the dense copy costs memory, and a
# near-tie is within the measurement's noise.
MARGIN = 1.2
_REPEATS = 5
# The least time a comparison of two matmuls spans (paired_best_times): longer than a
# scheduler's time slice, so another process's burst cannot cover all of one side's runs.
_MIN_SECONDS = 0.02


def choose_dense_from(
    timings: Mapping[int, tuple[float, float]], margin: float = MARGIN
) -> int | None:
    """The smallest step size from which dense wins: `timings[tokens]` is (quantized
    seconds, dense seconds); dense must be `margin` times faster there and at every larger
    size timed. None when it never is."""
    chosen = None
    for tokens in sorted(timings, reverse=True):
        quantized_s, dense_s = timings[tokens]
        if quantized_s < dense_s * margin:
            break
        chosen = tokens
    return chosen


def paired_best_times(
    first: Callable[[], object], second: Callable[[], object],
    min_rounds: int = _REPEATS, min_seconds: float = _MIN_SECONDS,
) -> tuple[float, float]:
    """The best time of each of two calls, timed in turn (first, second, first, ...) for at
    least `min_rounds` rounds and `min_seconds`, after one untimed call of each. Taking them
    in turn over a span of time is what makes the comparison fair on a busy machine: another
    process's burst (a server starting beside the engine) slows both sides alike, where
    timing one side's repeats and then the other's let one preempted run of a small step
    (all its repeats within a time slice) decide against it."""
    first()
    second()
    best = [float("inf"), float("inf")]
    rounds, start = 0, time.perf_counter()
    while rounds < min_rounds or time.perf_counter() - start < min_seconds:
        for index, fn in enumerate((first, second)):
            begin = time.perf_counter()
            fn()
            best[index] = min(best[index], time.perf_counter() - begin)
        rounds += 1
    return best[0], best[1]


def measure_timings() -> dict[int, tuple[float, float]]:
    """(W4A8 seconds, packed dense bf16 seconds) per candidate step size, on this CPU."""
    gen = torch.Generator().manual_seed(0)
    weight = (torch.randn(_OUT_FEATURES, _IN_FEATURES, generator=gen) * 0.05).bfloat16()
    quantized, packed = quantize_w4a8(weight), pack_weight_for_cpu(weight)
    timings = {}
    for tokens in CANDIDATE_TOKENS:
        x = torch.randn(tokens, _IN_FEATURES, generator=gen).bfloat16()
        timings[tokens] = paired_best_times(
            lambda: quantized.matmul(x),  # noqa: B023 (timed right here)
            lambda: packed_linear(x, packed, None),  # noqa: B023
        )
    return timings


@cache
def dense_from_tokens() -> int | None:
    """Steps of at least this many tokens run faster on dense bf16 weights than on W4A8
    here (None: never). Measured once per process unless PAGEDLLM_DENSE_FROM_TOKENS says."""
    setting = envs.dense_from_tokens()
    if setting == "never":
        return None
    if isinstance(setting, int):
        return setting
    if not cpu_platform().measures_dense_crossover(torch.bfloat16):
        return None  # dense bf16 is emulated here, or there is no W4A8 to compare
    timings = measure_timings()
    chosen = choose_dense_from(timings)
    ratios = ", ".join(f"{t}: {q / d:.2f}x" for t, (q, d) in sorted(timings.items()))
    if chosen is None:
        logger.info("W4A8 at least as fast as dense bf16 at every step size (dense speedup "
                    "by tokens %s): quantized weights only.", ratios)
    else:
        logger.info("Dense bf16 matmuls beat W4A8 from %d tokens here (dense speedup by "
                    "tokens %s): quantized layers keep their dense weights for such steps "
                    "(keep_dense_weights=False saves that memory).", chosen, ratios)
    return chosen


@dataclass
class CrossoverMethod(LinearMethod):
    """`small` for steps of at most `max_tokens` rows, `large` for the others: a quantized
    weight beside the dense one where each wins its own step sizes (or bf16 panels beside
    torch's dense weight on matrix units, bf16_panels.py)."""

    small: LinearMethod
    large: LinearMethod
    max_tokens: int

    def __post_init__(self) -> None:
        # dense when both sides are (bf16 panels beside torch's dense weight)
        self.is_dense = self.small.is_dense and self.large.is_dense

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The method this step's row count falls to."""
        method = self.small if x.shape[0] <= self.max_tokens else self.large
        return method.apply(x, bias)

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        """The small method's weight (what decode steps multiply by: the quantized one, or
        the panels)."""
        return self.small.dense(dtype)

    def nbytes(self) -> int:
        """Both methods' bytes."""
        return self.small.nbytes() + self.large.nbytes()

    def quantized_part(self) -> LinearMethod | None:
        """The small method's."""
        return self.small.quantized_part()

    def holds_dense_weight(self) -> bool:
        """Either side's."""
        return self.small.holds_dense_weight() or self.large.holds_dense_weight()

    def input_order(self) -> torch.Tensor | None:
        """The small method's (the dense weight reads the layer's order)."""
        return self.small.input_order()

"""Bf16PanelWeight: dense bfloat16 weights multiplied by our C kernel (csrc/bf16_matmul.c)
on CPU, and the step sizes where it serves instead of torch's matmul.

A bfloat16 model without quantization ran its matrices on oneDNN: fast, but one dispatched
op each, so its decode steps could not run the one-call C decode stack, and a step of a
small model spent as much time between ops as in them. This weight keeps the same values in
panels of 16 output rows that AVX-512 BF16's vdpbf16ps reads directly (the other vector
variants emulate the instruction bit for bit) and that are AMX's B tiles as they lie (the
amx_bf16 variant multiplies them on the matrix unit, in its own arithmetic; an input count
past a multiple of 32 adds its last pairs with vdpbf16ps), so the stack chains these
matrices as it does the quantized ones. Each output row depends on its own token only: a
token's result is the same alone or in any batch, and on every vector ISA.

Where it serves is measured once per process against the dense method the platform would
pick (oneDNN's packed layout where bf16 is native), as crossover.py measures W4A8: every step
where it is about as fast or faster at every size timed (AVX-512 BF16: 1.0-2.2x oneDNN's
packed matmul, BENCHMARKS.md), else none (vector kernels lose to matrix units at large steps;
the emulations lose to native bf16 beyond a few tokens). On matrix units (the amx_bf16
variant) both sides run the same tiles: ours win the small steps (1.0-1.35x, and the decode
stack takes them) and oneDNN's packed layout the large ones (0.8-0.9x ours); there the
panels serve steps up to the largest size they do not lose, and the layer keeps torch's dense weight
beside them for larger steps (twice the weight's memory, as quantized layers' dense copies;
`keep_dense_weights=False` keeps torch's alone). PAGEDLLM_BF16_PANELS overrides ("always":
every step; N: steps of up to N tokens). A quantized layer's large steps (crossover.py: the
sizes where dense bf16 beats W4A8, on matrix units) run as an unquantized layer's, so the
panels serve there too (a third copy beside W4A8 and torch's where the panels stop short of
every step), and the decode stack keeps those steps in its one call. That limit compares
one matrix alone; the worker may raise it where whole steps run faster on the decode stack
than through the layers (worker/decode_step/stack_reach.py, cpu_tables.extend_panels).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch

from pagedllm import envs
from pagedllm.kernels.abi import FMT_BF16
from pagedllm.layers import cpu_ops
from pagedllm.layers.quantization.base import LinearMethod
from pagedllm.layers.quantization.crossover import paired_best_times
from pagedllm.layers.quantization.dense import dense_method
from pagedllm.logger import init_logger
from pagedllm.platform import cpu_platform, get_platform

logger = init_logger(__name__)

# Output rows per panel (one AVX-512 vector of float32 accumulators).
PANEL_ROWS = 16
# Step sizes timed, and the matrix (in, out): a small model's MLP.
CANDIDATE_TOKENS = (1, 8, 32, 64, 128, 512)
_IN_FEATURES, _OUT_FEATURES = 1024, 4096
# Slower than this factor of torch's time counts as a loss: at large steps both run at the
# machine's bf16 rate (1.00-1.05x on AVX-512 BF16), and a tighter bound would let the timings'
# noise decide from one process to the next.
_TIE = 1.10


def pack_panels(weight: torch.Tensor) -> torch.Tensor:
    """`weight` [out, in] bfloat16 as panels [ceil(out / 16), in / 2, 16, 2]: pair j of a
    panel holds its 16 rows' inputs 2j and 2j + 1 side by side (rows past `out` are zero)."""
    out_features, in_features = weight.shape
    panels = -(-out_features // PANEL_ROWS)
    padded = weight.new_zeros(panels * PANEL_ROWS, in_features)
    padded[:out_features] = weight
    return padded.view(panels, PANEL_ROWS, in_features // 2, 2).permute(0, 2, 1, 3).contiguous()


@dataclass
class Bf16PanelWeight(LinearMethod):
    """A dense bfloat16 weight in panels for csrc/bf16_matmul.c (see the module docstring)."""

    is_dense = True  # the weight's own values, multiplied exactly (float32 sums)

    panels: torch.Tensor  # [panels, in / 2, 16, 2] bfloat16
    out_features: int

    @classmethod
    def from_weight(cls, weight: torch.Tensor) -> Bf16PanelWeight:
        """The panels of `weight` [out, in] (bfloat16, `in` even)."""
        return cls(pack_panels(weight), weight.shape[0])

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., in] bfloat16 @ W^T (+ bias, added in bfloat16 as torch adds it)."""
        if x.dtype != torch.bfloat16:
            raise ValueError(f"Bf16PanelWeight takes bfloat16 activations, got {x.dtype}.")
        rows = x.reshape(-1, x.shape[-1])
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        out = cpu_ops.bf16_matmul(rows, self.panels, self.out_features)
        if bias is not None:
            out = out + bias
        return out.view(*x.shape[:-1], self.out_features)

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        """The [out, in] weight, read back from the panels."""
        panels, pairs = self.panels.shape[:2]
        rows = self.panels.permute(0, 2, 1, 3).reshape(panels * PANEL_ROWS, pairs * 2)
        return rows[: self.out_features].to(dtype)

    def nbytes(self) -> int:
        """The panels' bytes."""
        return self.panels.nbytes

    def kernel_format(self) -> int:
        """The kernels' name for this layout (kernels.h FMT_BF16)."""
        return FMT_BF16


@dataclass(frozen=True)
class PanelSteps:
    """Which steps a dense bfloat16 matrix runs as panels: none (`serve` False), every one
    (`max_tokens` None), or those of at most `max_tokens` rows, torch's dense method
    serving the larger ones from a copy beside them."""

    serve: bool
    max_tokens: int | None = None


NO_PANELS, ALL_STEPS = PanelSteps(False), PanelSteps(True)


def panels_win(timings: dict[int, tuple[float, float]]) -> bool:
    """Whether the panels serve every step, from `timings[tokens]` = (panel seconds, dense
    seconds): at every size timed they are no slower than torch's matmul beyond the
    timings' noise (`_TIE`)."""
    return all(panel_s <= dense_s * _TIE for panel_s, dense_s in timings.values())


def choose_panel_steps(timings: dict[int, tuple[float, float]], crossover: bool) -> PanelSteps:
    """Every step where the panels never lose (`panels_win`); else, with `crossover` (matrix
    units: both methods on the same tiles), the steps up to the largest size of the run of
    smallest sizes where they do not lose beyond noise (`_TIE`), else none. A tie there
    still pays for the weight's second copy: one matrix is timed here, but the panels also
    put those steps on the one-call decode stack (the LLaVA-shaped model's 32-request decode
    step: 18.5 ms against 43-45 ms on oneDNN's matmuls and the Python layers, BENCHMARKS.md),
    and the timing of one small matrix swings ±15% between processes."""
    if panels_win(timings):
        return ALL_STEPS
    if not crossover:
        return NO_PANELS
    served = None
    for tokens in sorted(timings):
        panel_s, dense_s = timings[tokens]
        if panel_s > dense_s * _TIE:
            break
        served = tokens
    return NO_PANELS if served is None else PanelSteps(True, served)


def _measure() -> dict[int, tuple[float, float]]:
    """(panel seconds, dense seconds) per candidate step size, on this CPU."""
    gen = torch.Generator().manual_seed(0)
    weight = (torch.randn(_OUT_FEATURES, _IN_FEATURES, generator=gen) * 0.05).bfloat16()
    panels = Bf16PanelWeight.from_weight(weight)
    dense = dense_method(torch.nn.Parameter(weight, requires_grad=False))
    timings = {}
    for tokens in CANDIDATE_TOKENS:
        x = torch.randn(tokens, _IN_FEATURES, generator=gen).bfloat16()
        timings[tokens] = paired_best_times(
            lambda: panels.apply(x, None),  # noqa: B023 (timed right here)
            lambda: dense.apply(x, None),  # noqa: B023
        )
    return timings


@cache
def panel_steps() -> PanelSteps:
    """Which steps this CPU's dense bfloat16 matrices run as panels (measured once per
    process unless PAGEDLLM_BF16_PANELS says; never without a vector kernel variant)."""
    platform = cpu_platform()
    if not platform.byte_dot_kernels(torch.bfloat16):
        return NO_PANELS
    setting = envs.bf16_panels()
    if isinstance(setting, int):
        return PanelSteps(True, setting)
    if setting != "auto":
        return ALL_STEPS if setting == "always" else NO_PANELS
    timings = _measure()
    steps = choose_panel_steps(timings, crossover=platform.bf16_matrix_units())
    ratios = ", ".join(f"{t}: {d / p:.2f}x" for t, (p, d) in sorted(timings.items()))
    chosen = ("no, torch's matmul is faster" if not steps.serve
              else "every step" if steps.max_tokens is None
              else f"steps of up to {steps.max_tokens} tokens (torch's dense copy beyond)")
    logger.info("Dense bf16 matrices on the C kernel: %s (its speedup over torch's matmul by "
                "tokens %s).", chosen, ratios)
    return steps


def panels_serve() -> bool:
    """Whether this CPU's dense bfloat16 matrices run as panels for some steps."""
    return panel_steps().serve


def panels_fit(weight: torch.Tensor) -> bool:
    """Whether `weight` is one the kernel takes: a 2-D bfloat16 tensor with an even number
    of inputs, where its platform has the kernels (a CPU with a vector variant)."""
    return (
        weight.dim() == 2 and weight.shape[1] % 2 == 0
        and get_platform(weight.device).byte_dot_kernels(weight.dtype)
    )

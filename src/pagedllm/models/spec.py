"""What varies between the decoder-only architectures, as plain data.

Every model in this package is the same pre-norm decoder (embedding → layers of attention and
MLP with residual adds → final norm → LM head). A `DecoderSpec` names its dimensions and its
variation points: the norm, per-head q/k norms, the extra "sandwich" norms, the MLP (gated,
plain or mixture of experts) and its activation, the positions (RoPE or learned), the
embedding scale, the final logit soft-cap and, per layer, the attention window and RoPE.
An architecture file maps its HF config onto a spec (and, where its checkpoint names differ,
its tensor names onto ours); `common.py` builds and runs whatever the spec says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pagedllm.layers.rotary import rope_config_of

NormKind = Literal["rms", "rms_one_plus", "layer"]
MlpKind = Literal["gated", "plain"]
Activation = Literal["silu", "gelu_tanh", "gelu", "relu", "quick_gelu"]

# HF `hidden_act` / `activation_function` spellings → our activation names.
_ACTIVATIONS: dict[str, Activation] = {
    "silu": "silu",
    "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
    "quick_gelu": "quick_gelu",
}


def activation_of(name: str) -> Activation:
    """Our name for an HF activation; ValueError for one not built here."""
    if name not in _ACTIVATIONS:
        raise ValueError(
            f"Activation {name!r} is not supported; supported: {', '.join(sorted(_ACTIVATIONS))}."
        )
    return _ACTIVATIONS[name]


@dataclass(frozen=True)
class RopeSpec:
    """Rotary embedding of a layer: base, scaling dict (None: default) and rotated dims."""

    theta: float
    scaling: dict[str, Any] | None = None
    rotary_dim: int | None = None  # None: the whole head
    # M-RoPE (Qwen2-VL): how many of the rotary frequencies follow the temporal, height and
    # width positions; None: one position per token.
    mrope_section: tuple[int, ...] | None = None

    def key(self) -> tuple[Any, ...]:
        """Hashable identity: layers with equal keys share one RotaryEmbedding."""
        scaling = None if self.scaling is None else repr(sorted(self.scaling.items()))
        return (self.theta, scaling, self.rotary_dim, self.mrope_section)


@dataclass(frozen=True)
class MoESpec:
    """A sparse mixture-of-experts MLP.

    Attributes:
        num_experts / top_k: experts per layer and experts each token is routed to.
        intermediate_size: each expert's gated MLP width.
        renormalize: rescale the top-k routing weights to sum to one.
        shared_intermediate_size: width of an always-on shared expert (Qwen2-MoE), gated by
            sigmoid(shared_expert_gate(x)); 0 when there is none.
        sparse_layers: the layers that use the experts (others have the dense MLP).
    """

    num_experts: int
    top_k: int
    intermediate_size: int
    renormalize: bool
    shared_intermediate_size: int = 0
    sparse_layers: frozenset[int] = frozenset()


@dataclass(frozen=True)
class DecoderSpec:
    """Dimensions and variation points of a decoder-only model (see the module doc).

    `layer_windows[i]` is layer i's sliding window (None: full attention) and
    `layer_ropes[i]` its rotary embedding (None for learned positions). Norm, MLP and
    activation names are the Literals above.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    norm_eps: float
    max_position: int
    layer_windows: tuple[int | None, ...]
    layer_ropes: tuple[RopeSpec | None, ...]
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    norm: NormKind = "rms"
    norm_bias: bool = False  # LayerNorm with a bias
    qk_norm: bool = False  # per-head norms of q and k before RoPE (Qwen3, Gemma 3)
    sandwich_norms: bool = False  # norms after attention and after the MLP too (Gemma 3)
    mlp: MlpKind = "gated"
    activation: Activation = "silu"
    learned_positions: bool = False
    position_offset: int = 0  # OPT's position table starts at row 2
    embedding_scale: float | None = None  # Gemma: sqrt(hidden_size)
    attention_scale: float | None = None  # None: head_dim ** -0.5
    final_logit_softcap: float | None = None
    moe: MoESpec | None = None

    @property
    def scale(self) -> float:
        """The softmax scale of attention scores."""
        return self.attention_scale if self.attention_scale is not None else self.head_dim**-0.5

    def is_sparse(self, layer: int) -> bool:
        """True when layer `layer` has the mixture of experts instead of the dense MLP."""
        return self.moe is not None and layer in self.moe.sparse_layers

    @classmethod
    def learned_positions_layernorm(
        cls,
        *,
        vocab_size: int,
        hidden_size: int,
        intermediate_size: int,
        num_layers: int,
        num_heads: int,
        norm_eps: float,
        max_position: int,
        bias: bool,
        tie_word_embeddings: bool,
        activation: Activation,
        position_offset: int = 0,
    ) -> DecoderSpec:
        """GPT-2 / OPT's decoder: LayerNorms with biases, learned positions, no RoPE, full
        multi-head attention everywhere, a plain MLP, biases on every linear (or none)."""
        return cls(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_heads,
            head_dim=hidden_size // num_heads,
            norm_eps=norm_eps,
            max_position=max_position,
            layer_windows=(None,) * num_layers,
            layer_ropes=(None,) * num_layers,
            qkv_bias=bias,
            o_bias=bias,
            mlp_bias=bias,
            tie_word_embeddings=tie_word_embeddings,
            norm="layer",
            norm_bias=True,
            mlp="plain",
            activation=activation,
            learned_positions=True,
            position_offset=position_offset,
        )

    @classmethod
    def from_hf(cls, hf_config: Any, **options: Any) -> DecoderSpec:
        """The common fields of a Llama-like config; `options` sets or overrides the rest."""
        num_heads = hf_config.num_attention_heads
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads
        num_layers = hf_config.num_hidden_layers
        if "layer_ropes" not in options:
            options["layer_ropes"] = (rope_spec_of(hf_config, head_dim),) * num_layers
        options.setdefault("layer_windows", layer_windows_of(hf_config, num_layers))
        options.setdefault(
            "tie_word_embeddings", bool(getattr(hf_config, "tie_word_embeddings", False))
        )
        options.setdefault("activation", activation_of(getattr(hf_config, "hidden_act", "silu")))
        return cls(
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            intermediate_size=hf_config.intermediate_size,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim,
            norm_eps=float(getattr(hf_config, "rms_norm_eps", 1e-6)),
            max_position=int(getattr(hf_config, "max_position_embeddings", 4096)),
            **options,
        )


def rope_spec_of(hf_config: Any, head_dim: int) -> RopeSpec:
    """The config's RoPE (base, scaling, partial rotary dims), the same for every layer."""
    theta, scaling = rope_config_of(hf_config)
    rotary_dim = int(head_dim * getattr(hf_config, "partial_rotary_factor", 1.0))
    return RopeSpec(theta, scaling, rotary_dim if rotary_dim != head_dim else None)


def layer_windows_of(hf_config: Any, num_layers: int) -> tuple[int | None, ...]:
    """Each layer's sliding window, read as transformers does: `sliding_window` applies to
    the layers `layer_types` marks "sliding_attention" (all of them when there is no such
    list), unless `use_sliding_window` is False."""
    window = getattr(hf_config, "sliding_window", None)
    if not isinstance(window, int) or window <= 0:
        return (None,) * num_layers
    if getattr(hf_config, "use_sliding_window", True) is False:
        return (None,) * num_layers
    layer_types = getattr(hf_config, "layer_types", None)
    if not layer_types:
        return (window,) * num_layers
    return tuple(window if kind == "sliding_attention" else None for kind in layer_types)

"""Our models against transformers on the same tiny checkpoints (float32).

Covers full-prompt logits, incremental decoding through the paged cache (a prefill in two
chunks, then one token per step), and batches mixing requests of different lengths.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from pagedllm.attention.torch_paged import TorchPagedBackend
from pagedllm.layers.forward_context import ForwardContext, set_forward_context
from pagedllm.model_loader.hf_config import get_architecture
from pagedllm.models.registry import resolve_model_class

from ..attention.test_torch_paged import make_common_metadata

BLOCK_SIZE = 4
NUM_BLOCKS = 64
ATOL = 1e-4


class PagedRunner:
    """A minimal model runner: per-request block tables, one forward per step."""

    def __init__(self, model: torch.nn.Module, spec_dims: tuple[int, int, int]) -> None:
        num_layers, num_kv_heads, head_dim = spec_dims
        self.model = model
        self.backend = TorchPagedBackend()
        shape = self.backend.get_kv_cache_shape(NUM_BLOCKS, BLOCK_SIZE, num_kv_heads, head_dim)
        self.kv_caches = [torch.zeros(shape) for _ in range(num_layers)]
        # Non-contiguous block ids, never the null block 0.
        self.free_blocks = (
            torch.randperm(NUM_BLOCKS - 1, generator=torch.Generator().manual_seed(0)) + 1
        ).tolist()
        self.block_ids: dict[str, list[int]] = {}
        self.num_computed: dict[str, int] = {}

    def step(self, chunks: list[tuple[str, list[int]]]) -> list[torch.Tensor]:
        """Run one step over (request_id, new token ids); return each chunk's logits."""
        requests, input_ids, positions = [], [], []
        for request_id, token_ids in chunks:
            context_len = self.num_computed.get(request_id, 0)
            blocks = self.block_ids.setdefault(request_id, [])
            while len(blocks) * BLOCK_SIZE < context_len + len(token_ids):
                blocks.append(self.free_blocks.pop())
            requests.append((context_len, len(token_ids), list(blocks)))
            input_ids += token_ids
            positions += range(context_len, context_len + len(token_ids))
            self.num_computed[request_id] = context_len + len(token_ids)
        metadata = self.backend.build_metadata(
            make_common_metadata(requests, BLOCK_SIZE), BLOCK_SIZE
        )
        with (
            torch.no_grad(),
            set_forward_context(ForwardContext(self.backend, metadata, self.kv_caches)),
        ):
            hidden = self.model(torch.tensor(input_ids), torch.tensor(positions))
            logits = self.model.compute_logits(hidden)
        return list(logits.split([len(t) for _, t in chunks]))


@pytest.fixture(scope="session")
def tiny_llama_variant_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama with every bias on (random, not zero) and head_dim != hidden / num_heads."""
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM as HFLlamaForCausalLM

    config = LlamaConfig(
        vocab_size=200, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=24, attention_bias=True,
        mlp_bias=True, max_position_embeddings=256, initializer_range=0.2,
        tie_word_embeddings=False, rope_theta=10000.0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = HFLlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.5)
    out = tmp_path_factory.mktemp("tiny_llama_variant")
    model.save_pretrained(out, safe_serialization=True)
    return out


_GPT2_NORMS = ("ln_1.weight", "ln_2.weight", "ln_f.weight")


def save_random(tmp: Path, config) -> Path:
    """A random transformers model of `config`, with biases and norm weights random too
    (not their 0 / 1 defaults, which would hide a missing bias or a (1 + w) norm)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_(0.0, 0.3)
            elif "norm" in name or name.endswith(_GPT2_NORMS):
                param.normal_(0.5, 0.3)
    model.save_pretrained(tmp, safe_serialization=True)
    return tmp


_COMMON = dict(
    vocab_size=200, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    initializer_range=0.2, tie_word_embeddings=False,
)  # fmt: skip


def arch_config(arch: str, **overrides):
    """The tiny config of each architecture the parity tests cover (`overrides` set
    token ids and vocabulary size for engine tests)."""
    config = _config(arch)
    for name, value in overrides.items():
        setattr(config, name, value)
    return config


def _config(arch: str):
    import transformers as tf

    if arch == "qwen3":
        return tf.Qwen3Config(**_COMMON, head_dim=24)
    if arch == "gemma3":  # a window of 6 < the prompts, one global layer between two sliding
        return tf.Gemma3TextConfig(
            **{**_COMMON, "num_hidden_layers": 3}, head_dim=16, sliding_window=6,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            query_pre_attn_scalar=20, final_logit_softcapping=30.0,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        )  # fmt: skip
    if arch == "mistral_window":
        return tf.MistralConfig(**_COMMON, sliding_window=5)
    if arch == "phi3":
        half = 8  # head_dim 16 / 2
        return tf.Phi3Config(
            **{**_COMMON, "max_position_embeddings": 256}, pad_token_id=0,
            original_max_position_embeddings=64, sliding_window=None,
            rope_scaling={
                "rope_type": "longrope", "short_factor": [1.0 + i / 4 for i in range(half)],
                "long_factor": [2.0 + i for i in range(half)],
            },
        )  # fmt: skip
    if arch == "gpt2":
        return tf.GPT2Config(
            vocab_size=200, n_embd=64, n_layer=2, n_head=4, n_positions=256,
            initializer_range=0.2, bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
    if arch == "opt":
        return tf.OPTConfig(
            vocab_size=200, hidden_size=64, ffn_dim=96, num_hidden_layers=2,
            num_attention_heads=4, word_embed_proj_dim=64, max_position_embeddings=256,
            init_std=0.2, pad_token_id=1, bos_token_id=2, eos_token_id=2,
        )  # fmt: skip
    if arch == "mixtral":
        return tf.MixtralConfig(**_COMMON, num_local_experts=4, num_experts_per_tok=2)
    if arch == "qwen2_moe":  # layer 1 dense: sparse and dense MLPs in one model
        return tf.Qwen2MoeConfig(
            **_COMMON, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, mlp_only_layers=[1],
        )  # fmt: skip
    if arch == "qwen3_moe":
        return tf.Qwen3MoeConfig(
            **_COMMON, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            norm_topk_prob=True, head_dim=16,
        )  # fmt: skip
    raise ValueError(arch)


NEW_ARCHITECTURES = [
    "qwen3", "gemma3", "mistral_window", "phi3", "gpt2", "opt", "mixtral", "qwen2_moe",
    "qwen3_moe",
]  # fmt: skip


@pytest.fixture(scope="session")
def tiny_arch_dirs() -> dict[str, Path]:
    """Tiny random checkpoints of the architectures beyond Llama and Qwen2, by name: each
    made on first use (_arch_dir)."""
    return {}


def _arch_dir(dirs: dict[str, Path], arch: str, factory: pytest.TempPathFactory) -> Path:
    if arch not in dirs:
        dirs[arch] = save_random(factory.mktemp(f"tiny_{arch}"), _config(arch))
    return dirs[arch]


MODELS = ["llama", "llama3", "llama_variant", "qwen2", *NEW_ARCHITECTURES]
_FIXTURES = {
    "llama": "tiny_llama_dir",
    "llama3": "tiny_llama3_dir",
    "llama_variant": "tiny_llama_variant_dir",
    "qwen2": "tiny_qwen2_dir",
}


def load_pair(path: Path):
    """(our model, transformers' model, vocab size) from one checkpoint folder."""
    config = AutoConfig.from_pretrained(path)
    ours = resolve_model_class(get_architecture(config))(config).eval()
    loaded = ours.load_weights(load_file(path / "model.safetensors").items())
    expected = {name for name, _ in ours.named_parameters()}
    if ours.spec.tie_word_embeddings:
        expected = {name for name in expected if not name.startswith("lm_head.")}
    assert loaded == expected
    theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return ours, theirs, config.vocab_size


@pytest.fixture(params=MODELS, scope="module")
def pair(request: pytest.FixtureRequest, tiny_arch_dirs, tmp_path_factory):
    """(our model, transformers' model, vocab size) loaded from the same tiny checkpoint."""
    if request.param in _FIXTURES:
        path = Path(request.getfixturevalue(_FIXTURES[request.param]))
    else:
        path = _arch_dir(tiny_arch_dirs, request.param, tmp_path_factory)
    return load_pair(path)


def _runner(model: torch.nn.Module) -> PagedRunner:
    spec = model.spec
    return PagedRunner(model, (spec.num_layers, spec.num_kv_heads, spec.head_dim))


def _reference_logits(theirs: torch.nn.Module, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return theirs(torch.tensor([token_ids])).logits[0]  # [T, vocab]


def _tokens(vocab_size: int, n: int, seed: int) -> list[int]:
    return torch.randint(
        0, vocab_size, (n,), generator=torch.Generator().manual_seed(seed)
    ).tolist()


def test_full_prompt_logits(pair) -> None:
    ours, theirs, vocab_size = pair
    token_ids = _tokens(vocab_size, 37, seed=1)
    (logits,) = _runner(ours).step([("a", token_ids)])
    torch.testing.assert_close(logits, _reference_logits(theirs, token_ids), atol=ATOL, rtol=1e-4)


def test_chunked_prefill_then_decode(pair) -> None:
    ours, theirs, vocab_size = pair
    token_ids = _tokens(vocab_size, 30, seed=2)
    expected = _reference_logits(theirs, token_ids)
    runner = _runner(ours)
    got = runner.step([("a", token_ids[:9])]) + runner.step([("a", token_ids[9:20])])
    for token in token_ids[20:]:
        got += runner.step([("a", [token])])
    torch.testing.assert_close(torch.cat(got), expected, atol=ATOL, rtol=1e-4)


def test_mixed_batch_equals_requests_run_alone(pair) -> None:
    ours, theirs, vocab_size = pair
    seqs = {
        name: _tokens(vocab_size, n, seed=i)
        for i, (name, n) in enumerate([("a", 14), ("b", 21), ("c", 9)])
    }
    # Per step: (request, [start, end)) chunks; a mix of prefills, a chunked prefill and decodes.
    schedule = [
        [("a", 0, 12), ("b", 0, 5)],
        [("a", 12, 13), ("b", 5, 18), ("c", 0, 8)],
        [("a", 13, 14), ("b", 18, 19), ("c", 8, 9)],
        [("b", 19, 21)],
    ]
    batched = _runner(ours)
    got: dict[str, list[torch.Tensor]] = {name: [] for name in seqs}
    for step in schedule:
        outs = batched.step([(name, seqs[name][s:e]) for name, s, e in step])
        for (name, _, _), logits in zip(step, outs, strict=True):
            got[name].append(logits)
    for name, token_ids in seqs.items():
        alone = _runner(ours)
        expected = [
            alone.step([(n, token_ids[s:e])])[0]
            for step in schedule
            for n, s, e in step
            if n == name
        ]
        torch.testing.assert_close(torch.cat(got[name]), torch.cat(expected), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            torch.cat(got[name]), _reference_logits(theirs, token_ids), atol=ATOL, rtol=1e-4
        )


def test_bfloat16_greedy_matches_float32(pair) -> None:
    """The model runs in bfloat16 (cast by the caller) and stays close to float32."""
    ours, _, vocab_size = pair
    token_ids = _tokens(vocab_size, 16, seed=5)
    (ref,) = _runner(ours).step([("a", token_ids)])
    runner = _runner(copy.deepcopy(ours).to(torch.bfloat16))
    runner.kv_caches = [c.bfloat16() for c in runner.kv_caches]
    (logits,) = runner.step([("a", token_ids)])
    assert logits.dtype == torch.float32  # the LM head refines its top logits in float32
    assert (logits.float().argmax(-1) == ref.argmax(-1)).float().mean() >= 0.8


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe"])
def test_moe_experts_run_on_the_quantized_kernels(arch, tiny_arch_dirs, tmp_path_factory) -> None:
    """int4 on a bfloat16 CPU model: every expert's matrices become W4A8 (the byte
    dot-product kernels), the routers stay dense, and greedy choices stay close to float32
    run with the same int4 values (what is left: bf16 and int8 activations)."""
    from pagedllm.layers import cpu_ops
    from pagedllm.layers.moe import FusedMoE
    from pagedllm.layers.quantization import W4A8Weight
    from pagedllm.model_loader.loader import process_weights_after_loading

    if not cpu_ops.w4a8_available():
        pytest.skip("no C compiler for the W4A8 kernels")
    ours, _, vocab_size = load_pair(_arch_dir(tiny_arch_dirs, arch, tmp_path_factory))
    token_ids = _tokens(vocab_size, 24, seed=7)
    quantized = copy.deepcopy(ours).to(torch.bfloat16)
    process_weights_after_loading(quantized, "int4", keep_dense=False)
    moes = [m for m in quantized.modules() if isinstance(m, FusedMoE)]
    assert moes
    for moe in moes:
        assert moe.gate.quantized is None and moe.gate.keeps_dense
        for expert in moe.experts:
            assert isinstance(expert.gate_up_proj.quantized, W4A8Weight)
            assert isinstance(expert.down_proj.quantized, W4A8Weight)
    reference = copy.deepcopy(ours)  # float32 with every int4 weight's own values
    float_modules = dict(reference.named_modules())
    for name, module in quantized.named_modules():
        weight = getattr(module, "quantized", None)
        if isinstance(weight, W4A8Weight) and not name.startswith("lm_head"):
            float_modules[name].weight.data = weight.dense(torch.float32)
    (ref,) = _runner(reference).step([("a", token_ids)])
    runner = _runner(quantized)
    runner.kv_caches = [c.bfloat16() for c in runner.kv_caches]
    (logits,) = runner.step([("a", token_ids)])
    assert (logits.float().argmax(-1) == ref.argmax(-1)).float().mean() >= 0.8


# Which architectures the one-call C decode stack serves once int4 on bfloat16 (the rest would
# run the Python layers; worker/decode_step/cpu_stack_layers.py says what the C loop takes):
# all, the tiny Qwen2-MoE's shared expert included, whose 48 inputs are no multiple of the
# 32-value groups: its down projection stays dense, as bf16 panels (PAGEDLLM_BF16_PANELS on).
_DECODE_STACK_SERVES = set(MODELS)


@pytest.mark.parametrize("arch", MODELS)
def test_which_architectures_the_cpu_decode_stack_serves(
    arch, request, tiny_arch_dirs, tmp_path_factory, bf16_panels
) -> None:
    """Pins the path each architecture's decode steps take (C stack or Python layers)."""
    from pagedllm.layers import cpu_ops
    from pagedllm.model_loader.loader import process_weights_after_loading
    from pagedllm.worker.decode_step.cpu_stack import serves_model

    if not cpu_ops.w4a8_available():
        pytest.skip("no C compiler for the kernels")
    bf16_panels("always")
    if arch in _FIXTURES:
        path = Path(request.getfixturevalue(_FIXTURES[arch]))
    else:
        path = _arch_dir(tiny_arch_dirs, arch, tmp_path_factory)
    config = AutoConfig.from_pretrained(path)
    model = resolve_model_class(get_architecture(config))(config).eval()
    model.load_weights(load_file(path / "model.safetensors").items())
    for param in model.parameters():  # as the loader casts: buffers (RoPE tables) stay
        param.data = param.data.to(torch.bfloat16)
    process_weights_after_loading(model, "int4", keep_dense=False)
    assert serves_model(model) == (arch in _DECODE_STACK_SERVES)

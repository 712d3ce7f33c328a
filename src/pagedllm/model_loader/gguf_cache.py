"""What is slow to derive from a GGUF file, derived once per file and kept on disk.

Reading a GGUF's metadata with the `gguf` package parses every vocabulary string one by one
(1.8 s for SmolLM2's 49k tokens and merges), and transformers does it again for the config
and again for the tokenizer. So each is made once per file under
`$PAGEDLLM_CACHE_DIR/gguf/<key>/`: `config/` and `tokenizer/`, transformers' conversions
saved as HF folders (the GGUF's chat template included), and `gguf_index.json`, the tensors'
names, types, shapes and byte offsets with the metadata the weight loader needs. Later loads
read those small files and the tensors' bytes and never parse the metadata (a warm load of
the default model: 11.6 s before, 2.0 s now).

The key is the file's resolved path, size and modification time, the transformers version
and this module's format version: a changed file gets new entries. Each entry is built in
a temporary name and renamed, so concurrent loaders never see half of one; when the cache
cannot be written the conversion is made in a temporary folder each time.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pagedllm import envs
from pagedllm.logger import init_logger
from pagedllm.model_loader.gguf_chat_templates import FALLBACK_CHAT_TEMPLATES

logger = init_logger(__name__)

_FORMAT_VERSION = 4
_INDEX_FILE = "gguf_index.json"
_CHAT_TEMPLATE_KEY = "tokenizer.chat_template"
# Metadata keys the weight loader reads, by their suffix after "<architecture>.".
_WEIGHT_METADATA = ("attention.head_count", "attention.head_count_kv")


@dataclass(frozen=True)
class GgufTensorInfo:
    """Where one tensor's bytes are and how to read them.

    Attributes:
        name: llama.cpp's tensor name ("blk.0.attn_q.weight").
        type_name: its GGML type ("Q4_1", "F32", ...).
        shape: dimensions as GGUF lists them (innermost first).
        offset: absolute byte offset of its data in the file.
        n_bytes: size of its data.
        data_dtype / data_shape: the numpy view of the raw data (uint8 blocks per row for
            quantized types), as `gguf.quants.dequantize` takes it.
    """

    name: str
    type_name: str
    shape: tuple[int, ...]
    offset: int
    n_bytes: int
    data_dtype: str
    data_shape: tuple[int, ...]


@dataclass(frozen=True)
class GgufIndex:
    """A GGUF file's tensors and the metadata needed to load them."""

    architecture: str
    metadata: dict[str, Any]
    tensors: tuple[GgufTensorInfo, ...]


def _cache_key(path: Path) -> str:
    import transformers

    stat = path.stat()
    text = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    return hashlib.sha256(f"{text}|{_FORMAT_VERSION}".encode()).hexdigest()[:20]


def _field(reader: Any, key: str) -> Any:
    field = reader.get_field(key)
    return None if field is None else field.contents()


def _build_index(reader: Any) -> GgufIndex:
    architecture = str(_field(reader, "general.architecture"))
    metadata = {key: _field(reader, f"{architecture}.{key}") for key in _WEIGHT_METADATA}
    tensors = tuple(
        GgufTensorInfo(
            name=t.name, type_name=t.tensor_type.name,
            shape=tuple(int(d) for d in t.shape.tolist()), offset=int(t.data_offset),
            n_bytes=int(t.n_bytes), data_dtype=t.data.dtype.str,
            data_shape=tuple(int(d) for d in t.data.shape),
        )
        for t in reader.tensors
    )
    return GgufIndex(architecture, metadata, tensors)


def _convert_config(path: Path, folder: Path) -> None:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    if config.model_type in ("qwen2_moe", "qwen3_moe"):
        _complete_moe_config(config, path)
    elif config.model_type == "llama":
        config = _mixtral_config_if_experts(config, path)
    elif config.model_type == "gpt2":
        _complete_gpt2_config(config, path)
    if config.model_type != "gpt2":
        _complete_head_dim(config, path)
    config.save_pretrained(folder)


def _complete_head_dim(config: Any, path: Path) -> None:
    """The file's per-head width (`<arch>.attention.key_length`), which transformers'
    conversion drops for some architectures (Qwen3's config then falls back to its default
    128, and a file of any other head width fails to load)."""
    import gguf

    reader = gguf.GGUFReader(path)
    arch = str(_field(reader, "general.architecture"))
    key_length = _field(reader, f"{arch}.attention.key_length")
    if key_length is not None:
        config.head_dim = int(key_length)


def _complete_gpt2_config(config: Any, path: Path) -> None:
    """transformers maps a GPT-2 file's context length to n_ctx, its MLP width to an
    attribute GPT-2 does not read, and its vocabulary size only from a tokenizer: the
    position table, n_inner and the vocabulary come from the file's tensors."""
    import gguf

    reader = gguf.GGUFReader(path)
    rows = {t.name: int(t.shape[-1]) for t in reader.tensors}
    config.n_positions = rows.get("position_embd.weight", config.n_ctx)
    config.vocab_size = rows.get("token_embd.weight", config.vocab_size)
    config.n_inner = getattr(config, "feed_forward_length", None) or config.n_inner


def _mixtral_config_if_experts(config: Any, path: Path) -> Any:
    """llama.cpp writes Mixtral as "llama" with experts, which transformers reads as a
    dense Llama: such a file gets a Mixtral config (the same fields plus the experts)."""
    import gguf
    from transformers import MixtralConfig

    reader = gguf.GGUFReader(path)
    num_experts = _field(reader, "llama.expert_count")
    if not num_experts:
        return config
    fields = config.to_dict()
    fields.update(
        model_type="mixtral",
        architectures=["MixtralForCausalLM"],
        num_local_experts=int(num_experts),
        num_experts_per_tok=int(_field(reader, "llama.expert_used_count")),
    )
    return MixtralConfig.from_dict(fields)


def _complete_moe_config(config: Any, path: Path) -> None:
    """Fill in what transformers' GGUF conversion leaves at its defaults for Qwen MoE files:
    the expert sizes, which layers are dense, and top-k renormalization as llama.cpp does
    it (Qwen3-MoE renormalizes, Qwen2-MoE does not)."""
    import gguf

    reader = gguf.GGUFReader(path)
    arch = str(_field(reader, "general.architecture"))
    expert_size = _field(reader, f"{arch}.expert_feed_forward_length")
    if expert_size is not None:
        config.moe_intermediate_size = int(expert_size)
    shared_size = _field(reader, f"{arch}.expert_shared_feed_forward_length")
    if shared_size is not None:
        config.shared_expert_intermediate_size = int(shared_size)
    sparse = {int(t.name.split(".")[1]) for t in reader.tensors if "ffn_gate_exps" in t.name}
    config.decoder_sparse_step = 1
    config.mlp_only_layers = [i for i in range(config.num_hidden_layers) if i not in sparse]
    config.norm_topk_prob = arch == "qwen3moe"


def _convert_tokenizer(path: Path, folder: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    if not getattr(tokenizer, "chat_template", None):  # transformers may not carry it over
        import gguf

        reader = gguf.GGUFReader(path)
        template = _field(reader, _CHAT_TEMPLATE_KEY)
        if not template:  # none in the file: the family's own, where known
            architecture = str(_field(reader, "general.architecture"))
            template = FALLBACK_CHAT_TEMPLATES.get(architecture)
        if template:
            tokenizer.chat_template = str(template)
    tokenizer.save_pretrained(folder)


def _file_folder(path: Path) -> Path:
    return Path(envs.cache_dir()) / "gguf" / _cache_key(path)


def _cached_folder(path: Path, part: str, convert: Callable[[Path, Path], None]) -> Path:
    """The folder `part` of the file's cache, made by `convert(path, folder)` on first use."""
    folder = _file_folder(path) / part
    done = folder / ".complete"
    if done.is_file():
        return folder
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=folder.parent))
    except OSError as exc:  # a read-only cache: convert into a folder of our own each time
        logger.warning("GGUF conversion cache not writable (%s); converting each time.", exc)
        staging = Path(tempfile.mkdtemp())
        convert(path, staging)
        return staging
    try:
        convert(path, staging)
        (staging / ".complete").touch()
        os.replace(staging, folder)
    except OSError:
        if not done.is_file():  # not another loader's rename winning
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def config_folder(gguf_path: str | os.PathLike[str]) -> Path:
    """An HF folder with transformers' config of the GGUF file (converted once)."""
    return _cached_folder(Path(gguf_path), "config", _convert_config)


def tokenizer_folder(gguf_path: str | os.PathLike[str]) -> Path:
    """An HF folder with transformers' tokenizer of the GGUF file, its chat template
    included (converted once)."""
    return _cached_folder(Path(gguf_path), "tokenizer", _convert_tokenizer)


def load_index(gguf_path: str | os.PathLike[str]) -> GgufIndex:
    """The tensor index of a GGUF file, read from the cache or built (and cached) once."""
    path = Path(gguf_path)
    target = _file_folder(path) / _INDEX_FILE
    if target.is_file():
        data = json.loads(target.read_text())
        tensors = tuple(
            GgufTensorInfo(
                **{**t, "shape": tuple(t["shape"]), "data_shape": tuple(t["data_shape"])}
            )
            for t in data["tensors"]
        )
        return GgufIndex(data["architecture"], data["metadata"], tensors)
    import gguf

    index = _build_index(gguf.GGUFReader(path))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=target.parent, delete=False) as f:
            f.write(json.dumps(asdict(index)))
        os.replace(f.name, target)
    except OSError as exc:
        logger.warning("GGUF index not cached (%s).", exc)
    return index

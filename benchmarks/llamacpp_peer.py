"""llama.cpp as a peer: llama-cpp-python on the same GGUF file, greedy, EOS ignored.

Two ways of running it, both fed token ids (never text), so llama.cpp sees exactly the
prompts every other system sees:

- `BatchedDecoder`: the low-level C bindings. One context holds `n_seq` sequences (n_seq_max),
  each with its own KV stream; prompts are packed into `llama_decode` calls of at most
  `n_batch` tokens, then every sequence advances one token per `llama_decode` call. Greedy is
  the argmax of each sequence's logits row. This is llama.cpp's multi-sequence batching, as
  in its batched and parallel examples, and its best offline configuration.
- `SequentialLlama`: the high-level `Llama` class, one prompt after another, with its greedy
  sampler. The baseline a plain llama-cpp-python user gets.

llama-cpp-python is optional (`pip install llama-cpp-python==0.3.36`); nothing here imports it
until a runner is built.
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
from common import comma_list, positive_int_list

INSTALL_HINT = (
    "pip install llama-cpp-python==0.3.36   (it compiles llama.cpp from source: several "
    "minutes on 2 cores; or pip install -e '.[bench]', which includes it)"
)
FLASH_ATTN = ("on", "off")
MODES = ("batched", "sequential")
# llama.cpp sizes KV caches in multiples of 256 cells; asking for a multiple avoids padding.
CONTEXT_ROUNDING = 256

_backend_ready = False


def import_llama_cpp() -> ModuleType:
    """Import llama_cpp with its C logging quieted and the backend initialized once.

    Exits with the install command when llama-cpp-python is missing.
    """
    global _backend_ready
    try:
        import llama_cpp
    except ImportError as error:
        message = f"llama.cpp peer unavailable ({error}). Install it with:\n  {INSTALL_HINT}"
        raise SystemExit(message) from error
    # llama-cpp-python forwards every llama.cpp log line to this logger; its default level
    # (NOTSET) prints all of them, which buries the benchmark's own output.
    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
    if not _backend_ready:
        llama_cpp.llama_backend_init()
        _backend_ready = True
    return llama_cpp


def llama_cpp_system_info() -> str | None:
    """llama.cpp's own report of the instruction sets its build uses ("AVX2 = 1 | AVX512 =
    0 | ..."), or None when it is not installed: which ISA the peer really ran."""
    try:
        import llama_cpp
    except ImportError:
        return None
    info = llama_cpp.llama_print_system_info()
    return info.decode() if isinstance(info, bytes) else str(info)


def llama_cpp_version() -> str | None:
    """llama-cpp-python's version, or None when it is not installed."""
    try:
        import llama_cpp
    except ImportError:
        return None
    return str(llama_cpp.__version__)


def context_per_sequence(max_prompt_len: int, output_len: int) -> int:
    """KV cells one sequence needs (prompt + output), rounded up to llama.cpp's granularity."""
    need = max_prompt_len + output_len
    return -(-need // CONTEXT_ROUNDING) * CONTEXT_ROUNDING


@dataclass(frozen=True)
class LlamaCppSettings:
    """How llama.cpp runs, the same for every configuration of one benchmark run.

    Attributes:
        n_threads: threads for decode steps and for prompt batches (n_threads_batch).
        n_batch: most tokens per llama_decode call (prompts are fed in chunks of this).
        n_ubatch: most tokens llama.cpp computes at once inside one llama_decode call.
        kv_unified: one KV buffer shared by all sequences instead of one stream each.
    """

    n_threads: int
    n_batch: int
    n_ubatch: int
    kv_unified: bool = False


@dataclass
class Wave:
    """One group of sequences generated together (times from time.perf_counter).

    Attributes:
        start: before the first prompt token was fed.
        first_token_at: when every sequence of the group had its first output token.
        end: after the last output token.
        tokens: the tokens generated for each prompt, in prompt order.
    """

    start: float
    first_token_at: float
    end: float
    tokens: list[list[int]]


class LlamaCppModel:
    """A GGUF model loaded once through the low-level bindings; contexts are made from it."""

    def __init__(self, path: str) -> None:
        self.lib = import_llama_cpp()
        params = self.lib.llama_model_default_params()
        params.n_gpu_layers = 0  # CPU, as every system in these benchmarks
        self.model = self.lib.llama_model_load_from_file(path.encode(), params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        vocab = self.lib.llama_model_get_vocab(self.model)
        self.n_vocab = int(self.lib.llama_vocab_n_tokens(vocab))

    def close(self) -> None:
        """Free the model (contexts made from it must be closed first)."""
        if self.model:
            self.lib.llama_model_free(self.model)
            self.model = None


class BatchedDecoder:
    """A llama.cpp context that generates greedily for up to `n_seq` sequences at once."""

    def __init__(
        self,
        model: LlamaCppModel,
        settings: LlamaCppSettings,
        flash_attn: bool,
        n_seq: int,
        n_ctx_seq: int,
    ) -> None:
        self.lib = model.lib
        self.n_vocab = model.n_vocab
        self.n_seq = n_seq
        self.n_batch = settings.n_batch
        self.ctx = self._new_context(model, settings, flash_attn, n_seq, n_ctx_seq)
        self.batch = self.lib.llama_batch_init(self.n_batch, 0, 1)
        # Writable numpy views of the batch's C arrays, so a chunk is filled in a few slices.
        shape = (self.n_batch,)
        self._token = np.ctypeslib.as_array(self.batch.token, shape=shape)
        self._pos = np.ctypeslib.as_array(self.batch.pos, shape=shape)
        self._logits = np.ctypeslib.as_array(self.batch.logits, shape=shape)
        np.ctypeslib.as_array(self.batch.n_seq_id, shape=shape)[:] = 1
        # seq_id[i] is a separate allocation per slot; remember what each slot holds so a
        # decode step (the same sequence in the same slot every time) rewrites nothing.
        self._slot_seq = [-1] * self.n_batch

    def _new_context(
        self,
        model: LlamaCppModel,
        settings: LlamaCppSettings,
        flash_attn: bool,
        n_seq: int,
        n_ctx_seq: int,
    ) -> Any:
        """A context with room for `n_seq` sequences of `n_ctx_seq` tokens each."""
        lib = self.lib
        params = lib.llama_context_default_params()
        params.n_ctx = n_ctx_seq * n_seq
        params.n_batch = settings.n_batch
        params.n_ubatch = min(settings.n_ubatch, settings.n_batch)
        params.n_seq_max = n_seq
        params.n_threads = settings.n_threads
        params.n_threads_batch = settings.n_threads
        params.kv_unified = settings.kv_unified
        params.flash_attn_type = (
            lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        params.no_perf = True
        ctx = lib.llama_init_from_model(model.model, params)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not create a context (n_seq={n_seq}).")
        if lib.llama_n_ctx_seq(ctx) < n_ctx_seq:
            lib.llama_free(ctx)
            raise RuntimeError("llama.cpp gave each sequence less context than asked for.")
        return ctx

    def close(self) -> None:
        """Free the batch and the context."""
        if self.ctx:
            self.lib.llama_batch_free(self.batch)
            self.lib.llama_free(self.ctx)
            self.ctx = None

    def generate(self, prompts: list[list[int]], output_len: int) -> list[Wave]:
        """Exactly `output_len` greedy tokens per prompt, `n_seq` prompts at a time."""
        return [
            self._generate_wave(prompts[i : i + self.n_seq], output_len)
            for i in range(0, len(prompts), self.n_seq)
        ]

    def _generate_wave(self, prompts: list[list[int]], output_len: int) -> Wave:
        """Prefill every prompt of the group, then decode them together, one token a step."""
        self.lib.llama_memory_clear(self.lib.llama_get_memory(self.ctx), True)
        start = time.perf_counter()
        next_tokens = self._prefill(prompts)
        first_token_at = time.perf_counter()
        outputs = [[int(t)] for t in next_tokens]
        seqs = np.arange(len(prompts), dtype=np.int32)
        positions = np.array([len(p) for p in prompts], dtype=np.int32)
        wants = np.ones(len(prompts), dtype=np.int8)
        for _ in range(output_len - 1):
            # EOS is never checked: every sequence runs to exactly output_len tokens.
            next_tokens = self._decode(next_tokens, positions, seqs, wants)
            positions += 1
            for out, tok in zip(outputs, next_tokens.tolist(), strict=True):
                out.append(tok)
        return Wave(start, first_token_at, time.perf_counter(), outputs)

    def _prefill(self, prompts: list[list[int]]) -> np.ndarray:
        """Feed all prompts (packed, chunks of n_batch); return each one's first token."""
        tokens = np.concatenate([np.asarray(p, dtype=np.int32) for p in prompts])
        positions = np.concatenate([np.arange(len(p), dtype=np.int32) for p in prompts])
        seqs = np.concatenate([np.full(len(p), s, dtype=np.int32) for s, p in enumerate(prompts)])
        wants = np.zeros(len(tokens), dtype=np.int8)
        wants[np.cumsum([len(p) for p in prompts]) - 1] = 1  # logits of each last token
        return self._decode(tokens, positions, seqs, wants)

    def _decode(
        self, tokens: np.ndarray, positions: np.ndarray, seqs: np.ndarray, wants: np.ndarray
    ) -> np.ndarray:
        """Run the tokens through llama_decode in chunks of n_batch; argmax of wanted rows."""
        picks = []
        for lo in range(0, len(tokens), self.n_batch):
            hi = min(lo + self.n_batch, len(tokens))
            self._fill(tokens[lo:hi], positions[lo:hi], seqs[lo:hi], wants[lo:hi])
            status = self.lib.llama_decode(self.ctx, self.batch)
            if status != 0:
                raise RuntimeError(f"llama_decode returned {status}")
            n_out = int(wants[lo:hi].sum())
            if n_out:
                # Output rows are stored contiguously in batch order (llama.h).
                logits = self.lib.llama_get_logits(self.ctx)
                rows = np.ctypeslib.as_array(logits, shape=(n_out, self.n_vocab))
                picks.append(rows.argmax(axis=1).astype(np.int32))
        return np.concatenate(picks) if picks else np.empty(0, dtype=np.int32)

    def _fill(
        self, tokens: np.ndarray, positions: np.ndarray, seqs: np.ndarray, wants: np.ndarray
    ) -> None:
        """Write one chunk into the llama_batch."""
        n = len(tokens)
        self._token[:n] = tokens
        self._pos[:n] = positions
        self._logits[:n] = wants
        for slot, seq in enumerate(seqs.tolist()):
            if self._slot_seq[slot] != seq:
                self.batch.seq_id[slot][0] = seq
                self._slot_seq[slot] = seq
        self.batch.n_tokens = n


class SequentialLlama:
    """llama-cpp-python's high-level `Llama`: one prompt after another, greedy sampler."""

    def __init__(self, path: str, settings: LlamaCppSettings, flash_attn: bool, n_ctx: int) -> None:
        import_llama_cpp()
        from llama_cpp import Llama

        self.llm = Llama(
            model_path=path,
            n_ctx=n_ctx,
            n_batch=settings.n_batch,
            n_ubatch=settings.n_ubatch,
            n_threads=settings.n_threads,
            n_threads_batch=settings.n_threads,
            flash_attn=flash_attn,
            n_gpu_layers=0,
            verbose=False,
        )

    def close(self) -> None:
        """Free the model and its context."""
        self.llm.close()

    def generate(self, prompts: list[list[int]], output_len: int) -> list[Wave]:
        """Exactly `output_len` greedy tokens for each prompt in turn (a Wave per prompt)."""
        return [self._generate_one(p, output_len) for p in prompts]

    def _generate_one(self, prompt: list[int], output_len: int) -> Wave:
        # reset() empties the context's token history, so generate() cannot reuse a cached
        # prefix of the previous prompt: every prompt is evaluated in full.
        self.llm.reset()
        start = time.perf_counter()
        first_token_at = start
        tokens: list[int] = []
        # temp 0 is llama-cpp-python's greedy sampler; repeat_penalty 1 leaves logits as they
        # are. generate() never stops by itself (EOS is the caller's business), so stopping
        # after output_len tokens ignores EOS.
        for token in self.llm.generate(prompt, temp=0.0, repeat_penalty=1.0):
            if not tokens:
                first_token_at = time.perf_counter()
            tokens.append(int(token))
            if len(tokens) == output_len:
                break
        return Wave(start, first_token_at, time.perf_counter(), [tokens])


def add_llamacpp_args(group: argparse._ArgumentGroup, offline: bool) -> None:
    """The --llamacpp-* options; `offline` adds throughput.py's batch size and modes."""
    add = group.add_argument
    if offline:
        add(
            "--llamacpp-modes",
            type=comma_list(str, MODES),
            default=list(MODES),
            help="batched: low-level multi-sequence llama_decode; sequential: the high-level "
            "Llama API, one prompt after another",
        )
        add(
            "--llamacpp-batch-size",
            type=positive_int_list,
            default=[64],
            help="comma list: sequences decoded together by the batched mode (n_seq_max)",
        )
    add(
        "--llamacpp-flash-attn",
        type=comma_list(str, FLASH_ATTN),
        default=list(FLASH_ATTN),
        help="comma list: flash attention on and/or off, each a separate configuration",
    )
    add(
        "--llamacpp-threads",
        type=int,
        default=None,
        help="llama.cpp threads (None: torch's thread count, which the other systems use)",
    )
    add("--llamacpp-n-batch", type=int, default=2048, help="most tokens per llama_decode call")
    add("--llamacpp-n-ubatch", type=int, default=512, help="llama.cpp's physical batch size")
    add(
        "--llamacpp-kv-unified",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="one KV buffer shared by all sequences (off: one KV stream per sequence, "
        "llama.cpp's default)",
    )


def settings_from_args(args: argparse.Namespace) -> LlamaCppSettings:
    """The llama.cpp settings; fills in args.llamacpp_threads when it was left out."""
    if args.llamacpp_threads is None:
        import torch

        args.llamacpp_threads = torch.get_num_threads()
    for name in ("llamacpp_threads", "llamacpp_n_batch", "llamacpp_n_ubatch"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1.")
    return LlamaCppSettings(
        n_threads=args.llamacpp_threads,
        n_batch=args.llamacpp_n_batch,
        n_ubatch=args.llamacpp_n_ubatch,
        kv_unified=args.llamacpp_kv_unified,
    )


def require_gguf(gguf_file: str | None) -> None:
    """llama.cpp reads only GGUF files; say so before any time is spent."""
    if gguf_file is None:
        raise SystemExit("--compare llamacpp needs a GGUF model (--model path/to/file.gguf).")

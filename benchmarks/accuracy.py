"""Accuracy of reduced-precision modes against the float32 engine, teacher-forced.

Every mode (`--modes`: a dtype such as `bfloat16`, or `dtype:quantization` such as
`bfloat16:int4`) is fed exactly the same token ids as the float32 reference, and scored on
the same positions through the engine's own API (`SamplingParams(prompt_logprobs=2,
max_tokens=1)`), so a mode is measured the way users run it. Two text sets are scored:

- `chat` (the one the tests use): 16 fixed questions in the model's chat template, each
  followed by the float32 engine's own 32-token greedy answer (EOS ignored, so every answer
  has 32 tokens). The 32 answer positions are scored: this is the text the model really
  produces, so agreement there is agreement on the user-visible choice. float32's scores
  there are the logprobs it generated the answer with (its top-1 is the answer token).
- `natural`: 16 fixed English passages (no template), each cut to `--context-len` (16)
  unscored tokens followed by 32 scored ones.

Per set (16 x 32 = 512 positions) and mode:

- agreement: the fraction of positions whose most likely next token (rank 1 of the
  engine's prompt logprobs) is the float32 reference's. Disagreements are broken down by
  two kinds of close call: reference near-ties (float32's top-1 leads its top-2 by less than
  `--near-tie` nats), which any perturbation may flip, and the mode's own exact ties (its
  top-2 logprobs equal, as happens when logits are rounded to bfloat16), which the engine
  breaks arbitrarily.
- perplexity: exp of the mean negative logprob of the actual next tokens, and its relative
  difference to the reference's (mode / reference - 1). The chat set scores the reference's
  own greedy choices, so its perplexities are low (about 1.8, natural text about 13.5).
- continuation loglikelihood, as lm-eval scores multiple-choice and loglikelihood tasks
  (echo + prompt logprobs, summed over a continuation): each text's 32 scored tokens are 4
  continuations of CONTINUATION_TOKENS (8) tokens, each conditioned on everything before
  it, and a mode's sum over a continuation is compared with the reference's: mean and max
  |difference| in nats over the 64 continuations of a set.
- free-running greedy (chat set): how many of the 16 greedy answers equal the reference's
  token for token, and where they first differ. For context only: one flipped near-tie
  changes the whole rest of an answer, and reduced-precision results also depend on the
  batch the request shares.

`--compare-llamacpp` scores llama.cpp (llama-cpp-python, the same GGUF, the same token ids,
all logits of one evaluation per text) against the same float32 reference, so the two
engines' distances to the file's own float32 math are measured side by side.

Model loading and the timing of the scoring pass are reported but are not the point; use
latency.py or throughput.py for speed.

    python benchmarks/accuracy.py                                   # float32 vs bfloat16
    python benchmarks/accuracy.py --modes float32,bfloat16,bfloat16:int4 \
        --output-json results/accuracy.json
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

REFERENCE_MODE = "float32"
NUM_SCORED = 32  # scored positions per text
PROMPT_LOGPROBS = 2  # top-2: the rank-1 token and its lead over the runner-up
CONTINUATION_TOKENS = 8  # tokens per scored continuation (lm-eval-style loglikelihood)
KV_CACHE_BYTES = 256 << 20  # 32 short texts need a few MiB; keep several engines cheap
# Tokens per engine step while scoring. Users see tokens chosen in decode steps of a few
# tokens, and an engine may run such steps differently from long prefills (other kernels; e.g.
# torch's weight-only int8/int4 copies serve only steps of at most 8 tokens, longer ones use
# the dense weights). Chunked prefill in steps of 4 scores every position on that path.
STEP_TOKENS = 4

# Questions whose answers run well past 32 tokens, so no greedy answer ends early.
CHAT_QUESTIONS = (
    "Explain why the sky is blue.",
    "What are the main causes of the French Revolution?",
    "Describe how a refrigerator keeps food cold.",
    "Give me three tips for writing a good cover letter.",
    "How does photosynthesis work?",
    "Write a short story about a robot who learns to paint.",
    "What is the difference between a virus and a bacterium?",
    "Explain recursion to a beginner programmer.",
    "Why do we have seasons on Earth?",
    "Describe the water cycle in a few sentences.",
    "What should I pack for a week-long hiking trip?",
    "How do vaccines help the immune system?",
    "Summarize the plot of Romeo and Juliet.",
    "What are the benefits of regular exercise?",
    "Explain how a bill becomes a law in the United States.",
    "Write a Python function that checks whether a number is prime.",
)

# Plain English passages of varied register; each is longer than 16 + 32 tokens.
NATURAL_TEXTS = (
    "The old lighthouse stood at the edge of the cliff for more than a century. Every night "
    "its keeper climbed the narrow spiral stairs, trimmed the wick, and watched the beam "
    "sweep across the dark water, warning ships away from the rocks below. His logbook "
    "recorded every storm.",
    "Photosynthesis is the process by which green plants use sunlight to turn water and "
    "carbon dioxide into glucose and oxygen. It takes place mainly in the leaves, inside "
    "small structures called chloroplasts, which contain the pigment chlorophyll. Without it,"
    " most life on Earth would not exist.",
    "To make a simple tomato sauce, heat two tablespoons of olive oil in a pan, add a chopped"
    " onion and cook it slowly until soft. Then add garlic, a can of crushed tomatoes, a "
    "pinch of salt, and let the sauce simmer for twenty minutes. Stir it now and then so it "
    "does not burn.",
    "The Industrial Revolution began in Britain in the late eighteenth century. New machines "
    "for spinning and weaving cotton, powered first by water and later by steam, moved "
    "production from homes into large factories and changed the way people lived and worked. "
    "Cities grew quickly as workers moved from the countryside.",
    "When you write a function, give it a name that says what it does, keep it short, and let"
    " it do one thing well. Functions that are small and clearly named are easier to test, "
    "easier to reuse, and much easier for other people to read. Good names are worth the "
    "extra thought.",
    "The city council voted on Tuesday to expand the bus network, adding three new routes "
    "that will connect the northern suburbs with the train station. The changes are expected "
    "to take effect next spring, after a short public consultation. Residents can send their "
    "comments to the council by email.",
    "Honeybees live in colonies of tens of thousands of workers, a few hundred drones, and a "
    "single queen. The workers gather nectar and pollen, build the wax comb, care for the "
    "young, and defend the hive against intruders. In winter they cluster together to keep "
    "warm.",
    "Regular exercise strengthens the heart and lungs, helps control weight, and improves "
    "mood and sleep. Doctors recommend that adults get at least one hundred and fifty minutes"
    " of moderate activity, such as brisk walking, every week. Even short walks after meals "
    "can make a real difference.",
    "The train left the station just after dawn. Through the window, Maria watched the grey "
    "houses give way to green fields and low stone walls, and she wondered, not for the first"
    " time, whether she had made the right decision. Her sister had told her to wait another "
    "year.",
    "A black hole is a region of space where gravity is so strong that nothing, not even "
    "light, can escape from it. Black holes form when very massive stars collapse at the end "
    "of their lives, squeezing their matter into a tiny volume. Astronomers detect them by "
    "watching nearby stars and gas.",
    "Before you start the installation, make sure that your computer meets the minimum "
    "requirements: at least eight gigabytes of memory, twenty gigabytes of free disk space, "
    "and a recent version of the operating system. You will also need an internet connection "
    "to download the updates.",
    "The Amazon rainforest covers much of northern South America and is home to millions of "
    "species of plants, insects, birds and mammals. It also stores vast amounts of carbon, "
    "which makes it important for the climate of the whole planet. Large areas are lost to "
    "logging and farming every year.",
    "In chess, each player begins with sixteen pieces: one king, one queen, two rooks, two "
    "knights, two bishops and eight pawns. The goal of the game is to checkmate the opposing "
    "king, so that it is attacked and cannot escape. White always moves first.",
    "Good sleep habits include going to bed at the same time each night, keeping the bedroom "
    "cool and dark, and avoiding screens for an hour before sleep. Caffeine late in the day "
    "can also make it harder to fall asleep. Most adults need seven to nine hours of sleep a "
    "night.",
    "The museum's new exhibition brings together paintings, letters and photographs from the "
    "artist's early years in Paris, when she shared a small studio with two friends and sold "
    "her first works to tourists along the river. Many of these works have never been shown "
    "in public before.",
    "Water boils at one hundred degrees Celsius at sea level, but at a lower temperature high"
    " in the mountains, where the air pressure is lower. This is why cooking pasta or boiling"
    " eggs takes longer at high altitude. Pressure cookers solve this problem by raising the "
    "pressure inside the pot.",
)


@dataclass(frozen=True)
class Mode:
    """One engine configuration: a dtype and, optionally, a quantization method and a KV
    cache dtype (None: the engine's default for the other two)."""

    dtype: str
    quantization: str | None = None
    kv_cache_dtype: str | None = None

    @classmethod
    def parse(cls, text: str) -> Mode:
        """`bfloat16`, `bfloat16:int4` or `bfloat16:int4:auto` (`bfloat16::int8`: dense
        weights, int8 KV cache)."""
        dtype, quantization, kv_cache_dtype = (text.split(":") + ["", ""])[:3]
        return cls(dtype.strip(), quantization.strip() or None, kv_cache_dtype.strip() or None)

    @property
    def name(self) -> str:
        parts = [self.dtype, self.quantization or "", self.kv_cache_dtype or ""]
        return ":".join(parts).rstrip(":")


@dataclass
class TextSet:
    """Texts fed to every mode, with the positions to score.

    Attributes:
        name: "chat" or "natural".
        token_ids: one list per text, the whole teacher-forced sequence.
        first_scored: per text, the index of the first scored token: positions
            first_scored - 1 .. len - 2 predict tokens first_scored .. len - 1.
    """

    name: str
    token_ids: list[list[int]]
    first_scored: list[int]

    def prefixes(self) -> list[list[int]]:
        """The unscored start of each text (for the chat set: the templated questions)."""
        return [ids[:first] for ids, first in zip(self.token_ids, self.first_scored, strict=True)]

    def scored_tokens(self) -> list[list[int]]:
        """The scored tokens of each text (for the chat set: the reference's answers)."""
        return [ids[first:] for ids, first in zip(self.token_ids, self.first_scored, strict=True)]


@dataclass
class PositionScores:
    """What one mode said at every scored position of a text set (flattened, text-major).

    Attributes:
        top1: the rank-1 token at each position.
        actual_logprob: logprob of the actual next token.
        margin: rank-1 minus rank-2 logprob (how close the choice was).
    """

    top1: list[int] = field(default_factory=list)
    actual_logprob: list[float] = field(default_factory=list)
    margin: list[float] = field(default_factory=list)

    def add(self, position: dict[int, Any], actual_token: int) -> None:
        """Append one position's logprobs dict (the actual token first, then the top-k)."""
        top1, margin = top1_and_margin(position, actual_token)
        self.top1.append(top1)
        self.actual_logprob.append(position[actual_token].logprob)
        self.margin.append(margin)


def chat_prompt_ids(tokenizer: Any, question: str) -> list[int]:
    """The question in the model's chat template, tokenized as `LLM.chat` does."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    # The template already wrote the special tokens the model wants.
    return tokenizer.encode(text, add_special_tokens=False)


def natural_text_ids(
    tokenizer: Any, text: str, context_len: int, num_scored: int = NUM_SCORED
) -> list[int]:
    """A text's first `context_len + num_scored` tokens (no special tokens)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    needed = context_len + num_scored
    if len(ids) < needed:
        raise ValueError(f"passage has {len(ids)} tokens, needs {needed}: {text[:40]!r}...")
    return ids[:needed]


def greedy_generate(
    llm: Any, prompts: list[list[int]], num_tokens: int, logprobs: int | None = None
) -> list[Any]:
    """`num_tokens` greedy tokens after each prompt (EOS ignored): each prompt's completion."""
    from pagedllm import SamplingParams

    params = SamplingParams(
        temperature=0.0, max_tokens=num_tokens, ignore_eos=True, logprobs=logprobs
    )
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0] for o in outputs]


def build_chat_set(
    reference_llm: Any, num_scored: int = NUM_SCORED
) -> tuple[TextSet, PositionScores]:
    """The chat set (each question + the reference's greedy answer) and the reference's scores.

    The scores are the logprobs the reference chose each answer token with, so its top-1 is
    the answer token itself and no second pass over the text is needed.
    """
    tokenizer = reference_llm.get_tokenizer()
    prompts = [chat_prompt_ids(tokenizer, q) for q in CHAT_QUESTIONS]
    answers = greedy_generate(reference_llm, prompts, num_scored, logprobs=PROMPT_LOGPROBS)
    scores = PositionScores()
    for answer in answers:
        for token, position in zip(answer.token_ids, answer.logprobs, strict=True):
            scores.add(position, token)
    chat = TextSet(
        "chat",
        [p + list(a.token_ids) for p, a in zip(prompts, answers, strict=True)],
        [len(p) for p in prompts],
    )
    return chat, scores


def build_natural_set(tokenizer: Any, context_len: int, num_scored: int = NUM_SCORED) -> TextSet:
    """The natural passages, `context_len` unscored tokens then `num_scored` scored ones.
    Text i is passage i followed by the next ones (cyclically) as far as it needs, so a
    long `num_scored` reads on into other passages."""
    count = len(NATURAL_TEXTS)
    texts = [
        " ".join(NATURAL_TEXTS[(i + k) % count] for k in range(count)) for i in range(count)
    ]
    natural_ids = [natural_text_ids(tokenizer, t, context_len, num_scored) for t in texts]
    return TextSet("natural", natural_ids, [context_len] * len(natural_ids))


def top1_and_margin(position: dict[int, Any], scored_token: int) -> tuple[int, float]:
    """The rank-1 token of a logprobs position (prompt or sampled) and its lead over rank 2.

    The dict holds the scored token first, then the top-k (ranked by position). A top-k
    token of rank 1 that is not the scored token is the engine's top-1 (the scored token
    may tie it); otherwise the scored token itself is the top-1.
    """
    top1 = next(
        (t for t, lp in position.items() if lp.rank == 1 and t != scored_token), scored_token
    )
    best = position[top1].logprob
    others = [lp.logprob for t, lp in position.items() if t != top1]
    return top1, best - max(others) if others else math.inf


def truncate_chat_set(
    chat: TextSet, scores: PositionScores, num_scored: int
) -> tuple[TextSet, PositionScores]:
    """The chat set with each answer cut to its first `num_scored` tokens, and the
    reference's scores of those positions: what `build_chat_set(llm, num_scored)` gives
    from the same greedy reference (its first tokens do not depend on how many follow)."""
    texts: list[list[int]] = []
    cut = PositionScores()
    start = 0
    for ids, first in zip(chat.token_ids, chat.first_scored, strict=True):
        texts.append(ids[: first + num_scored])
        keep = slice(start, start + min(num_scored, len(ids) - first))
        cut.top1 += scores.top1[keep]
        cut.actual_logprob += scores.actual_logprob[keep]
        cut.margin += scores.margin[keep]
        start += len(ids) - first
    return TextSet(chat.name, texts, list(chat.first_scored)), cut


def score(llm: Any, text_set: TextSet) -> PositionScores:
    """Teacher-force every text of the set through the engine and read the scored positions."""
    from pagedllm import SamplingParams

    params = SamplingParams(prompt_logprobs=PROMPT_LOGPROBS, max_tokens=1, temperature=0.0)
    prompts = [{"prompt_token_ids": ids} for ids in text_set.token_ids]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    scores = PositionScores()
    for ids, first, out in zip(text_set.token_ids, text_set.first_scored, outputs, strict=True):
        # prompt_logprobs[j] scores token j given tokens < j (entry 0 is None).
        for j in range(first, len(ids)):
            scores.add(out.prompt_logprobs[j], ids[j])
    return scores


def perplexity(logprobs: list[float]) -> float:
    """exp(mean negative logprob)."""
    return math.exp(-statistics.fmean(logprobs))


def _count(flags: list[bool]) -> int:
    return sum(1 for f in flags if f)


def continuation_sums(logprobs: list[float]) -> list[float]:
    """Sums of consecutive CONTINUATION_TOKENS logprobs: the loglikelihood of each
    continuation (the positions of a set are text-major, a multiple of it per text)."""
    return [
        math.fsum(logprobs[i : i + CONTINUATION_TOKENS])
        for i in range(0, len(logprobs), CONTINUATION_TOKENS)
    ]


def compare(scores: PositionScores, reference: PositionScores, near_tie: float) -> dict[str, Any]:
    """Agreement, perplexities and a breakdown of the disagreements of a mode vs the reference.

    Two kinds of close calls are counted: the reference's near-ties (its top-1 leads by less
    than `near_tie`), which any perturbation may flip, and the mode's own exact ties (its
    top-2 logprobs are equal, e.g. from logits rounded to bfloat16), which the engine breaks
    arbitrarily.
    """
    agree = [a == b for a, b in zip(scores.top1, reference.top1, strict=True)]
    near = [m < near_tie for m in reference.margin]
    tied = [m == 0.0 for m in scores.margin]
    ppl, ref_ppl = perplexity(scores.actual_logprob), perplexity(reference.actual_logprob)
    diffs = [
        abs(a - b) for a, b in zip(scores.actual_logprob, reference.actual_logprob, strict=True)
    ]
    continuation_diffs = [
        abs(a - b)
        for a, b in zip(
            continuation_sums(scores.actual_logprob),
            continuation_sums(reference.actual_logprob),
            strict=True,
        )
    ]
    return {
        "positions": len(agree),
        "agreement": statistics.fmean(agree),
        "disagreements": len(agree) - sum(agree),
        "reference_near_ties": _count(near),
        "disagreements_at_reference_near_ties": _count(
            [n and not a for a, n in zip(agree, near, strict=True)]
        ),
        "mode_exact_ties": _count(tied),
        "disagreements_at_mode_exact_ties": _count(
            [t and not a for a, t in zip(agree, tied, strict=True)]
        ),
        "perplexity": ppl,
        "reference_perplexity": ref_ppl,
        "perplexity_rel_diff": ppl / ref_ppl - 1.0,
        "mean_abs_logprob_diff": statistics.fmean(diffs),
        "max_abs_logprob_diff": max(diffs),
        "continuations": len(continuation_diffs),
        "continuation_mean_abs_diff": statistics.fmean(continuation_diffs),
        "continuation_max_abs_diff": max(continuation_diffs),
    }


def free_running(answers: list[list[int]], reference: list[list[int]]) -> dict[str, Any]:
    """How many greedy answers equal the reference's, and where they first differ."""
    first_diffs, identical = [], 0
    for got, want in zip(answers, reference, strict=True):
        diff = next(
            (i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), len(want)
        )
        first_diffs.append(diff)
        identical += diff == len(want)
    return {
        "identical": identical,
        "texts": len(first_diffs),
        "mean_first_difference": statistics.fmean(first_diffs),
        "first_difference": first_diffs,
    }


def engine_knows_quantization() -> bool:
    """True when LLM takes a `quantization=` argument (itself or as an EngineArgs field)."""
    import dataclasses
    import inspect

    from pagedllm import LLM
    from pagedllm.engine.arg_utils import EngineArgs

    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    return "quantization" in fields or "quantization" in inspect.signature(LLM).parameters


def make_llm(model: str | None, mode: Mode, seed: int, step_tokens: int = STEP_TOKENS) -> Any:
    """An engine for `mode` whose steps hold at most `step_tokens` tokens.

    A mode without a quantization runs dense weights ("none"): the engine's own default for
    a 4-bit GGUF is int4, so the float32 reference must ask for dense weights explicitly.
    """
    from pagedllm import LLM

    kwargs: dict[str, Any] = {}
    if engine_knows_quantization():
        kwargs["quantization"] = mode.quantization or "none"
    if mode.kv_cache_dtype is not None:
        kwargs["kv_cache_dtype"] = mode.kv_cache_dtype
    return LLM(
        model=model,
        dtype=mode.dtype,
        seed=seed,
        max_model_len=512,
        max_num_batched_tokens=step_tokens,
        kv_cache_memory_bytes=KV_CACHE_BYTES,
        enable_prefix_caching=False,
        **kwargs,
    )


def score_sets(llm: Any, text_sets: list[TextSet]) -> tuple[dict[str, PositionScores], float]:
    """Scores of every text set, and the seconds scoring took (rough: a shared machine)."""
    start = time.perf_counter()
    scores = {ts.name: score(llm, ts) for ts in text_sets}
    return scores, time.perf_counter() - start


def evaluate_mode(
    model: str,
    mode: Mode,
    seed: int,
    text_sets: list[TextSet],
    reference: dict[str, PositionScores],
    near_tie: float,
    step_tokens: int,
) -> tuple[dict[str, Any], float]:
    """Load `mode`, score it against the reference; return its results and scoring seconds."""
    chat = text_sets[0]
    llm = make_llm(model, mode, seed, step_tokens)
    try:
        scores, elapsed = score_sets(llm, text_sets)
        num_scored = len(chat.scored_tokens()[0])
        answers = [list(a.token_ids) for a in greedy_generate(llm, chat.prefixes(), num_scored)]
    finally:
        del llm
        gc.collect()  # one engine (weights and KV cache) in memory at a time
    result = {
        "sets": {
            ts.name: compare(scores[ts.name], reference[ts.name], near_tie) for ts in text_sets
        },
        "free_running": free_running(answers, chat.scored_tokens()),
    }
    return result, elapsed


def score_llamacpp(
    model_path: str, text_sets: list[TextSet], threads: int | None
) -> dict[str, PositionScores]:
    """llama.cpp's scores of every text set: each text evaluated once with all logits kept
    (llama-cpp-python's `logits_all`), teacher-forced on the same ids as every mode."""
    import numpy as np
    from llamacpp_peer import import_llama_cpp  # late: optional, and loaded by path in tests

    llama_cpp = import_llama_cpp()
    llm = llama_cpp.Llama(
        model_path=model_path, n_ctx=512, logits_all=True, n_threads=threads,
        n_threads_batch=threads, verbose=False,
    )
    result = {}
    for text_set in text_sets:
        scores = PositionScores()
        for ids, first in zip(text_set.token_ids, text_set.first_scored, strict=True):
            llm.reset()
            llm.eval(ids)
            logits = np.asarray(llm.scores[: len(ids)], dtype=np.float64)  # row j predicts j + 1
            logprobs = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
            for j in range(first, len(ids)):
                row = logprobs[j - 1]
                top2 = np.argsort(row)[-2:][::-1]
                scores.top1.append(int(top2[0]))
                scores.actual_logprob.append(float(row[ids[j]]))
                scores.margin.append(float(row[top2[0]] - row[top2[1]]))
        result[text_set.name] = scores
    llm.close()
    return result


def print_report(results: dict[str, Any]) -> None:
    """One row per (mode, text set)."""
    header = (
        f"{'mode':<18} {'text':<8} {'agree':>6} {'disagree':>8} {'@ref near-tie':>13} "
        f"{'@own exact tie':>14} {'ppl':>8} {'ref ppl':>8} {'ppl diff':>8} {'cont |d|':>8} "
        f"{'max':>6} {'greedy same':>11}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for name, mode_result in results.items():
        free = mode_result.get("free_running")
        for set_name, r in mode_result["sets"].items():
            same = f"{free['identical']}/{free['texts']}" if free and set_name == "chat" else ""
            print(
                f"{name:<18} {set_name:<8} {r['agreement']:>6.3f} {r['disagreements']:>8} "
                f"{r['disagreements_at_reference_near_ties']:>13} "
                f"{r['disagreements_at_mode_exact_ties']:>14} {r['perplexity']:>8.4f} "
                f"{r['reference_perplexity']:>8.4f} {r['perplexity_rel_diff'] * 100:>7.2f}% "
                f"{r['continuation_mean_abs_diff']:>8.3f} {r['continuation_max_abs_diff']:>6.2f} "
                f"{same:>11}"
            )


def build_parser() -> argparse.ArgumentParser:
    """The command line (every option documented for --help)."""
    from common import add_model_arg, new_parser  # late: tests load this file by path

    p = new_parser(__doc__)

    add = p.add_argument
    add_model_arg(p)
    add(
        "--modes",
        default="float32,bfloat16",
        help="comma list of modes: dtype[:quantization[:kv_cache_dtype]] (e.g. bfloat16:int4, "
        "bfloat16:int4:auto, bfloat16::int8; without a quantization the weights are dense, "
        "without a kv_cache_dtype the engine picks). The float32 reference always runs.",
    )
    add("--context-len", type=int, default=16, help="unscored leading tokens of natural texts")
    add(
        "--num-scored",
        type=int,
        default=NUM_SCORED,
        help="scored tokens per text (the chat answers' length; natural texts read on into "
        "the next passages); a multiple of 8, the continuation length",
    )
    add(
        "--near-tie",
        type=float,
        default=0.1,
        help="reference top-1 minus top-2 logprob below which a position counts as a near-tie",
    )
    add(
        "--step-tokens",
        type=int,
        default=STEP_TOKENS,
        help="max_num_batched_tokens of every engine: prompts are scored in chunks of this "
        "many tokens (small: the decode path, where quantized weights are used; 2048: "
        "whole-prompt prefills)",
    )
    add("--seed", type=int, default=0, help="engine seed (decoding is greedy anyway)")
    add(
        "--compare-llamacpp",
        action="store_true",
        help="also score llama.cpp (llama-cpp-python) on the same token ids",
    )
    add("--llamacpp-threads", type=int, default=None, help="llama.cpp threads (default: all)")
    add("--output-json", default=None, metavar="PATH", help="write config, machine, results")
    return p


def main(argv: list[str] | None = None) -> None:
    """Build the texts with the reference, score every mode, print the table, write JSON."""
    parser = build_parser()
    args = parser.parse_args(argv)
    modes = [Mode.parse(m) for m in args.modes.split(",") if m.strip()]
    if args.context_len < 1 or args.step_tokens < 1:
        parser.error("--context-len and --step-tokens must be at least 1.")
    if args.num_scored < 1 or args.num_scored % CONTINUATION_TOKENS:
        parser.error(f"--num-scored must be a positive multiple of {CONTINUATION_TOKENS}.")
    if any(m.quantization for m in modes) and not engine_knows_quantization():
        parser.error("this pagedllm's LLM has no quantization= argument; drop the :method.")
    from common import load_average, locate_model, machine_info, write_json

    location = locate_model(args.model)
    args.model = location.path
    machine = machine_info()
    print(f"model {location.path}; reference {REFERENCE_MODE}")

    llm = make_llm(location.path, Mode(REFERENCE_MODE), args.seed, args.step_tokens)
    chat, chat_reference = build_chat_set(llm, args.num_scored)
    natural = build_natural_set(llm.get_tokenizer(), args.context_len, args.num_scored)
    text_sets = [chat, natural]
    reference, reference_s = score_sets(llm, [natural])
    reference[chat.name] = chat_reference
    tokenizer = llm.get_tokenizer()
    del llm
    gc.collect()

    results: dict[str, Any] = {}
    timings = {REFERENCE_MODE: reference_s}
    for mode in modes:
        if mode == Mode(REFERENCE_MODE):
            continue
        print(f"mode {mode.name}")
        results[mode.name], timings[mode.name] = evaluate_mode(
            location.path, mode, args.seed, text_sets, reference, args.near_tie, args.step_tokens
        )
    if args.compare_llamacpp:
        print("llama.cpp")
        llamacpp_scores = score_llamacpp(location.path, text_sets, args.llamacpp_threads)
        results["llama.cpp"] = {
            "sets": {
                ts.name: compare(llamacpp_scores[ts.name], reference[ts.name], args.near_tie)
                for ts in text_sets
            }
        }
    print_report(results)
    answers = text_sets[0].scored_tokens()
    answers_with_eos = sum(tokenizer.eos_token_id in a for a in answers)
    if answers_with_eos:
        print(f"note: {answers_with_eos} reference answers contain EOS (ignored, scored on)")
    print("scoring seconds (rough): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    if args.output_json:
        machine["loadavg_end"] = load_average()
        write_json(
            args.output_json,
            {
                "benchmark": "accuracy",
                "config": vars(args),
                "machine": machine,
                "reference": REFERENCE_MODE,
                "texts": {ts.name: vars(ts) for ts in text_sets},
                "reference_answers": [tokenizer.decode(a) for a in answers],
                "reference_answers_with_eos": answers_with_eos,
                "scoring_seconds": timings,
                "results": results,
            },
        )
        print(f"wrote {args.output_json}")


if __name__ == "__main__":
    main()

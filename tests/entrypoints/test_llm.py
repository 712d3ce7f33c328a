"""The offline LLM API: prompt forms, output objects, sampling semantics, errors, cleanup."""

from __future__ import annotations

import pytest

from pagedllm import LLM, LLMEngine, RequestOutput, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


@pytest.fixture(scope="module")
def llm(tiny_llama_dir) -> LLM:
    return LLM(str(tiny_llama_dir), dtype="float32", max_model_len=256)


def _free_blocks_all_back(llm: LLM) -> bool:
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    manager = scheduler.kv_cache_manager
    manager.check_integrity()
    return manager.get_num_free_blocks() == manager.num_usable_blocks


def test_prompt_forms_and_output_fields(llm: LLM):
    tokenizer = llm.get_tokenizer()
    text = "The quick brown fox"
    ids = tokenizer.encode(text)
    single = llm.generate(text, GREEDY, use_tqdm=False)
    assert len(single) == 1 and isinstance(single[0], RequestOutput)
    out = single[0]
    assert out.prompt == text and out.prompt_token_ids == ids and out.finished
    completion = out.outputs[0]
    assert completion.index == 0 and len(completion.token_ids) == 12
    assert completion.finish_reason == "length" and completion.stop_reason is None
    assert completion.text == tokenizer.decode(completion.token_ids, skip_special_tokens=True)
    by_ids = llm.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)[0]
    assert by_ids.prompt is None and by_ids.outputs[0].token_ids == completion.token_ids
    many = llm.generate([text, {"prompt_token_ids": ids}, "Paged"], GREEDY, use_tqdm=False)
    assert [o.prompt for o in many] == [text, None, "Paged"]
    assert int(many[1].request_id) > int(many[0].request_id)
    assert _free_blocks_all_back(llm)


def test_list_of_sampling_params_keeps_input_order(llm: LLM):
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in (3, 9, 1, 5)]
    outs = llm.generate(["a", "b", "c", "d"], params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [3, 9, 1, 5]
    with pytest.raises(ValueError, match="lengths of prompts"):
        llm.generate(["a", "b"], params, use_tqdm=False)


def test_seed_reproducible_whatever_the_batch(llm: LLM):
    seeded = SamplingParams(temperature=1.0, seed=7, max_tokens=16)
    alone = llm.generate("Paged attention", seeded, use_tqdm=False)[0].outputs[0].token_ids
    others = SamplingParams(temperature=1.0, max_tokens=16)
    batch = llm.generate(
        ["Emoji", "Paged attention", "def main"], [others, seeded, others], use_tqdm=False
    )
    assert batch[1].outputs[0].token_ids == alone
    other_seed = SamplingParams(temperature=1.0, seed=8, max_tokens=16)
    assert (
        llm.generate("Paged attention", other_seed, use_tqdm=False)[0].outputs[0].token_ids != alone
    )


def test_top_k_one_equals_greedy(llm: LLM):
    prompts = ["The quick", "Continuous batching lets", "東京"]
    greedy = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    top1 = SamplingParams(temperature=0.8, top_k=1, max_tokens=12, seed=3)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, top1, use_tqdm=False)] == greedy


def test_stop_string_excluded_and_included(llm: LLM):
    run = dict(temperature=0.0, max_tokens=24, ignore_eos=True)
    base = llm.generate("The quick", SamplingParams(**run), use_tqdm=False)
    full_text = base[0].outputs[0].text
    stop = full_text[len(full_text) // 2 : len(full_text) // 2 + 2]
    assert stop.strip(), f"degenerate stop string from {full_text!r}"
    first = full_text.index(stop)
    params = SamplingParams(**run, stop=[stop])
    out = llm.generate("The quick", params, use_tqdm=False)[0].outputs[0]
    assert out.text == full_text[:first]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    params = SamplingParams(**run, stop=stop, include_stop_str_in_output=True)
    out = llm.generate("The quick", params, use_tqdm=False)[0].outputs[0]
    assert out.text == full_text[: first + len(stop)]
    assert _free_blocks_all_back(llm)


def test_stop_token_ids_and_min_tokens(llm: LLM):
    run = dict(temperature=0.0, max_tokens=24, ignore_eos=True)
    base = llm.generate("Paged", SamplingParams(**run), use_tqdm=False)
    tokens = base[0].outputs[0].token_ids
    stop_id = tokens[4]
    first = tokens.index(stop_id)
    params = SamplingParams(**run, stop_token_ids=[stop_id])
    out = llm.generate("Paged", params, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == tokens[: first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_id
    # min_tokens forbids the stop token until enough tokens are out.
    params = SamplingParams(**run, stop_token_ids=[stop_id], min_tokens=first + 2)
    out = llm.generate("Paged", params, use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) >= first + 2
    assert stop_id not in out.token_ids[: first + 1]


def test_eos_stops_unless_ignored(llm: LLM):
    tokenizer = llm.get_tokenizer()
    eos = tokenizer.eos_token_id
    # Find a prompt whose greedy continuation hits EOS by forcing it through stop_token_ids
    # semantics: with ignore_eos the request always runs to max_tokens.
    params = SamplingParams(temperature=1.0, seed=1, max_tokens=40, ignore_eos=True)
    outs = llm.generate(["a", "b", "c", "d", "e", "f"], params, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 40 for o in outs)
    params = SamplingParams(temperature=1.0, seed=1, max_tokens=40)
    for out in llm.generate(["a", "b", "c", "d", "e", "f"], params, use_tqdm=False):
        tokens = out.outputs[0].token_ids
        if eos in tokens:
            assert tokens.index(eos) == len(tokens) - 1
            assert out.outputs[0].finish_reason == "stop"


def test_n_samples_are_distinct(llm: LLM):
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=16)
    out = llm.generate("The quick brown", params, use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    sequences = {tuple(c.token_ids) for c in out.outputs}
    assert len(sequences) == 3
    again = llm.generate("The quick brown", params, use_tqdm=False)[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs]
    assert _free_blocks_all_back(llm)


def test_chat_applies_template(llm: LLM):
    messages = [{"role": "user", "content": "hello"}]
    out = llm.chat(messages, GREEDY, use_tqdm=False)[0]
    tokenizer = llm.get_tokenizer()
    expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert out.prompt == expected
    assert out.prompt_token_ids == tokenizer.encode(expected, add_special_tokens=False)
    two = llm.chat([messages, [{"role": "user", "content": "bye"}]], GREEDY, use_tqdm=False)
    assert len(two) == 2 and two[0].outputs[0].token_ids == out.outputs[0].token_ids


def test_chat_gives_tools_to_the_template(llm: LLM):
    template = ("{% for t in tools or [] %}[{{ t.function.name }}]{% endfor %}"
                "{% for m in messages %}{{ m.role }}: {{ m.content }}"
                "{% for c in m.tool_calls or [] %} {{ c.function.arguments.city }}{% endfor %}"
                "{{ '\\n' }}{% endfor %}assistant:")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c", "content": "cold"},
    ]
    out = llm.chat(messages, GREEDY, use_tqdm=False, chat_template=template, tools=tools)[0]
    assert out.prompt == "[get_weather]user: weather?\nassistant:  Oslo\ntool: cold\nassistant:"
    with pytest.raises(ValueError, match=r"messages\[1\].tool_calls\[0\].function.arguments"):
        broken = [messages[0], {"role": "assistant", "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]
        llm.chat(broken, GREEDY, use_tqdm=False, chat_template=template, tools=tools)


def test_engine_step_loop_and_abort_free_blocks(tiny_llama_dir):
    from pagedllm import EngineArgs

    engine = LLMEngine.from_engine_args(
        EngineArgs(model=str(tiny_llama_dir), dtype="float32", max_model_len=128, max_num_seqs=2)
    )
    params = SamplingParams(temperature=0.0, max_tokens=30)
    for i in range(5):
        engine.add_request(str(i), {"prompt_token_ids": list(range(3, 20 + i))}, params)
    engine.step()
    engine.step()
    # "0" and "1" are running, "4" still waiting: abort one of each.
    engine.abort_request(["0", "4"])
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    assert sorted(finished) == ["1", "2", "3"]
    manager = engine.engine_core.engine_core.scheduler.kv_cache_manager
    manager.check_integrity()
    assert manager.get_num_free_blocks() == manager.num_usable_blocks


@pytest.mark.parametrize(
    "prompt, message",
    [
        ("", "cannot be empty"),
        ({"prompt_token_ids": []}, "cannot be empty"),
        ({"prompt_token_ids": [1, 10**6]}, "out of vocabulary"),
        ({"prompt_token_ids": list(range(3, 300))}, "maximum model length"),
        (42, "A prompt must be"),
    ],
)
def test_bad_prompts_raise_value_error(llm: LLM, prompt, message):
    with pytest.raises(ValueError, match=message):
        llm.generate(["fine prompt", prompt], GREEDY, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    assert _free_blocks_all_back(llm)


def test_bad_engine_arguments(tiny_llama_dir):
    with pytest.raises(ValueError, match="dtype"):
        LLM(str(tiny_llama_dir), dtype="int3")
    with pytest.raises(ValueError, match="Unknown argument"):
        LLM(str(tiny_llama_dir), not_an_arg=1)
    with pytest.raises(ValueError, match="max_model_len"):
        LLM(str(tiny_llama_dir), dtype="float32", num_gpu_blocks_override=3, block_size=4)
    with pytest.raises(ValueError, match="(?i)download|local"):
        LLM("some-org/some-model-that-is-not-on-disk")


def test_a_dropped_llm_is_collected(tiny_llama_dir):
    """Nothing global keeps an engine alive once the user drops it: its KV cache (on a GPU,
    most of the card) comes back at the next collection, so a second LLM in the process
    gets the memory."""
    import gc
    import weakref

    llm = LLM(str(tiny_llama_dir), max_model_len=128)
    llm.generate(["hello"], SamplingParams(max_tokens=2), use_tqdm=False)
    worker = weakref.ref(llm.llm_engine.engine_core.engine_core.executor.worker)
    del llm
    gc.collect()
    assert worker() is None

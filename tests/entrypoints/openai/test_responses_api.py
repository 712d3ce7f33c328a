"""POST /v1/responses through the official openai client, unchanged: text input, items,
instructions, max_output_tokens (incomplete), previous_response_id with stored responses,
GET and cancel, background responses (polled, cancelled), JSON-schema text.format,
function tools, and `responses.stream`'s typed events adding up to the final response."""

from __future__ import annotations

import json

import openai
import pytest

from .conftest import MODEL_NAME


def test_text_input_and_the_stored_response(client):
    response = client.responses.create(model=MODEL_NAME, input="Hello there", temperature=0,
                                       max_output_tokens=6)
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status in ("completed", "incomplete")
    assert response.output_text and response.output[0].type == "message"
    assert response.usage.output_tokens <= 6 and response.usage.input_tokens > 0
    stored = client.responses.retrieve(response.id)
    assert stored.id == response.id and stored.output_text == response.output_text
    # The same words as chat gives for the same conversation.
    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Hello there"}],
        temperature=0, max_tokens=6)
    assert response.output_text == chat.choices[0].message.content


def test_max_output_tokens_marks_it_incomplete(client):
    response = client.responses.create(
        model=MODEL_NAME, input="Tell me a long story", max_output_tokens=3, temperature=0,
        extra_body={"ignore_eos": True})
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3


def test_instructions_items_and_previous_response(client, http):
    first = client.responses.create(
        model=MODEL_NAME, instructions="Be brief.", temperature=0, max_output_tokens=4,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Name a color"}]}])
    follow = client.responses.create(model=MODEL_NAME, input="Another one",
                                     previous_response_id=first.id, temperature=0,
                                     max_output_tokens=4)
    assert follow.previous_response_id == first.id
    # The follow-up saw the first exchange: its prompt is longer than a fresh one's.
    fresh = client.responses.create(model=MODEL_NAME, input="Another one", temperature=0,
                                    max_output_tokens=4)
    assert follow.usage.input_tokens > fresh.usage.input_tokens + first.usage.output_tokens
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_unknown")
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(first.id)  # not a background response
    for bad in ({"background": True, "store": False}, {"background": True, "stream": True},
                {"background": "yes"}):
        response = http.post("/v1/responses", json={"model": MODEL_NAME, "input": "x", **bad})
        assert response.status_code == 400, bad


def _poll(client, response_id, done=("completed", "incomplete", "failed", "cancelled")):
    import time

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        response = client.responses.retrieve(response_id)
        if response.status in done:
            return response
        time.sleep(0.1)
    raise AssertionError(f"response {response_id} still {response.status}")


def test_background_response_is_polled_to_the_same_answer(client):
    queued = client.responses.create(model=MODEL_NAME, input="Hello there", temperature=0,
                                     max_output_tokens=6, background=True)
    assert queued.status in ("queued", "in_progress") and queued.background
    finished = _poll(client, queued.id)
    direct = client.responses.create(model=MODEL_NAME, input="Hello there", temperature=0,
                                     max_output_tokens=6)
    assert finished.status == direct.status and finished.output_text == direct.output_text
    # A finished background response cancels to itself.
    assert client.responses.cancel(queued.id).status == finished.status


def test_background_response_is_cancelled_and_its_blocks_return(client, http):
    from .conftest import metric

    def value(name, **labels):
        return metric(http.get("/metrics").text, name, **labels)

    aborted_before = value("pagedllm:request_success_total", finished_reason="abort")
    running = client.responses.create(
        model=MODEL_NAME, input="Tell me a long story", temperature=0, background=True,
        max_output_tokens=200, extra_body={"ignore_eos": True, "min_tokens": 200})
    import time

    deadline = time.monotonic() + 30  # until its engine request runs
    while not value("pagedllm:num_requests_running") and time.monotonic() < deadline:
        time.sleep(0.02)
    cancelled = client.responses.cancel(running.id)
    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(running.id).status == "cancelled"
    deadline = time.monotonic() + 30
    while value("pagedllm:num_requests_running") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert value("pagedllm:num_requests_running") == 0
    assert value("pagedllm:kv_cache_usage_perc") == 0
    # Its engine request was aborted, not run to its 200 tokens.
    assert value("pagedllm:request_success_total", finished_reason="abort") == aborted_before + 1
    assert client.responses.retrieve(running.id).status == "cancelled"


def test_json_schema_format(client):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    response = client.responses.create(
        model=MODEL_NAME, input="Give a number", temperature=0, max_output_tokens=300,
        text={"format": {"type": "json_schema", "name": "num", "schema": schema}})
    assert response.status == "completed"
    assert isinstance(json.loads(response.output_text)["n"], int)


def test_stream_events_add_up_to_the_final_response(client):
    kinds = []
    with client.responses.stream(model=MODEL_NAME, input="Hello there", temperature=0,
                                 max_output_tokens=6) as stream:
        deltas = ""
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas += event.delta
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_item.added" in kinds and "response.output_text.done" in kinds
    assert deltas == final.output_text
    whole = client.responses.create(model=MODEL_NAME, input="Hello there", temperature=0,
                                    max_output_tokens=6)
    assert final.output_text == whole.output_text


def test_bad_items_answer_400(http):
    for body, param in [({"input": [{"type": "image_generation_call"}]}, "input.0"),
                        ({"input": ""}, "input"),
                        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools.0")]:
        response = http.post("/v1/responses", json={"model": MODEL_NAME, **body})
        assert response.status_code == 400, body
        assert response.json()["error"]["param"] == param


def test_function_call_and_its_output(client):
    tools = [{"type": "function", "name": "get_weather", "description": "The weather",
              "parameters": {"type": "object",
                             "properties": {"city": {"enum": ["Paris", "Rome"]}},
                             "required": ["city"], "additionalProperties": False}}]
    response = client.responses.create(
        model=MODEL_NAME, input="Weather in Paris?", tools=tools, temperature=0,
        tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=300)
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments)["city"] in ("Paris", "Rome")
    follow = client.responses.create(
        model=MODEL_NAME, previous_response_id=response.id, temperature=0,
        max_output_tokens=4, tools=tools, tool_choice="none",
        input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                "output": "sunny"}])
    assert follow.status in ("completed", "incomplete") and follow.usage.input_tokens > 0

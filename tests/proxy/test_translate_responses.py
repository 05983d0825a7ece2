"""Responses API client, chat completions or Anthropic provider: requests, answers and streams on
recorded wire data; streams give the same events however the provider's bytes are cut; a
provider that serves the API has its ids swapped, event by event, and nothing else touched."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.errors import ProxyError
from proxy.responses.passthrough import PassThrough
from proxy.translate import responses_anthropic, responses_openai
from proxy.translate._responses_answer import (
    Frame,
)
from proxy.translate._responses_request import (
    parse,
)
from proxy.usage import TokenUsage
from tests.support.streams import cuts
from vkgate.errors import ErrorCode

SAMPLES = Path(__file__).parent / "samples"
CLAUDE = "claude-sonnet-4-5-20250929"
CREATED = 1_767_225_600
SEALED = "resp_sealed_for_the_client"
PROPERTIES = settings(max_examples=80, deadline=None)


def sample(name: str) -> bytes:
    return (SAMPLES / name).read_bytes()


def frame(body: bytes = b'{"model":"m","input":"hi"}') -> Frame:
    return Frame.of(body, lambda upstream_id: f"{SEALED}:{upstream_id}", CREATED)


def to_anthropic(body: dict[str, Any] | bytes) -> dict[str, Any]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    translated: dict[str, Any] = json.loads(
        responses_anthropic.request(parse(raw, "Anthropic"), CLAUDE)
    )
    return translated


def to_chat(body: dict[str, Any] | bytes, **options: Any) -> dict[str, Any]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    translated: dict[str, Any] = json.loads(
        responses_openai.request(parse(raw, "chat"), "llama-3.1-8b", **options)
    )
    return translated


def refusal(translate: Any, body: dict[str, Any]) -> ProxyError:
    with pytest.raises(ProxyError) as caught:
        translate(body)
    assert caught.value.code == ErrorCode.INVALID_REQUEST
    return caught.value


def events(stream: bytes) -> list[dict[str, Any]]:
    """The `data` of each event, checking that its `event:` line names its type."""
    found = []
    for block in stream.split(b"\n\n"):
        if not block:
            continue
        name, data = block.split(b"\n")
        event = json.loads(data.removeprefix(b"data: "))
        assert name == b"event: " + event["type"].encode()
        found.append(event)
    return found


# -- requests -------------------------------------------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "temperature_c": {"type": "number"}},
    "required": ["city", "temperature_c"],
    "additionalProperties": False,
}
PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
PIXEL = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="
)


def test_a_recorded_request_becomes_an_anthropic_message_request() -> None:
    assert to_anthropic(sample("responses_request.json")) == {
        "model": CLAUDE,
        "max_tokens": 512,
        "system": [
            {"type": "text", "text": "You are a weather assistant. Answer in one sentence."},
            {"type": "text", "text": "Temperatures in Celsius."},
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is the weather in Paris? Here is the sky:"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": PIXEL},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me look that up."},
                    {
                        "type": "tool_use",
                        "id": "call_Paris8Xk2",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "call_Paris8Xk2",
                        "content": '{"temperature_c": 21, "sky": "clear"}',
                    }
                ],
            },
        ],
        "temperature": 0.2,
        "stream": True,
        "metadata": {"user_id": "user-4f2a"},
        "tools": [
            {
                "name": "get_weather",
                "description": "Current weather for a city",
                "input_schema": PARAMETERS,
                "strict": True,
            }
        ],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}, "effort": "low"},
    }


def test_a_recorded_request_becomes_a_chat_completions_request() -> None:
    translated = to_chat(sample("responses_request.json"), max_tokens_field="max_completion_tokens")
    assert translated == {
        "model": "llama-3.1-8b",
        "messages": [
            {
                "role": "system",
                "content": "You are a weather assistant. Answer in one sentence.",
            },
            {"role": "system", "content": "Temperatures in Celsius."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is the weather in Paris? Here is the sky:"},
                    {
                        "type": "image_url",
                        "image_url": {"url": f"data:image/png;base64,{PIXEL}", "detail": "auto"},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": "Let me look that up.",
                "tool_calls": [
                    {
                        "id": "call_Paris8Xk2",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "call_Paris8Xk2",
                "content": '{"temperature_c": 21, "sky": "clear"}',
            },
        ],
        "max_completion_tokens": 512,
        "temperature": 0.2,
        "safety_identifier": "user-4f2a",
        "reasoning_effort": "low",
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True},
        },
        "verbosity": "low",
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Current weather for a city",
                    "parameters": PARAMETERS,
                    "strict": True,
                },
            }
        ],
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_a_text_input_and_defaults_fill_what_anthropic_requires() -> None:
    assert to_anthropic({"model": "m", "input": "hi"}) == {
        "model": CLAUDE,
        "max_tokens": responses_anthropic.DEFAULT_MAX_TOKENS,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }
    # A provider that reports no usage in a stream is not asked to.
    chat = to_chat({"model": "m", "input": "hi", "stream": True}, stream_usage=False)
    assert chat == {
        "model": "llama-3.1-8b",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
    }


def test_reasoning_maps_to_each_targets_equivalent() -> None:
    minimal = to_anthropic({"model": "m", "input": "hi", "reasoning": {"effort": "minimal"}})
    assert minimal["output_config"] == {"effort": "low"}
    none = to_anthropic({"model": "m", "input": "hi", "reasoning": {"effort": "none"}})
    assert "output_config" not in none and "thinking" not in none
    summarized = to_anthropic({"model": "m", "input": "hi", "reasoning": {"summary": "auto"}})
    assert summarized["thinking"] == {"type": "adaptive", "display": "summarized"}
    assert (
        to_chat({"model": "m", "input": "hi", "reasoning": {"effort": "high"}})["reasoning_effort"]
        == "high"
    )
    error = refusal(to_chat, {"model": "m", "input": "hi", "reasoning": {"summary": "auto"}})
    assert error.param == "reasoning.summary"


def test_a_reasoning_item_goes_back_to_anthropic_as_the_thinking_it_came_from() -> None:
    item = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "Paris first."}],
        "encrypted_content": "EqQBsignature",
    }
    call = {"type": "function_call", "call_id": "toolu_1", "name": "f", "arguments": "{}"}
    sent = to_anthropic({"model": "m", "input": [{"role": "user", "content": "hi"}, item, call]})
    assert sent["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Paris first.", "signature": "EqQBsignature"},
            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}},
        ],
    }
    unsigned = refusal(to_anthropic, {"model": "m", "input": [{**item, "encrypted_content": None}]})
    assert unsigned.param == "input[0].encrypted_content"
    assert refusal(to_chat, {"model": "m", "input": [item]}).param == "input[0]"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]}, "tools[0].type"),
        (
            {"tools": [{"type": "function", "name": "f", "defer_loading": True}]},
            "tools[0].defer_loading",
        ),
        (
            {"tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}},
            "tool_choice.type",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0].type",
        ),
        (
            {
                "input": [
                    {"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}
                ]
            },
            "input[0].content[0].file_id",
        ),
        ({"background": True}, "background"),
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"store": True}, "store"),
        ({"max_tool_calls": 3}, "max_tool_calls"),
    ],
)
def test_what_no_translation_carries_is_refused_by_name(fields: dict[str, Any], param: str) -> None:
    body = {"model": "m", "input": "hi", **fields}
    assert refusal(to_anthropic, body).param == param
    assert refusal(to_chat, body).param == param


def test_harmless_values_and_labels_of_earlier_output_are_accepted() -> None:
    body = {
        "model": "m",
        "input": [
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "status": "completed",
                "phase": "final_answer",
                "content": [
                    {"type": "output_text", "text": "ok", "annotations": [], "logprobs": []}
                ],
            },
            {"role": "user", "content": "and?"},
        ],
        "store": False,
        "background": False,
        "truncation": "disabled",
        "service_tier": "auto",
        "include": ["reasoning.encrypted_content"],
        "text": {"verbosity": "low"},
    }
    assert to_anthropic(body)["messages"][0] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "ok"}],
    }
    assert to_chat(body)["messages"][0] == {"role": "assistant", "content": "ok"}


# -- answers --------------------------------------------------------------------------------------


def test_an_anthropic_message_becomes_a_response_object() -> None:
    response = json.loads(
        responses_anthropic.response(sample("anthropic_message_tool_use.json"), frame())
    )
    assert response["id"] == f"{SEALED}:msg_01Aq9w938a90dw8q"
    assert (response["object"], response["status"], response["store"]) == (
        "response",
        "completed",
        False,
    )
    assert response["created_at"] == CREATED and response["model"] == CLAUDE
    reasoning, message, paris, berlin = response["output"]
    assert reasoning["type"] == "reasoning"
    assert reasoning["summary"] == [
        {"type": "summary_text", "text": "The user wants the weather in two cities."}
    ]
    assert reasoning["encrypted_content"] == "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"
    assert message["content"] == [
        {
            "type": "output_text",
            "annotations": [],
            "logprobs": [],
            "text": "I'll check both cities.",
        }
    ]
    assert (paris["type"], paris["call_id"], json.loads(paris["arguments"])) == (
        "function_call",
        "toolu_01A09q90qw90lq917835lq9",
        {"city": "Paris"},
    )
    assert json.loads(berlin["arguments"]) == {"city": "Berlin", "unit": "celsius"}
    assert len({item["id"] for item in response["output"]}) == 4
    assert response["usage"] == {
        "input_tokens": 472 + 1024 + 2048,
        "input_tokens_details": {"cached_tokens": 2048, "cache_write_tokens": 1024},
        "output_tokens": 160,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 472 + 1024 + 2048 + 160,
    }


def test_a_chat_completion_becomes_a_response_object() -> None:
    text = json.loads(responses_openai.response(sample("openai_chat_completion.json"), frame()))
    assert text["output"][0]["type"] == "message"
    completion = json.loads(sample("openai_chat_completion.json"))
    assert text["output"][0]["content"][0]["text"] == completion["choices"][0]["message"]["content"]
    assert text["usage"]["input_tokens"] == completion["usage"]["prompt_tokens"]
    calls = json.loads(
        responses_openai.response(sample("openai_chat_completion_tool_calls.json"), frame())
    )
    recorded = json.loads(sample("openai_chat_completion_tool_calls.json"))
    assert [(c["call_id"], c["name"], c["arguments"]) for c in calls["output"]] == [
        (c["id"], c["function"]["name"], c["function"]["arguments"])
        for c in recorded["choices"][0]["message"]["tool_calls"]
    ]


def test_a_stopped_answer_is_incomplete_with_its_reason() -> None:
    message = json.loads(sample("anthropic_message_text.json"))
    message["stop_reason"] = "max_tokens"
    response = json.loads(responses_anthropic.response(json.dumps(message).encode(), frame()))
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}


def test_the_response_object_repeats_the_requests_settings() -> None:
    body = sample("responses_request.json")
    response = json.loads(
        responses_anthropic.response(sample("anthropic_message_text.json"), frame(body))
    )
    request = json.loads(body)
    for name in ("instructions", "max_output_tokens", "temperature", "text", "tools", "metadata"):
        assert response[name] == request[name], name
    assert response["tool_choice"] == "auto" and response["parallel_tool_calls"] is False
    assert response["reasoning"] == {"effort": "low"}


# -- streams --------------------------------------------------------------------------------------


def translate_stream(translator: Any, pieces: list[bytes]) -> bytes:
    return b"".join(translator.feed(piece) for piece in pieces) + translator.finish()


def test_an_anthropic_stream_becomes_typed_events_ending_in_the_plain_answer() -> None:
    translator = responses_anthropic.StreamTranslator(frame())
    out = events(translate_stream(translator, [sample("anthropic_stream_tool_use.sse")]))
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    assert [e["type"] for e in out][:6] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
    ]
    assert out[-1]["type"] == "response.completed"
    plain = json.loads(
        responses_anthropic.response(sample("anthropic_message_tool_use.json"), frame())
    )
    completed = out[-1]["response"]
    assert completed["output"] == plain["output"]
    assert completed["usage"] == plain["usage"]
    assert {e["response"]["id"] for e in out if "response" in e} == {plain["id"]}
    # Every item is added, then done, before the next one is added.
    added = [e["output_index"] for e in out if e["type"] == "response.output_item.added"]
    done = [e["output_index"] for e in out if e["type"] == "response.output_item.done"]
    assert added == done == [0, 1, 2, 3]
    assert translator.usage == TokenUsage(3544, 160, 2048, 1024, 0)
    assert translator.model == CLAUDE and not translator.errored


def test_a_chat_stream_of_tool_calls_becomes_function_call_events() -> None:
    translator = responses_openai.StreamTranslator(frame())
    out = events(translate_stream(translator, [sample("openai_stream_tool_calls.sse")]))
    completed = out[-1]
    assert completed["type"] == "response.completed"
    deltas = "".join(
        e["delta"] for e in out if e["type"] == "response.function_call_arguments.delta"
    )
    calls = completed["response"]["output"]
    assert "".join(c["arguments"] for c in calls) == deltas
    assert completed["response"]["usage"]["output_tokens_details"] == {"reasoning_tokens": 128}
    assert translator.usage is not None and translator.usage.reasoning_tokens == 128


@pytest.mark.parametrize(
    ("translator", "name"),
    [
        (responses_anthropic.StreamTranslator, "anthropic_stream_error.sse"),
        (responses_openai.StreamTranslator, "openai_stream_error.sse"),
    ],
)
def test_a_provider_error_in_a_stream_ends_it_as_a_failed_response(
    translator: Any, name: str
) -> None:
    stream = translator(frame())
    out = events(translate_stream(stream, [sample(name)]))
    failed = out[-1]
    assert failed["type"] == "response.failed"
    assert failed["sequence_number"] == len(out) - 1
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["code"] == "server_error"
    # What arrived before the failure is there, its item closed.
    [item] = failed["response"]["output"]
    assert item["content"][0]["text"] == "Once upon"
    assert stream.errored


def test_a_stream_that_fails_before_it_began_ends_with_an_error_event() -> None:
    stream = responses_anthropic.StreamTranslator(frame())
    failure = b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n'
    out = events(translate_stream(stream, [failure]))
    assert [(e["type"], e["code"], e["sequence_number"]) for e in out] == [
        ("error", "provider_error", 0)
    ]
    assert out[0]["message"] == "Overloaded" and stream.errored


def test_a_stream_cut_before_its_answer_ended_is_an_error() -> None:
    recorded = sample("anthropic_stream_text.sse")
    cut = recorded[: recorded.index(b"event: content_block_stop")]
    stream = responses_anthropic.StreamTranslator(frame())
    out = events(translate_stream(stream, [cut]))
    assert out[-1]["type"] == "response.failed" and stream.errored


STREAMS = [
    (responses_anthropic.StreamTranslator, "anthropic_stream_tool_use.sse"),
    (responses_anthropic.StreamTranslator, "anthropic_stream_text.sse"),
    (responses_openai.StreamTranslator, "openai_stream_tool_calls.sse"),
    (responses_openai.StreamTranslator, "openai_stream_text.sse"),
]


@pytest.mark.parametrize(("translator", "name"), STREAMS)
@PROPERTIES
@given(data=st.data())
def test_a_translated_stream_is_the_same_however_it_is_cut(
    translator: Any, name: str, data: Any
) -> None:
    recorded = sample(name)
    whole = translate_stream(translator(frame()), [recorded])
    pieces = data.draw(cuts(recorded))
    assert translate_stream(translator(frame()), pieces) == whole


# -- a provider that serves the Responses API -----------------------------------------------------

UPSTREAM_ID = "resp_68c1f0b4d1a08190a6f7e2c3b5d9a1e40bb6a6b452d3795b"


def passed(pieces: list[bytes]) -> tuple[bytes, PassThrough]:
    pipe = PassThrough(lambda found: [(json.dumps(found).encode(), b'"resp_client"')])
    return b"".join(pipe.feed(piece) for piece in pieces) + pipe.finish(), pipe


def test_a_stream_passes_through_with_only_its_response_id_swapped() -> None:
    recorded = sample("openai_responses_stream.sse")
    out, pipe = passed([recorded])
    assert UPSTREAM_ID.encode() not in out
    assert out == recorded.replace(UPSTREAM_ID.encode(), b"resp_client")
    assert pipe.usage == TokenUsage(96, 180, 64, 0, 128)
    assert pipe.model == "gpt-5-mini-2025-08-07"
    assert pipe.sequence == 17 and not pipe.errored


@PROPERTIES
@given(pieces=cuts(sample("openai_responses_stream.sse"), most=40))
def test_a_passed_through_stream_is_the_same_however_it_is_cut(pieces: list[bytes]) -> None:
    whole, _ = passed([sample("openai_responses_stream.sse")])
    out, pipe = passed(pieces)
    assert out == whole
    assert pipe.usage == TokenUsage(96, 180, 64, 0, 128)

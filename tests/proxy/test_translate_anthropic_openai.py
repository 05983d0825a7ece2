"""Anthropic client, OpenAI-format provider: requests, answers, errors and streams on recorded wire
data, and round trips through both translators."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.errors import ProxyError
from proxy.translate import anthropic_openai, openai_anthropic
from proxy.translate.anthropic_openai import StreamTranslator
from proxy.usage import TokenUsage
from tests.support.streams import cuts
from vkgate.errors import ErrorCode

SAMPLES = Path(__file__).parent / "samples"
MODEL = "gpt-4o-2024-08-06"


def sample(name: str) -> bytes:
    return (SAMPLES / name).read_bytes()


def translate(body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(anthropic_openai.request(json.dumps(body).encode(), MODEL))
    return out


def messages_request(**fields: Any) -> dict[str, Any]:
    return {
        "model": "alias",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}],
        **fields,
    }


def refusal(body: dict[str, Any] | bytes) -> ProxyError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(ProxyError) as caught:
        anthropic_openai.request(raw, MODEL)
    assert caught.value.code == ErrorCode.INVALID_REQUEST
    assert caught.value.status == 400
    return caught.value


# -- requests --------------------------------------------------------------------------------------

CITY_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_the_recorded_request_translates_every_field() -> None:
    out = json.loads(anthropic_openai.request(sample("anthropic_request.json"), MODEL))
    assert out == {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are a weather assistant."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is the weather in Paris? Here is a map."},
                    {
                        "type": "image_url",
                        "image_url": {
                            "url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAf"
                            "FcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
                        },
                    },
                    {
                        "type": "image_url",
                        "image_url": {"url": "https://example.com/maps/france.jpg"},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": "Let me look it up.",
                "tool_calls": [
                    {
                        "id": "toolu_01A09q90qw90lq917835lq9",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "toolu_01A09q90qw90lq917835lq9",
                "content": "18 C, sunny",
            },
            {"role": "user", "content": [{"type": "text", "text": "Is that warm?"}]},
        ],
        "max_tokens": 1024,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": ["END"],
        "stream": False,
        "user": "user-1234",
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Current weather in a city",
                    "parameters": CITY_SCHEMA,
                },
            }
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
    }


def test_the_model_is_the_providers_not_the_alias() -> None:
    assert translate(messages_request())["model"] == MODEL


def test_a_system_string_and_several_system_blocks_become_one_system_message() -> None:
    assert translate(messages_request(system="Be brief."))["messages"][0] == {
        "role": "system",
        "content": "Be brief.",
    }
    blocks = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert translate(messages_request(system=blocks))["messages"][0] == {
        "role": "system",
        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
    }


def test_tool_results_become_tool_messages_in_place() -> None:
    content = [
        {"type": "text", "text": "before"},
        {"type": "tool_result", "tool_use_id": "a", "content": "A"},
        {"type": "tool_result", "tool_use_id": "b", "content": [{"type": "text", "text": "B"}]},
        {"type": "tool_result", "tool_use_id": "c"},
        {"type": "text", "text": "after"},
    ]
    out = translate(messages_request(messages=[{"role": "user", "content": content}]))
    assert out["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "before"}]},
        {"role": "tool", "tool_call_id": "a", "content": "A"},
        {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "B"}]},
        {"role": "tool", "tool_call_id": "c", "content": ""},
        {"role": "user", "content": [{"type": "text", "text": "after"}]},
    ]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("boom", "Error: boom"),
        (None, "Error"),
        (
            [{"type": "text", "text": "boom"}, {"type": "text", "text": "twice"}],
            [{"type": "text", "text": "Error: boom"}, {"type": "text", "text": "twice"}],
        ),
    ],
)
def test_a_failed_tool_result_stays_visibly_a_failure(content: Any, expected: Any) -> None:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": "a", "is_error": True}
    if content is not None:
        block["content"] = content
    out = translate(messages_request(messages=[{"role": "user", "content": [block]}]))
    assert out["messages"] == [{"role": "tool", "tool_call_id": "a", "content": expected}]


def test_assistant_text_blocks_become_content_and_tool_use_tool_calls() -> None:
    content = [
        {"type": "text", "text": "one"},
        {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": [1, {"y": None}]}},
        {"type": "text", "text": "two"},
        {"type": "tool_use", "id": "t2", "name": "g", "input": {}},
    ]
    out = translate(messages_request(messages=[{"role": "assistant", "content": content}]))
    message = out["messages"][0]
    assert message["content"] == [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    assert [(c["id"], c["function"]["name"]) for c in message["tool_calls"]] == [
        ("t1", "f"),
        ("t2", "g"),
    ]
    arguments = [json.loads(c["function"]["arguments"]) for c in message["tool_calls"]]
    assert arguments == [{"x": [1, {"y": None}]}, {}]


def test_an_assistant_turn_of_tool_calls_only_has_null_content() -> None:
    content = [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]
    out = translate(messages_request(messages=[{"role": "assistant", "content": content}]))
    assert out["messages"][0]["content"] is None


def test_cache_control_markers_are_accepted_everywhere() -> None:
    marker = {"type": "ephemeral"}
    body = messages_request(
        cache_control=marker,
        system=[{"type": "text", "text": "s", "cache_control": marker}],
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "t", "cache_control": marker},
                    {
                        "type": "image",
                        "source": {"type": "url", "url": "https://example.com/a.png"},
                        "cache_control": marker,
                    },
                ],
            },
        ],
        tools=[{"name": "f", "input_schema": {"type": "object"}, "cache_control": marker}],
    )
    assert "cache_control" not in json.dumps(translate(body))


def test_tools_become_function_tools() -> None:
    tools = [
        {"name": "f", "input_schema": CITY_SCHEMA},
        {
            "type": "custom",
            "name": "g",
            "description": "d",
            "input_schema": {"type": "object"},
            "strict": True,
        },
    ]
    assert translate(messages_request(tools=tools))["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": CITY_SCHEMA}},
        {
            "type": "function",
            "function": {
                "name": "g",
                "description": "d",
                "parameters": {"type": "object"},
                "strict": True,
            },
        },
    ]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, {"tool_choice": "auto"}),
        ({"type": "any"}, {"tool_choice": "required"}),
        ({"type": "none"}, {"tool_choice": "none"}),
        (
            {"type": "tool", "name": "f"},
            {"tool_choice": {"type": "function", "function": {"name": "f"}}},
        ),
        (
            {"type": "any", "disable_parallel_tool_use": True},
            {"tool_choice": "required", "parallel_tool_calls": False},
        ),
        ({"type": "auto", "disable_parallel_tool_use": False}, {"tool_choice": "auto"}),
    ],
)
def test_tool_choice_becomes_openais(choice: dict[str, Any], expected: dict[str, Any]) -> None:
    out = translate(messages_request(tools=[{"name": "f", "input_schema": {}}], tool_choice=choice))
    assert {k: out[k] for k in ("tool_choice", "parallel_tool_calls") if k in out} == expected


def test_a_stream_asks_the_provider_for_its_usage() -> None:
    out = translate(messages_request(stream=True))
    assert (out["stream"], out["stream_options"]) == (True, {"include_usage": True})
    assert "stream_options" not in translate(messages_request(stream=False))


def test_sampling_fields_and_the_end_user_carry_over() -> None:
    out = translate(
        messages_request(
            temperature=0.3, top_p=0.5, stop_sequences=["x", "y"], metadata={"user_id": "u-1"}
        )
    )
    assert (out["temperature"], out["top_p"], out["stop"], out["user"]) == (
        0.3,
        0.5,
        ["x", "y"],
        "u-1",
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"thinking": {"type": "disabled"}},
        {"top_k": None},
        {"service_tier": "auto"},
        {"metadata": {"user_id": None}},
        {"stop_sequences": []},
        {"system": None},
    ],
    ids=lambda fields: ",".join(fields),
)
def test_fields_at_their_harmless_default_are_accepted(fields: dict[str, Any]) -> None:
    translate(messages_request(**fields))


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"top_k": 40}, "top_k"),
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking"),
        ({"thinking": {"type": "adaptive"}}, "thinking"),
        ({"container": "container_1"}, "container"),
        ({"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]}, "mcp_servers"),
        ({"service_tier": "standard_only"}, "service_tier"),
        ({"metadata": {"user_id": "u", "team": "t"}}, "metadata.team"),
        ({"context_management": {"edits": []}}, "context_management"),
        ({"output_config": {"effort": "low"}}, "output_config"),
        (
            {"tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 5}]},
            "tools[0].type",
        ),
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0].type"),
        (
            {"tools": [{"name": "f", "input_schema": {}, "defer_loading": True}]},
            "tools[0].defer_loading",
        ),
        ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
        ({"tool_choice": {"type": "auto", "extra": 1}}, "tool_choice.extra"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_untranslatable_fields_are_refused_naming_them(fields: dict[str, Any], param: str) -> None:
    error = refusal(messages_request(**fields))
    assert error.param == param
    assert f"`{param}`" in error.message


DOCUMENT = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "d"}}


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "user", "content": [DOCUMENT]}, "messages[0].content[0].type"),
        (
            {
                "role": "user",
                "content": [{"type": "search_result", "source": "s", "title": "t", "content": []}],
            },
            "messages[0].content[0].type",
        ),
        (
            {
                "role": "assistant",
                "content": [{"type": "thinking", "thinking": "t", "signature": "s"}],
            },
            "messages[0].content[0].type",
        ),
        (
            {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "d"}]},
            "messages[0].content[0].type",
        ),
        (
            {
                "role": "assistant",
                "content": [
                    {"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}}
                ],
            },
            "messages[0].content[0].type",
        ),
        (
            {
                "role": "user",
                "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}],
            },
            "messages[0].content[0].source.type",
        ),
        (
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "t", "citations": [{"type": "char_location"}]}
                ],
            },
            "messages[0].content[0].citations",
        ),
        (
            {
                "role": "user",
                "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
            },
            "messages[0].content[0]",
        ),
        (
            {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
            "messages[0].content[0]",
        ),
        (
            {
                "role": "assistant",
                "content": [{"type": "image", "source": {"type": "url", "url": "https://x/a.png"}}],
            },
            "messages[0].content[0]",
        ),
        (
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t",
                        "content": [
                            {"type": "image", "source": {"type": "url", "url": "https://x/a.png"}}
                        ],
                    }
                ],
            },
            "messages[0].content[0].content[0]",
        ),
        (
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "f", "input": [1]}],
            },
            "messages[0].content[0].input",
        ),
        ({"role": "system", "content": "x"}, "messages[0].role"),
        ({"role": "user", "content": "x", "name": "bob"}, "messages[0].name"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_untranslatable_blocks_are_refused_naming_them(message: dict[str, Any], param: str) -> None:
    assert refusal(messages_request(messages=[message])).param == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (json.dumps({"model": "m", "messages": []}).encode(), "max_tokens"),
        (json.dumps(messages_request(max_tokens="many")).encode(), "max_tokens"),
        (json.dumps(messages_request(temperature=[1])).encode(), "temperature"),
        (json.dumps(messages_request(messages=[{"role": "user"}])).encode(), "messages[0].content"),
    ],
    ids=["malformed", "no-max-tokens", "max-tokens-type", "temperature-type", "no-content"],
)
def test_malformed_requests_are_refused_naming_the_field(body: bytes, param: str | None) -> None:
    assert refusal(body).param == param


def test_refusals_never_repeat_the_prompt() -> None:
    secret = "my secret prompt text"
    bodies = [
        messages_request(
            messages=[{"role": "user", "content": [{"type": "text", "text": secret, "x": 1}]}]
        ),
        messages_request(messages=[{"role": "user", "content": [{"type": secret}]}]),
        messages_request(system=secret, top_k=1),
    ]
    for body in bodies:
        assert "secret" not in refusal(body).message


# -- whole answers ---------------------------------------------------------------------------------


def answer(data: bytes) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(anthropic_openai.response(data))
    return out


def test_a_chat_completion_becomes_a_message() -> None:
    assert answer(sample("openai_chat_completion.json")) == {
        "id": "msg_B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": [
            {"type": "text", "text": "Paris is warmer today: 18 C against 12 C in Berlin."}
        ],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 1117 - 1024,
            "output_tokens": 46,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 1024,
        },
    }


def test_tool_calls_become_tool_use_blocks_with_object_input() -> None:
    out = answer(sample("openai_chat_completion_tool_calls.json"))
    assert out["content"] == [
        {
            "type": "tool_use",
            "id": "call_Paris8Xk2",
            "name": "get_weather",
            "input": {"city": "Paris"},
        },
        {
            "type": "tool_use",
            "id": "call_Berlin3Qm",
            "name": "get_weather",
            "input": {"city": "Berlin", "unit": "celsius"},
        },
    ]
    assert out["stop_reason"] == "tool_use"
    assert out["usage"]["output_tokens_details"] == {"thinking_tokens": 128}


def completion(message: dict[str, Any], finish_reason: str = "stop") -> bytes:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", **message},
                "finish_reason": finish_reason,
            }
        ],
    }
    return json.dumps(body).encode()


def call(arguments: str) -> dict[str, Any]:
    return {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}


def test_empty_arguments_are_an_empty_input() -> None:
    out = answer(completion({"content": None, "tool_calls": [call("")]}, "tool_calls"))
    assert out["content"] == [{"type": "tool_use", "id": "c", "name": "f", "input": {}}]


def test_a_call_cut_off_by_max_tokens_is_left_out() -> None:
    out = answer(completion({"content": "Sure", "tool_calls": [call('{"city": "Par')]}, "length"))
    assert out["content"] == [{"type": "text", "text": "Sure"}]
    assert out["stop_reason"] == "max_tokens"


@pytest.mark.parametrize("arguments", ['{"city": "Par', "[1]", "null"])
def test_unreadable_arguments_of_a_finished_answer_are_a_provider_error(arguments: str) -> None:
    with pytest.raises(ProxyError) as caught:
        anthropic_openai.response(completion({"tool_calls": [call(arguments)]}, "tool_calls"))
    assert caught.value.code == ErrorCode.PROVIDER_ERROR


def test_a_refusal_becomes_text_with_stop_reason_refusal() -> None:
    out = answer(completion({"content": None, "refusal": "I can't."}, "content_filter"))
    assert (out["content"], out["stop_reason"]) == (
        [{"type": "text", "text": "I can't."}],
        "refusal",
    )


def test_an_answer_without_usage_reports_zero_usage() -> None:
    usage = answer(completion({"content": "x"}))["usage"]
    assert usage == {
        "input_tokens": 0,
        "output_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


@pytest.mark.parametrize(
    ("finish_reason", "stop_reason"),
    [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("tool_calls", "tool_use"),
        ("function_call", "tool_use"),
        ("content_filter", "refusal"),
        ("a_reason_from_tomorrow", "end_turn"),
    ],
)
def test_finish_reasons_become_stop_reasons(finish_reason: str, stop_reason: str) -> None:
    assert answer(completion({"content": "x"}, finish_reason))["stop_reason"] == stop_reason


@pytest.mark.parametrize("data", [b"", b"<html>", b'{"choices": []}', b'{"choices": [{}]}'])
def test_an_unreadable_answer_is_a_provider_error(data: bytes) -> None:
    with pytest.raises(ProxyError) as caught:
        anthropic_openai.response(data)
    assert caught.value.code == ErrorCode.PROVIDER_ERROR


# -- errors ----------------------------------------------------------------------------------------


def test_an_openai_error_becomes_anthropics_keeping_its_message() -> None:
    out = json.loads(anthropic_openai.error(429, sample("openai_error.json")))
    assert out["type"] == "error"
    assert out["error"]["type"] == "rate_limit_error"
    assert out["error"]["message"].startswith("Rate limit reached for gpt-4o")


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (422, "invalid_request_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "overloaded_error"),
        (529, "overloaded_error"),
    ],
)
def test_the_anthropic_error_type_follows_the_status(status: int, kind: str) -> None:
    out = json.loads(anthropic_openai.error(status, sample("openai_error.json")))
    assert out["error"]["type"] == kind


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"upstream connect error", "the provider answered with HTTP status 502"),
        (b'{"error": "model is loading"}', "model is loading"),
        (b'{"error": {"message": null}}', "the provider answered with HTTP status 502"),
    ],
)
def test_odd_error_bodies_still_give_a_message(data: bytes, message: str) -> None:
    out = json.loads(anthropic_openai.error(502, data))
    assert out == {"type": "error", "error": {"type": "api_error", "message": message}}


# -- streams ---------------------------------------------------------------------------------------


def translated(pieces: list[bytes]) -> tuple[bytes, StreamTranslator]:
    translator = StreamTranslator()
    out = b"".join(translator.feed(piece) for piece in pieces)
    return out + translator.finish(), translator


def events(stream: bytes) -> list[tuple[str, dict[str, Any]]]:
    """Each event's name and data, checking the name is the data's `type`."""
    assert stream.endswith(b"\n\n")
    out = []
    for event in stream.decode().split("\n\n")[:-1]:
        name_line, data_line = event.split("\n")
        name = name_line.removeprefix("event: ")
        data = json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name
        out.append((name, data))
    return out


def test_a_text_stream_becomes_anthropic_events_with_usage_in_message_delta() -> None:
    out, translator = translated([sample("openai_stream_text.sse")])
    assert events(out) == [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
                    "type": "message",
                    "role": "assistant",
                    "model": MODEL,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {
                        "input_tokens": 0,
                        "output_tokens": 0,
                        "cache_creation_input_tokens": 0,
                        "cache_read_input_tokens": 0,
                    },
                },
            },
        ),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        *[
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": text},
                },
            )
            for text in ["Paris", " is warmer", " today."]
        ],
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {
                    "input_tokens": 93,
                    "output_tokens": 5,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 1024,
                },
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    assert translator.usage == TokenUsage(
        input_tokens=1117, output_tokens=5, cache_read_tokens=1024
    )
    assert translator.model == MODEL
    assert not translator.errored


def test_each_tool_call_becomes_a_tool_use_block_whose_deltas_reassemble() -> None:
    out, translator = translated([sample("openai_stream_tool_calls.sse")])
    blocks: dict[int, dict[str, Any]] = {}
    stops = []
    for name, data in events(out):
        if name == "content_block_start":
            blocks[data["index"]] = {**data["content_block"], "json": ""}
        elif name == "content_block_delta":
            assert data["delta"]["type"] == "input_json_delta"
            blocks[data["index"]]["json"] += data["delta"]["partial_json"]
        elif name == "content_block_stop":
            stops.append(data["index"])
        elif name == "message_delta":
            assert data["delta"]["stop_reason"] == "tool_use"
            assert data["usage"]["output_tokens_details"] == {"thinking_tokens": 128}
    assert stops == [0, 1]
    assert [(b["type"], b["id"], b["name"], b["input"]) for b in blocks.values()] == [
        ("tool_use", "call_Paris8Xk2", "get_weather", {}),
        ("tool_use", "call_Berlin3Qm", "get_weather", {}),
    ]
    assert [json.loads(b["json"]) for b in blocks.values()] == [
        {"city": "Paris"},
        {"city": "Berlin", "unit": "celsius"},
    ]
    assert translator.usage == TokenUsage(input_tokens=82, output_tokens=217, reasoning_tokens=128)


def test_text_after_a_tool_call_opens_a_new_block() -> None:
    chunks = [
        {"id": "chatcmpl-1", "model": "m", "choices": [{"index": 0, "delta": {"content": "a"}}]},
        {
            "id": "chatcmpl-1",
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "c",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{}"},
                            }
                        ]
                    },
                }
            ],
        },
        {
            "id": "chatcmpl-1",
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": "b"}, "finish_reason": "stop"}],
        },
    ]
    stream = (
        b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    )
    names = [(name, data.get("index")) for name, data in events(translated([stream])[0])]
    assert names == [
        ("message_start", None),
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("content_block_start", 2),
        ("content_block_delta", 2),
        ("content_block_stop", 2),
        ("message_delta", None),
        ("message_stop", None),
    ]


def test_message_delta_waits_for_the_usage_chunk() -> None:
    stream = sample("openai_stream_text.sse")
    usage_at = stream.index(
        b'data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-2024-08-06","service_tier":"default","system_fingerprint":"fp_fc9f1d7035","choices":[],'
    )
    translator = StreamTranslator()
    before = translator.feed(stream[:usage_at])
    assert b"message_delta" not in before
    after = translator.feed(stream[usage_at:])
    assert b'"input_tokens":93' in after
    assert after.endswith(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')


def test_a_provider_that_sends_no_usage_still_ends_the_message() -> None:
    stream = sample("openai_stream_text.sse")
    start = stream.index(
        b'data: {"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion.chunk","created":1741570283,"model":"gpt-4o-2024-08-06","service_tier":"default","system_fingerprint":"fp_fc9f1d7035","choices":[],'
    )
    end = stream.index(b"data: [DONE]")
    out, translator = translated([stream[:start] + stream[end:]])
    delta = [data for name, data in events(out) if name == "message_delta"]
    assert delta[0]["usage"] == {"output_tokens": 0}
    assert translator.usage is None


def test_a_provider_that_sends_no_done_still_ends_the_message() -> None:
    stream = sample("openai_stream_text.sse")
    out, translator = translated([stream[: stream.index(b"data: [DONE]")]])
    assert [name for name, _ in events(out)][-2:] == ["message_delta", "message_stop"]
    assert not translator.errored


def test_an_in_stream_error_becomes_an_anthropic_error_event() -> None:
    out, translator = translated([sample("openai_stream_error.sse")])
    name, data = events(out)[-1]
    assert (name, data) == (
        "error",
        {
            "type": "error",
            "error": {
                "type": "api_error",
                "message": "The server had an error while processing your request. Sorry about that!",
            },
        },
    )
    assert translator.errored
    assert b"message_stop" not in out


def test_a_stream_that_stops_before_its_answer_ends_reports_an_error() -> None:
    stream = sample("openai_stream_text.sse")
    cut = stream.index(b'"finish_reason":"stop"')
    cut = stream.rindex(b"data:", 0, cut)
    out, translator = translated([stream[:cut]])
    assert events(out)[-1][0] == "error"
    assert translator.errored


def test_an_unreadable_chunk_ends_the_stream_with_an_error() -> None:
    out, translator = translated([b"data: {oops\n\n"])
    assert [name for name, _ in events(out)] == ["error"]
    assert translator.errored


def test_comments_and_an_azure_style_empty_first_chunk_are_skipped() -> None:
    azure_first = b'data: {"choices":[],"created":0,"id":"","model":"","object":"","prompt_filter_results":[]}\n\n'
    out, _ = translated([b": keep-alive\n\n" + azure_first + sample("openai_stream_text.sse")])
    whole, _ = translated([sample("openai_stream_text.sse")])
    assert out == whole


STREAMS = ["openai_stream_text.sse", "openai_stream_tool_calls.sse", "openai_stream_error.sse"]


@pytest.mark.parametrize("name", STREAMS)
def test_events_are_the_same_fed_one_byte_at_a_time(name: str) -> None:
    stream = sample(name)
    whole, _ = translated([stream])
    assert translated([stream[i : i + 1] for i in range(len(stream))])[0] == whole


@pytest.mark.parametrize("name", STREAMS)
@pytest.mark.parametrize("end", [b"\n", b"\r\n"], ids=["lf", "crlf"])
@given(data=st.data())
def test_events_are_the_same_for_any_cuts(name: str, end: bytes, data: st.DataObject) -> None:
    stream = sample(name).replace(b"\n", end)
    whole, expected = translated([stream])
    out, translator = translated(data.draw(cuts(stream)))
    assert out == whole
    assert (translator.usage, translator.model, translator.errored) == (
        expected.usage,
        expected.model,
        expected.errored,
    )


# -- round trips through both translators ----------------------------------------------------------


def test_an_anthropic_request_survives_the_round_trip_through_openai() -> None:
    original = {
        "model": "claude",
        "max_tokens": 1024,
        "system": "You are a weather assistant.",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Weather in Paris? A map:"},
                    {
                        "type": "image",
                        "source": {
                            "type": "base64",
                            "media_type": "image/png",
                            "data": "iVBORw0KGgo=",
                        },
                    },
                    {
                        "type": "image",
                        "source": {"type": "url", "url": "https://example.com/a.jpg"},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Looking it up."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    },
                    {
                        "type": "tool_use",
                        "id": "toolu_2",
                        "name": "get_weather",
                        "input": {"city": "Lyon"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": [{"type": "text", "text": "20 C"}],
                    },
                    {"type": "text", "text": "Warm?"},
                ],
            },
            {"role": "assistant", "content": "Yes."},
        ],
        "stop_sequences": ["END"],
        "temperature": 0.5,
        "top_p": 0.9,
        "metadata": {"user_id": "u-1"},
        "stream": True,
        "tools": [{"name": "get_weather", "description": "d", "input_schema": CITY_SCHEMA}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
    }
    openai = anthropic_openai.request(json.dumps(original).encode(), "gpt")
    back = json.loads(openai_anthropic.request(openai, "claude"))
    assert back == original


def test_an_anthropic_message_survives_the_round_trip_through_openai() -> None:
    original = json.loads(sample("anthropic_message_tool_use.json"))
    openai = openai_anthropic.response(sample("anthropic_message_tool_use.json"), 1)
    back = json.loads(anthropic_openai.response(openai))
    assert back["id"] == original["id"]
    assert back["model"] == original["model"]
    assert back["stop_reason"] == original["stop_reason"]
    assert back["content"] == [b for b in original["content"] if b["type"] != "thinking"]
    assert back["usage"] == {
        k: original["usage"][k]
        for k in (
            "input_tokens",
            "output_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
        )
    }


@pytest.mark.parametrize("name", ["anthropic_stream_text.sse", "anthropic_stream_tool_use.sse"])
def test_an_anthropic_stream_survives_the_round_trip_through_openai(name: str) -> None:
    to_openai = openai_anthropic.StreamTranslator(1, include_usage=True)
    openai = to_openai.feed(sample(name)) + to_openai.finish()
    back, translator = translated([openai])
    assert translator.usage == to_openai.usage
    assert translator.model == to_openai.model
    rebuilt = [
        data
        for kind, data in events(back)
        if kind in ("content_block_start", "content_block_delta", "message_delta")
    ]
    original_events = [
        json.loads(line[6:])
        for line in sample(name).decode().split("\n")
        if line.startswith("data: ")
    ]
    expected = [
        data
        for data in original_events
        if data["type"] in ("content_block_start", "content_block_delta", "message_delta")
        and "thinking" not in json.dumps(data)
        and "signature" not in json.dumps(data)
        and data.get("delta", {}).get("partial_json") != ""
    ]

    def text(events: list[dict[str, Any]]) -> list[Any]:
        return [
            (
                e["type"],
                e.get("content_block", {}).get("id"),
                e.get("delta", {}).get("text"),
                e.get("delta", {}).get("partial_json"),
                e.get("delta", {}).get("stop_reason"),
            )
            for e in events
        ]

    assert text(rebuilt) == text(expected)

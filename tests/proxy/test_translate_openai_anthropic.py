"""OpenAI client, Anthropic provider: requests, answers, errors and streams on recorded wire data.

Every field is translated or refused with a 400 naming it; streams give the same chunks however
the provider's bytes are cut.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.errors import ProxyError
from proxy.translate import anthropic_openai, openai_anthropic
from proxy.translate.openai_anthropic import DEFAULT_MAX_TOKENS, StreamTranslator
from proxy.usage import TokenUsage
from tests.support.streams import cuts
from vkgate.errors import ErrorCode

SAMPLES = Path(__file__).parent / "samples"
MODEL = "claude-sonnet-4-5-20250929"
CREATED = 1_767_225_600


def sample(name: str) -> bytes:
    return (SAMPLES / name).read_bytes()


def translate(body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(openai_anthropic.request(json.dumps(body).encode(), MODEL))
    return out


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "alias", "messages": [{"role": "user", "content": "hi"}], **fields}


def refusal(body: dict[str, Any] | bytes) -> ProxyError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(ProxyError) as caught:
        openai_anthropic.request(raw, MODEL)
    assert caught.value.code == ErrorCode.INVALID_REQUEST
    assert caught.value.status == 400
    return caught.value


# -- requests --------------------------------------------------------------------------------------

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
}


def test_the_recorded_request_translates_every_field() -> None:
    out = json.loads(openai_anthropic.request(sample("openai_request.json"), MODEL))
    assert out == {
        "model": MODEL,
        "max_tokens": 512,
        "system": [
            {"type": "text", "text": "You are a weather assistant."},
            {"type": "text", "text": "Answer in metric units."},
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": "What is the weather in Paris and Berlin? Here are two maps.",
                    },
                    {
                        "type": "image",
                        "source": {
                            "type": "base64",
                            "media_type": "image/png",
                            "data": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
                            "+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==",
                        },
                    },
                    {
                        "type": "image",
                        "source": {"type": "url", "url": "https://example.com/maps/europe.jpg"},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me look both up."},
                    {
                        "type": "tool_use",
                        "id": "call_paris",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    },
                    {
                        "type": "tool_use",
                        "id": "call_berlin",
                        "name": "get_weather",
                        "input": {"city": "Berlin", "unit": "celsius"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "call_paris", "content": "18 C, sunny"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "call_berlin",
                        "content": [{"type": "text", "text": "12 C, rain"}],
                    },
                    {"type": "text", "text": "Which city is warmer?"},
                ],
            },
        ],
        "temperature": 0.2,
        "top_p": 0.9,
        "stop_sequences": ["\n\nHuman:", "END"],
        "stream": False,
        "metadata": {"user_id": "user-1234"},
        "tools": [
            {
                "name": "get_weather",
                "description": "Current weather in a city",
                "input_schema": WEATHER_SCHEMA,
            }
        ],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    }


def test_the_model_is_the_providers_not_the_alias() -> None:
    assert translate(chat())["model"] == MODEL


def test_one_plain_system_message_stays_a_string() -> None:
    out = translate(chat(messages=[{"role": "system", "content": "Be brief."}, USER]))
    assert out["system"] == "Be brief."
    assert out["messages"] == [USER]


USER = {"role": "user", "content": "hi"}


def test_system_and_developer_messages_anywhere_join_system_in_order() -> None:
    messages = [
        {"role": "developer", "content": "first"},
        USER,
        {"role": "assistant", "content": "hello"},
        {"role": "system", "content": [{"type": "text", "text": "second"}]},
        {"role": "user", "content": "again"},
    ]
    out = translate(chat(messages=messages))
    assert out["system"] == [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    assert [m["role"] for m in out["messages"]] == ["user", "assistant", "user"]


def test_no_system_message_means_no_system_field() -> None:
    assert "system" not in translate(chat())


def test_consecutive_messages_of_one_role_are_merged_so_roles_alternate() -> None:
    messages = [
        {"role": "user", "content": "one"},
        {"role": "user", "content": [{"type": "text", "text": "two"}]},
        {"role": "assistant", "content": "three"},
        {"role": "assistant", "content": "four"},
    ]
    assert translate(chat(messages=messages))["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
        },
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "three"}, {"type": "text", "text": "four"}],
        },
    ]


def test_consecutive_tool_messages_become_one_user_turn_of_tool_results() -> None:
    messages = [
        USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "f", "arguments": ""}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "A"},
        {"role": "tool", "tool_call_id": "b", "content": "B"},
    ]
    out = translate(chat(messages=messages))["messages"]
    assert out[1] == {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "a", "name": "f", "input": {}},
            {"type": "tool_use", "id": "b", "name": "f", "input": {}},
        ],
    }
    assert out[2] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "a", "content": "A"},
            {"type": "tool_result", "tool_use_id": "b", "content": "B"},
        ],
    }


def test_an_earlier_refusal_is_replayed_as_the_assistants_text() -> None:
    messages = [
        USER,
        {"role": "assistant", "content": None, "refusal": "I can't help with that."},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "Nor that."}]},
    ]
    assert translate(chat(messages=messages))["messages"][1]["content"] == [
        {"type": "text", "text": "I can't help with that."},
        {"type": "text", "text": "Nor that."},
    ]


def test_tool_call_arguments_keep_their_exact_json() -> None:
    arguments = '{"q": "caf\\u00e9", "n": 1.50, "nested": {"a": [1, 2]}}'
    messages = [
        USER,
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
            ],
        },
    ]
    raw = openai_anthropic.request(json.dumps(chat(messages=messages)).encode(), MODEL)
    assert b'"input":' + arguments.encode() in raw


@pytest.mark.parametrize(
    ("arguments", "why"),
    [("{not json", "not valid JSON"), ("[1, 2]", "JSON object"), ('"text"', "JSON object")],
)
def test_tool_call_arguments_that_are_no_json_object_are_refused(arguments: str, why: str) -> None:
    messages = [
        USER,
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
            ],
        },
    ]
    error = refusal(chat(messages=messages))
    assert error.param == "messages[1].tool_calls[0].function.arguments"
    assert why in error.message


@pytest.mark.parametrize(
    ("url", "source"),
    [
        (
            "data:image/jpeg;base64,/9j/4AAQ",
            {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQ"},
        ),
        (
            "data:IMAGE/WEBP;name=x.webp;base64,UklGR",
            {"type": "base64", "media_type": "image/webp", "data": "UklGR"},
        ),
        ("http://example.com/a.gif", {"type": "url", "url": "http://example.com/a.gif"}),
    ],
)
def test_image_urls_become_image_sources(url: str, source: dict[str, Any]) -> None:
    content = [{"type": "image_url", "image_url": {"url": url}}]
    out = translate(chat(messages=[{"role": "user", "content": content}]))
    assert out["messages"][0]["content"] == [{"type": "image", "source": source}]


@pytest.mark.parametrize(
    ("image_url", "param"),
    [
        ({"url": "data:image/png,abc"}, "messages[0].content[0].image_url.url"),
        ({"url": "data:image/tiff;base64,abc"}, "messages[0].content[0].image_url.url"),
        ({"url": "ftp://example.com/a.png"}, "messages[0].content[0].image_url.url"),
        (
            {"url": "https://example.com/a.png", "detail": "high"},
            "messages[0].content[0].image_url.detail",
        ),
    ],
    ids=["not-base64", "tiff", "ftp", "detail"],
)
def test_images_anthropic_cannot_take_are_refused(image_url: dict[str, str], param: str) -> None:
    content = [{"type": "image_url", "image_url": image_url}]
    assert refusal(chat(messages=[{"role": "user", "content": content}])).param == param


def test_tools_become_anthropic_tools_with_their_schema() -> None:
    tools = [
        {"type": "function", "function": {"name": "now"}},
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "d",
                "parameters": WEATHER_SCHEMA,
                "strict": True,
            },
        },
    ]
    assert translate(chat(tools=tools))["tools"] == [
        {"name": "now", "input_schema": {"type": "object", "properties": {}}},
        {"name": "get_weather", "description": "d", "input_schema": WEATHER_SCHEMA, "strict": True},
    ]


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", {"type": "auto"}),
        ("none", {"type": "none"}),
        ("required", {"type": "any"}),
        ({"type": "function", "function": {"name": "f"}}, {"type": "tool", "name": "f"}),
    ],
)
def test_tool_choice_becomes_anthropics(choice: Any, expected: dict[str, Any]) -> None:
    assert translate(chat(tools=TOOLS, tool_choice=choice))["tool_choice"] == expected


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        (None, {"type": "auto", "disable_parallel_tool_use": True}),
        ("required", {"type": "any", "disable_parallel_tool_use": True}),
        ("none", {"type": "none"}),
    ],
)
def test_parallel_tool_calls_false_disables_parallel_tool_use(
    choice: Any, expected: dict[str, Any]
) -> None:
    out = translate(chat(tools=TOOLS, tool_choice=choice, parallel_tool_calls=False))
    assert out["tool_choice"] == expected


def test_parallel_tool_calls_true_or_without_tools_changes_nothing() -> None:
    assert "tool_choice" not in translate(chat(tools=TOOLS, parallel_tool_calls=True))
    assert "tool_choice" not in translate(chat(parallel_tool_calls=False))


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, DEFAULT_MAX_TOKENS),
        ({"max_tokens": None}, DEFAULT_MAX_TOKENS),
        ({"max_tokens": 100}, 100),
        ({"max_completion_tokens": 200}, 200),
        ({"max_tokens": 300, "max_completion_tokens": 300}, 300),
    ],
)
def test_max_tokens_is_always_sent(fields: dict[str, Any], expected: int) -> None:
    assert translate(chat(**fields))["max_tokens"] == expected


def test_max_tokens_and_max_completion_tokens_that_disagree_are_refused() -> None:
    error = refusal(chat(max_tokens=10, max_completion_tokens=20))
    assert error.param == "max_completion_tokens"


@pytest.mark.parametrize(("stop", "expected"), [("END", ["END"]), (["a", "b"], ["a", "b"])])
def test_stop_becomes_stop_sequences(stop: Any, expected: list[str]) -> None:
    assert translate(chat(stop=stop))["stop_sequences"] == expected


def test_stream_and_stream_options_are_accepted() -> None:
    out = translate(chat(stream=True, stream_options={"include_usage": True}))
    assert out["stream"] is True
    assert "stream_options" not in out


@pytest.mark.parametrize("field", ["user", "safety_identifier"])
def test_the_end_user_becomes_metadata_user_id(field: str) -> None:
    assert translate(chat(**{field: "u-1"}))["metadata"] == {"user_id": "u-1"}


def test_a_user_and_safety_identifier_that_disagree_are_refused() -> None:
    assert refusal(chat(user="a", safety_identifier="b")).param == "safety_identifier"


@pytest.mark.parametrize(
    "fields",
    [
        {"n": 1},
        {"logprobs": False},
        {"top_logprobs": 0},
        {"presence_penalty": 0},
        {"frequency_penalty": 0.0},
        {"logit_bias": {}},
        {"seed": None},
        {"store": False},
        {"metadata": {}},
        {"modalities": ["text"]},
        {"service_tier": "auto"},
        {"response_format": {"type": "text"}},
        {"stream_options": None},
        {"temperature": None, "top_p": None, "stop": None, "tools": None, "tool_choice": None},
    ],
    ids=lambda fields: ",".join(fields),
)
def test_fields_at_their_harmless_default_are_accepted(fields: dict[str, Any]) -> None:
    translate(chat(**fields))


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": -1}, "frequency_penalty"),
        ({"seed": 42}, "seed"),
        ({"store": True}, "store"),
        ({"metadata": {"k": "v"}}, "metadata"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
        ({"reasoning_effort": "high"}, "reasoning_effort"),
        ({"service_tier": "flex"}, "service_tier"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        ({"prompt_cache_key": "k"}, "prompt_cache_key"),
        ({"verbosity": "low"}, "verbosity"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"temperature": 1.5}, "temperature"),
        ({"tool_choice": {"type": "allowed_tools", "allowed_tools": {}}}, "tool_choice"),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0].type"),
        ({"stream_options": {"include_usage": True, "chunked": 1}}, "stream_options.chunked"),
        ({"thinking": {"type": "enabled"}}, "thinking"),
        ({"top_k": 5}, "top_k"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_untranslatable_fields_are_refused_naming_them(fields: dict[str, Any], param: str) -> None:
    error = refusal(chat(**fields))
    assert error.param == param
    assert f"`{param}`" in error.message


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "user", "content": "hi", "name": "bob"}, "messages[0].name"),
        ({"role": "system", "content": "hi", "name": "bob"}, "messages[0].name"),
        ({"role": "user", "content": "hi", "cache_control": {}}, "messages[0].cache_control"),
        (
            {"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]},
            "messages[0].content[0].type",
        ),
        (
            {"role": "user", "content": [{"type": "file", "file": {}}]},
            "messages[0].content[0].type",
        ),
        ({"role": "function", "name": "f", "content": "x"}, "messages[0].role"),
        ({"role": "assistant", "content": "x", "audio": {"id": "a"}}, "messages[0].audio"),
        (
            {"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}},
            "messages[0].function_call",
        ),
        (
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "c", "type": "custom", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            "messages[0].tool_calls[0].type",
        ),
        ({"role": "assistant", "content": None}, "messages[0].content"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_untranslatable_message_fields_are_refused_naming_them(
    message: dict[str, Any], param: str
) -> None:
    assert refusal(chat(messages=[message])).param == param


def test_an_unknown_top_level_field_is_refused_naming_it() -> None:
    error = refusal(chat(brand_new_option=True))
    assert error.param == "brand_new_option"
    assert "brand_new_option" in error.message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[]", None),
        (json.dumps(chat(temperature="hot")).encode(), "temperature"),
        (json.dumps(chat(max_tokens=1.5)).encode(), "max_tokens"),
        (json.dumps({"model": "m"}).encode(), "messages"),
        (json.dumps(chat(messages=[{"role": "user"}])).encode(), "messages[0].content"),
        (
            json.dumps(chat(messages=[{"role": "user", "content": 3}])).encode(),
            "messages[0].content",
        ),
        (json.dumps(chat(stop=[1])).encode(), "stop[0]"),
    ],
    ids=[
        "malformed",
        "array",
        "temperature",
        "max_tokens",
        "no-messages",
        "no-content",
        "content-type",
        "stop",
    ],
)
def test_malformed_requests_are_refused_naming_the_field(body: bytes, param: str | None) -> None:
    assert refusal(body).param == param


def test_refusals_never_repeat_the_prompt() -> None:
    secret = "my secret prompt text"
    bodies = [
        chat(messages=[{"role": "user", "content": secret, "name": "n"}]),
        chat(messages=[{"role": "user", "content": [{"type": "text", "text": secret, "x": 1}]}]),
        chat(
            messages=[
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "f", "arguments": secret},
                        }
                    ],
                }
            ]
        ),
        chat(messages=[{"role": "user", "content": [{"type": secret}]}]) | {"seed": 1},
    ]
    for body in bodies:
        assert "secret" not in refusal(body).message


# -- whole answers ---------------------------------------------------------------------------------


def answer(data: bytes) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(openai_anthropic.response(data, CREATED))
    return out


def test_a_text_message_becomes_a_chat_completion() -> None:
    assert answer(sample("anthropic_message_text.json")) == {
        "id": "chatcmpl-01XFDUDYJgAACzvnptvVoYEL",
        "object": "chat.completion",
        "created": CREATED,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Hello! How can I help you today?",
                    "refusal": None,
                },
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 12,
            "completion_tokens": 10,
            "total_tokens": 22,
            "prompt_tokens_details": {"cached_tokens": 0},
        },
    }


def test_tool_use_becomes_tool_calls_and_thinking_is_left_out() -> None:
    out = answer(sample("anthropic_message_tool_use.json"))
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "I'll check both cities."
    calls = choice["message"]["tool_calls"]
    assert [(c["id"], c["type"], c["function"]["name"]) for c in calls] == [
        ("toolu_01A09q90qw90lq917835lq9", "function", "get_weather"),
        ("toolu_01B18r81rx81mr826724mr8", "function", "get_weather"),
    ]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [
        {"city": "Paris"},
        {"city": "Berlin", "unit": "celsius"},
    ]
    assert "signature" not in json.dumps(out)


def test_cached_input_counts_in_prompt_tokens_and_cache_reads_are_cached_tokens() -> None:
    usage = answer(sample("anthropic_message_tool_use.json"))["usage"]
    assert usage == {
        "prompt_tokens": 472 + 2048 + 1024,
        "completion_tokens": 160,
        "total_tokens": 472 + 2048 + 1024 + 160,
        "prompt_tokens_details": {"cached_tokens": 2048, "cache_write_tokens": 1024},
    }


def test_thinking_tokens_are_reported_as_reasoning_tokens() -> None:
    message = {
        "id": "msg_1",
        "model": MODEL,
        "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"}],
        "stop_reason": "end_turn",
        "usage": {
            "input_tokens": 1,
            "output_tokens": 9,
            "output_tokens_details": {"thinking_tokens": 8},
        },
    }
    out = answer(json.dumps(message).encode())
    assert out["choices"][0]["message"]["content"] is None
    assert out["usage"]["completion_tokens_details"] == {"reasoning_tokens": 8}


@pytest.mark.parametrize(
    ("stop_reason", "finish_reason"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("pause_turn", "stop"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        ("a_reason_from_tomorrow", "stop"),
    ],
)
def test_stop_reasons_become_finish_reasons(stop_reason: str, finish_reason: str) -> None:
    message = {"id": "msg_1", "model": MODEL, "content": [], "stop_reason": stop_reason}
    assert answer(json.dumps(message).encode())["choices"][0]["finish_reason"] == finish_reason


@pytest.mark.parametrize("data", [b"", b"<html>", b'{"content": "text"}'])
def test_an_unreadable_answer_is_a_provider_error(data: bytes) -> None:
    with pytest.raises(ProxyError) as caught:
        openai_anthropic.response(data, CREATED)
    assert caught.value.code == ErrorCode.PROVIDER_ERROR


# -- errors ----------------------------------------------------------------------------------------


def test_an_anthropic_error_becomes_openais_keeping_its_message() -> None:
    out = json.loads(openai_anthropic.error(529, sample("anthropic_error.json")))
    assert out == {
        "error": {
            "message": "Overloaded",
            "type": "api_error",
            "code": "overloaded_error",
            "param": None,
        }
    }


@pytest.mark.parametrize(
    ("kind", "openai_type"),
    [
        ("invalid_request_error", "invalid_request_error"),
        ("authentication_error", "authentication_error"),
        ("permission_error", "permission_error"),
        ("not_found_error", "not_found_error"),
        ("request_too_large", "invalid_request_error"),
        ("rate_limit_error", "rate_limit_error"),
        ("api_error", "api_error"),
        ("overloaded_error", "api_error"),
    ],
)
def test_anthropic_error_types_map_to_openai_types(kind: str, openai_type: str) -> None:
    body = json.dumps({"type": "error", "error": {"type": kind, "message": "m"}}).encode()
    assert json.loads(openai_anthropic.error(400, body))["error"]["type"] == openai_type


@pytest.mark.parametrize(
    ("status", "openai_type"),
    [(401, "authentication_error"), (429, "rate_limit_error"), (502, "api_error")],
)
def test_an_unreadable_error_body_gives_a_message_naming_the_status(
    status: int, openai_type: str
) -> None:
    out = json.loads(openai_anthropic.error(status, b"<html>Bad Gateway</html>"))
    assert str(status) in out["error"]["message"]
    assert out["error"]["type"] == openai_type


# -- streams ---------------------------------------------------------------------------------------


def translated(pieces: list[bytes], include_usage: bool = True) -> tuple[bytes, StreamTranslator]:
    translator = StreamTranslator(CREATED, include_usage)
    out = b"".join(translator.feed(piece) for piece in pieces)
    return out + translator.finish(), translator


def events(stream: bytes) -> list[Any]:
    assert stream.endswith(b"\n\n")
    out = []
    for event in stream.split(b"\n\n")[:-1]:
        assert event.startswith(b"data: ")
        data = event[6:]
        out.append(data.decode() if data == b"[DONE]" else json.loads(data))
    return out


def test_a_text_stream_becomes_chunks_with_one_id_and_a_usage_chunk() -> None:
    out, translator = translated([sample("anthropic_stream_text.sse")])
    head = {
        "id": "chatcmpl-01XFDUDYJgAACzvnptvVoYEL",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": MODEL,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**head, "choices": [choice], "usage": None}

    assert events(out) == [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hello"}),
        chunk({"content": "! How can I help"}),
        chunk({"content": " you today?"}),
        chunk({}, "stop"),
        {
            **head,
            "choices": [],
            "usage": {
                "prompt_tokens": 12,
                "completion_tokens": 10,
                "total_tokens": 22,
                "prompt_tokens_details": {"cached_tokens": 0},
            },
        },
        "[DONE]",
    ]
    assert translator.usage == TokenUsage(input_tokens=12, output_tokens=10)
    assert translator.model == MODEL
    assert not translator.errored


def test_without_include_usage_no_chunk_carries_usage() -> None:
    out, translator = translated([sample("anthropic_stream_text.sse")], include_usage=False)
    chunks = events(out)
    assert chunks[-1] == "[DONE]"
    assert all("usage" not in c and c["choices"] for c in chunks[:-1])
    assert translator.usage == TokenUsage(input_tokens=12, output_tokens=10)


def test_tool_use_blocks_become_indexed_tool_call_deltas_that_reassemble() -> None:
    out, translator = translated([sample("anthropic_stream_tool_use.sse")])
    chunks = events(out)[:-1]
    calls: dict[int, dict[str, Any]] = {}
    text = ""
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            text += delta.get("content") or ""
            for call in delta.get("tool_calls", []):
                if "id" in call:
                    assert call["type"] == "function"
                    assert call["function"]["arguments"] == ""
                    calls[call["index"]] = {
                        "id": call["id"],
                        "name": call["function"]["name"],
                        "arguments": "",
                    }
                else:
                    calls[call["index"]]["arguments"] += call["function"]["arguments"]
    assert text == "I'll check both cities."
    assert calls == {
        0: {
            "id": "toolu_01A09q90qw90lq917835lq9",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        1: {
            "id": "toolu_01B18r81rx81mr826724mr8",
            "name": "get_weather",
            "arguments": '{"city": "Berlin", "unit": "celsius"}',
        },
    }
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
    assert chunks[-1]["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 2048,
        "cache_write_tokens": 1024,
    }
    assert translator.usage == TokenUsage(
        input_tokens=3544, output_tokens=160, cache_read_tokens=2048, cache_write_tokens=1024
    )


def test_thinking_and_pings_produce_no_chunks() -> None:
    out, _ = translated([sample("anthropic_stream_tool_use.sse")])
    assert b"thinking" not in out
    assert b"signature" not in out
    assert b"ping" not in out


def test_an_error_event_becomes_an_openai_in_stream_error_and_ends_the_stream() -> None:
    out, translator = translated([sample("anthropic_stream_error.sse")])
    chunks = events(out)
    assert chunks[-1] == {
        "error": {
            "message": "Overloaded",
            "type": "api_error",
            "code": "overloaded_error",
            "param": None,
        }
    }
    assert "[DONE]" not in chunks
    assert translator.errored
    assert translator.usage == TokenUsage(input_tokens=25, output_tokens=1)


def test_a_stream_that_stops_before_its_message_ends_reports_an_error() -> None:
    stream = sample("anthropic_stream_text.sse")
    cut = stream.index(b"event: message_delta")
    out, translator = translated([stream[:cut]])
    last = events(out)[-1]
    assert last["error"]["code"] == "provider_error"
    assert translator.errored


def test_a_stream_missing_only_message_stop_still_ends_with_done() -> None:
    stream = sample("anthropic_stream_text.sse")
    out, translator = translated([stream[: stream.index(b"event: message_stop")]])
    chunks = events(out)
    assert chunks[-2]["usage"]["completion_tokens"] == 10
    assert chunks[-1] == "[DONE]"
    assert not translator.errored


def test_done_is_sent_once_and_nothing_follows_it() -> None:
    stream = sample("anthropic_stream_text.sse")
    translator = StreamTranslator(CREATED, False)
    out = translator.feed(stream)
    assert translator.feed(stream) == b""
    assert translator.finish() == b""
    assert out.count(b"[DONE]") == 1


def test_an_unreadable_event_ends_the_stream_with_a_provider_error() -> None:
    out, translator = translated([b"event: message_start\ndata: {oops\n\n"])
    assert events(out)[-1]["error"]["code"] == "provider_error"
    assert translator.errored


def test_crlf_line_endings_give_the_same_chunks() -> None:
    stream = sample("anthropic_stream_tool_use.sse")
    whole, _ = translated([stream])
    assert translated([stream.replace(b"\n", b"\r\n")])[0] == whole


STREAMS = [
    "anthropic_stream_text.sse",
    "anthropic_stream_tool_use.sse",
    "anthropic_stream_error.sse",
]


@pytest.mark.parametrize("name", STREAMS)
def test_chunks_are_the_same_fed_one_byte_at_a_time(name: str) -> None:
    stream = sample(name)
    whole, _ = translated([stream])
    assert translated([stream[i : i + 1] for i in range(len(stream))])[0] == whole


@pytest.mark.parametrize("name", STREAMS)
@pytest.mark.parametrize("end", [b"\n", b"\r\n"], ids=["lf", "crlf"])
@given(data=st.data())
def test_chunks_are_the_same_for_any_cuts(name: str, end: bytes, data: st.DataObject) -> None:
    stream = sample(name).replace(b"\n", end)
    whole, expected = translated([stream])
    out, translator = translated(data.draw(cuts(stream)))
    assert out == whole
    assert (translator.usage, translator.model, translator.errored) == (
        expected.usage,
        expected.model,
        expected.errored,
    )


# -- round trips through both translators ------------------------------------------------------------


def round_trip(original: dict[str, Any]) -> dict[str, Any]:
    anthropic = openai_anthropic.request(json.dumps(original).encode(), MODEL)
    back: dict[str, Any] = json.loads(anthropic_openai.request(anthropic, original["model"]))
    return back


def test_an_openai_request_survives_the_round_trip_through_anthropic() -> None:
    original = {
        "model": "alias",
        "messages": [
            {"role": "system", "content": "You are a weather assistant."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Weather in Paris? A map:"},
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="},
                    },
                    {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}},
                ],
            },
            {
                "role": "assistant",
                "content": "Looking it up.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{ "city" : "Lyon" }'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
            {
                "role": "tool",
                "tool_call_id": "call_2",
                "content": [{"type": "text", "text": "20 C"}],
            },
            {"role": "user", "content": [{"type": "text", "text": "Warm?"}]},
            {"role": "assistant", "content": "Yes."},
        ],
        "max_tokens": 1024,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": ["END", "\n\n"],
        "stream": True,
        "stream_options": {"include_usage": True},
        "user": "u-1",
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "d",
                    "parameters": WEATHER_SCHEMA,
                    "strict": True,
                },
            }
        ],
        "tool_choice": "required",
        "parallel_tool_calls": False,
    }
    assert round_trip(original) == original


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
)


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for turn in range(draw(st.integers(1, 4))):
        messages.append({"role": "user", "content": draw(st.text())})
        calls = [
            {
                "id": f"call_{turn}_{i}",
                "type": "function",
                "function": {
                    "name": draw(st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_-]{0,20}", fullmatch=True)),
                    "arguments": json.dumps(
                        draw(st.dictionaries(st.text(), json_values, max_size=4))
                    ),
                },
            }
            for i in range(draw(st.integers(0, 2)))
        ]
        if not calls:
            messages.append({"role": "assistant", "content": draw(st.text())})
            continue
        content = draw(st.none() | st.text(min_size=1))
        messages.append({"role": "assistant", "content": content, "tool_calls": calls})
        for call in calls:
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": draw(st.text())}
            )
        break  # tool results end the conversation: a user turn after them would merge with them
    return messages


@given(messages=conversations())
def test_any_conversation_of_text_and_tool_calls_survives_the_round_trip(
    messages: list[dict[str, Any]],
) -> None:
    original = {"model": "alias", "messages": messages, "max_tokens": 10}
    assert round_trip(original) == original

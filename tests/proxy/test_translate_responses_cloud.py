"""Responses API client, Bedrock Converse or Gemini provider: requests, answers and streams on
recorded wire data; a stream gives the same events however the provider's bytes are cut, and
ends in the same response object as the plain answer."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.errors import ProxyError
from proxy.translate import _converse, _gemini, _responses_cloud
from proxy.translate import responses_converse as RC
from proxy.translate import responses_gemini as RG
from proxy.translate._answers import Stop
from proxy.translate._responses_answer import REDACTED
from proxy.translate._responses_request import parse
from proxy.usage import TokenUsage
from tests.proxy.test_translate_converse import stream_sample
from tests.proxy.test_translate_responses import (
    PARAMETERS,
    PIXEL,
    PROPERTIES,
    SCHEMA,
    events,
    frame,
    sample,
    translate_stream,
)
from tests.support import eventstream
from tests.support.streams import cuts
from vkgate.errors import ErrorCode

MODEL = "anthropic.claude-sonnet-4-5-20250929-v1:0"
GEMINI_MODEL = "gemini-2.5-flash"
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": PARAMETERS,
    "strict": True,
}


def raw(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


def to_converse(body: dict[str, Any]) -> dict[str, Any]:
    translated: dict[str, Any] = json.loads(RC.request(parse(raw(body), "Bedrock"), MODEL))
    return translated


def to_gemini(body: dict[str, Any]) -> dict[str, Any]:
    translated: dict[str, Any] = json.loads(RG.request(parse(raw(body), "Gemini")))
    return translated


NEW_CALL_ID = re.compile(rb"call_[0-9a-f]{24}")
CONVERSATION: dict[str, Any] = {
    "model": "m",
    "instructions": "Be brief.",
    "input": [
        {"role": "developer", "content": "Use Celsius."},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Weather here?"},
                {"type": "input_image", "image_url": f"data:image/png;base64,{PIXEL}"},
            ],
        },
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "Call the tool."}],
            "encrypted_content": "sig-1",
        },
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Looking.", "annotations": []}],
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city":"Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": '{"temp_c": 21}'},
    ],
    "tools": [WEATHER_TOOL],
    "tool_choice": "auto",
    "max_output_tokens": 300,
    "temperature": 0.3,
    "top_p": 0.9,
    "text": {"format": {"type": "json_schema", "name": "weather", "schema": SCHEMA}},
    "reasoning": {"effort": "minimal"},
    "user": "end-user-7",
    "metadata": {"ticket": "1"},
}


# -- requests -------------------------------------------------------------------------------------


def test_a_conversation_becomes_a_converse_request() -> None:
    assert to_converse(CONVERSATION) == {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"text": "Weather here?"},
                    {"image": {"format": "png", "source": {"bytes": PIXEL}}},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {
                        "reasoningContent": {
                            "reasoningText": {"text": "Call the tool.", "signature": "sig-1"}
                        }
                    },
                    {"text": "Looking."},
                    {
                        "toolUse": {
                            "toolUseId": "call_1",
                            "name": "get_weather",
                            "input": {"city": "Paris"},
                        }
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"toolResult": {"toolUseId": "call_1", "content": [{"text": '{"temp_c": 21}'}]}}
                ],
            },
        ],
        "system": [{"text": "Be brief."}, {"text": "Use Celsius."}],
        "inferenceConfig": {"maxTokens": 300, "temperature": 0.3, "topP": 0.9},
        "toolConfig": {
            "tools": [
                {
                    "toolSpec": {
                        "name": "get_weather",
                        "description": "Current weather for a city",
                        "inputSchema": {"json": PARAMETERS},
                        "strict": True,
                    }
                }
            ],
            "toolChoice": {"auto": {}},
        },
        "outputConfig": {
            "textFormat": {
                "type": "json_schema",
                "structure": {"jsonSchema": {"schema": json.dumps(SCHEMA), "name": "weather"}},
            },
            "effort": "low",
        },
    }


def test_a_conversation_becomes_a_gemini_request() -> None:
    sent = to_gemini(CONVERSATION)
    assert sent == {
        "contents": [
            {
                "role": "user",
                "parts": [
                    {"text": "Weather here?"},
                    {"inlineData": {"mimeType": "image/png", "data": PIXEL}},
                ],
            },
            {
                "role": "model",
                "parts": [
                    {"text": "Call the tool.", "thought": True, "thoughtSignature": "sig-1"},
                    {"text": "Looking."},
                    {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}},
                ],
            },
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "get_weather", "response": {"temp_c": 21}}}
                ],
            },
        ],
        "systemInstruction": {"parts": [{"text": "Be brief."}, {"text": "Use Celsius."}]},
        "generationConfig": {
            "maxOutputTokens": 300,
            "temperature": 0.3,
            "topP": 0.9,
            "responseMimeType": "application/json",
            "responseJsonSchema": SCHEMA,
            "thinkingConfig": {"thinkingLevel": "minimal"},
        },
        "tools": [
            {
                "functionDeclarations": [
                    {
                        "name": "get_weather",
                        "description": "Current weather for a city",
                        "parametersJsonSchema": PARAMETERS,
                    }
                ]
            }
        ],
        "toolConfig": {"functionCallingConfig": {"mode": "AUTO"}},
    }


def test_a_gemini_call_id_carries_its_thought_signature_back() -> None:
    signed = _gemini.call_id("c1", "CiUBVKhc7+Xk/3Qs0aB9cZ1u2Q==")
    body = {
        "input": [
            {"role": "user", "content": "Weather?"},
            {"type": "function_call", "call_id": signed, "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": signed, "output": "sunny"},
        ]
    }
    contents = to_gemini(body)["contents"]
    assert contents[1]["parts"] == [
        {
            "functionCall": {"name": "get_weather", "args": {}},
            "thoughtSignature": "CiUBVKhc7+Xk/3Qs0aB9cZ1u2Q==",
        }
    ]
    assert contents[2]["parts"] == [
        {"functionResponse": {"name": "get_weather", "response": {"content": "sunny"}}}
    ]


def test_reasoning_settings_have_each_providers_equivalent() -> None:
    summary = {"input": "hi", "reasoning": {"effort": "high", "summary": "auto"}}
    assert to_converse(summary)["outputConfig"] == {"effort": "high"}
    assert to_converse(summary)["additionalModelRequestFields"] == {
        "thinking": {"type": "adaptive"}
    }
    assert to_gemini(summary)["generationConfig"] == {
        "thinkingConfig": {"thinkingLevel": "high", "includeThoughts": True}
    }
    off = {"input": "hi", "reasoning": {"effort": "none"}}
    assert "outputConfig" not in to_converse(off)
    assert to_gemini(off)["generationConfig"] == {"thinkingConfig": {"thinkingBudget": 0}}


def test_a_redacted_or_unsigned_reasoning_item_goes_back_to_bedrock_as_it_came() -> None:
    body = {
        "input": [
            {"role": "user", "content": "hi"},
            {"type": "reasoning", "summary": [], "encrypted_content": REDACTED + "opaque"},
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "Unsigned."}],
            },
            {"role": "assistant", "content": "Hello."},
        ]
    }
    assert to_converse(body)["messages"][1]["content"] == [
        {"reasoningContent": {"redactedContent": "opaque"}},
        {"reasoningContent": {"reasoningText": {"text": "Unsigned."}}},
        {"text": "Hello."},
    ]


def test_a_message_with_nothing_to_say_makes_no_turn() -> None:
    body = {
        "input": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "output_text", "text": ""}]},
            {"role": "user", "content": "again"},
        ]
    }
    assert to_converse(body)["messages"] == [
        {"role": "user", "content": [{"text": "hi"}, {"text": "again"}]}
    ]
    assert to_gemini(body)["contents"] == [
        {"role": "user", "parts": [{"text": "hi"}, {"text": "again"}]}
    ]


def test_tool_choice_maps_to_each_providers_own() -> None:
    named = {"input": "hi", "tools": [WEATHER_TOOL]}
    forced = {**named, "tool_choice": {"type": "function", "name": "get_weather"}}
    assert to_converse(forced)["toolConfig"]["toolChoice"] == {"tool": {"name": "get_weather"}}
    assert to_gemini(forced)["toolConfig"] == {
        "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}
    }
    required = {**named, "tool_choice": "required"}
    assert to_converse(required)["toolConfig"]["toolChoice"] == {"any": {}}
    assert to_gemini(required)["toolConfig"] == {"functionCallingConfig": {"mode": "ANY"}}
    none = {**named, "tool_choice": "none"}
    assert "toolConfig" not in to_converse(none)  # Converse cannot forbid calls otherwise
    assert to_gemini(none)["toolConfig"] == {"functionCallingConfig": {"mode": "NONE"}}
    assert to_gemini({"input": "hi", "text": {"format": {"type": "json_object"}}})[
        "generationConfig"
    ] == {"responseMimeType": "application/json"}


CONVERSE_REFUSED = [
    ({"text": {"format": {"type": "json_object"}}}, "text.format"),
    ({"tools": [WEATHER_TOOL], "parallel_tool_calls": False}, "parallel_tool_calls"),
    ({"prompt_cache_key": "k"}, "prompt_cache_key"),
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"store": True}, "store"),
    ({"background": True}, "background"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    (
        {
            "input": [
                {
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": "https://x.test/a.png"}],
                }
            ]
        },
        "input[0].content[0].image_url",
    ),
    (
        {
            "input": [
                {"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]},
            ]
        },
        "input[0].content[0].file_id",
    ),
    (
        {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]},
        "input[0].arguments",
    ),
    ({"tool_choice": "required"}, "tool_choice"),
]
GEMINI_REFUSED = [
    ({"tools": [WEATHER_TOOL], "parallel_tool_calls": False}, "parallel_tool_calls"),
    ({"reasoning": {"effort": "xhigh"}}, "reasoning.effort"),
    ({"prompt_cache_key": "k"}, "prompt_cache_key"),
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"truncation": "auto"}, "truncation"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "tools[0].type"),
    (
        {"input": [{"type": "function_call_output", "call_id": "nobody", "output": "x"}]},
        "input[0].call_id",
    ),
    (
        {
            "input": [
                {"role": "user", "content": [{"type": "input_image", "image_url": "ftp://x/a"}]},
            ]
        },
        "input[0].content[0].image_url",
    ),
]


@pytest.mark.parametrize(("fields", "param"), CONVERSE_REFUSED)
def test_what_converse_cannot_say_is_refused_by_name(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(ProxyError) as caught:
        to_converse({"model": "m", "input": "hi", **fields})
    assert caught.value.code == ErrorCode.INVALID_REQUEST
    assert caught.value.param == param


@pytest.mark.parametrize(("fields", "param"), GEMINI_REFUSED)
def test_what_gemini_cannot_say_is_refused_by_name(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(ProxyError) as caught:
        to_gemini({"model": "m", "input": "hi", **fields})
    assert caught.value.code == ErrorCode.INVALID_REQUEST
    assert caught.value.param == param


# -- answers --------------------------------------------------------------------------------------


def converse_object() -> dict[str, Any]:
    answer = _converse.answer(sample("converse_response.json"), "msg_1", MODEL)
    return json.loads(_responses_cloud.response(answer, frame()))  # type: ignore[no-any-return]


def gemini_object() -> dict[str, Any]:
    answer = _gemini.answer(sample("gemini_response.json"), "msg_1", GEMINI_MODEL, "")
    return json.loads(_responses_cloud.response(answer, frame()))  # type: ignore[no-any-return]


def test_a_converse_answer_becomes_a_response_object() -> None:
    response = converse_object()
    assert response["id"] == "resp_sealed_for_the_client:msg_1"
    assert response["status"] == "completed" and response["store"] is False
    assert response["model"] == MODEL
    reasoning, message, call = response["output"]
    assert reasoning["type"] == "reasoning"
    assert reasoning["summary"] == [
        {
            "type": "summary_text",
            "text": "The user wants the weather in Paris; I should call the tool.",
        }
    ]
    assert reasoning["encrypted_content"] == "EqQBCkgIAxABGAIiQLf3Zk9vQ2s0"
    assert message["content"][0]["text"] == "Let me look that up."
    assert call == {
        "id": call["id"],
        "type": "function_call",
        "status": "completed",
        "arguments": '{"city": "Paris"}',
        "call_id": "tooluse_kZJMlvQmRJ6eAyJE5GIl7Q",
        "name": "get_weather",
    }
    # Converse counts cached input apart; a response's input counts it in.
    assert response["usage"] == {
        "input_tokens": 412 + 2048,
        "input_tokens_details": {"cached_tokens": 2048, "cache_write_tokens": 0},
        "output_tokens": 87,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 412 + 2048 + 87,
    }


def test_a_gemini_answer_becomes_a_response_object_with_its_thoughts() -> None:
    response = gemini_object()
    assert response["model"] == GEMINI_MODEL
    reasoning, message, call = response["output"]
    assert reasoning["summary"][0]["text"].startswith("**Checking the weather**")
    assert message["content"][0]["text"] == "Let me look that up."
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}
    assert _gemini.signature_of(call["call_id"]) == "CiUBVKhc7+Xk/3Qs0aB9cZ1u2Q=="
    assert response["usage"]["input_tokens_details"]["cached_tokens"] == 64
    assert response["usage"]["output_tokens"] == 25 + 45
    assert response["usage"]["output_tokens_details"] == {"reasoning_tokens": 45}


@pytest.mark.parametrize(
    ("stop", "reason"),
    [
        (Stop.MAX_TOKENS, "max_output_tokens"),
        (Stop.CONTEXT_WINDOW, "max_output_tokens"),
        (Stop.FILTERED, "content_filter"),
    ],
)
def test_a_stopped_answer_is_incomplete_with_its_reason(stop: Stop, reason: str) -> None:
    answer = _converse.answer(sample("converse_response.json"), "msg_1", MODEL)
    answer.stop = stop
    response = json.loads(_responses_cloud.response(answer, frame()))
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": reason}


# -- streams --------------------------------------------------------------------------------------


def converse_reader() -> _converse.StreamReader:
    return _converse.StreamReader(_responses_cloud.ResponsesEvents(frame()), "msg_1", MODEL)


def gemini_reader() -> _gemini.StreamReader:
    events = _responses_cloud.ResponsesEvents(frame())
    return _gemini.StreamReader(events, "msg_1", GEMINI_MODEL, "")


def test_a_converse_stream_becomes_typed_events_ending_in_the_plain_answer() -> None:
    reader = converse_reader()
    out = events(translate_stream(reader, [stream_sample()]))
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    assert reader.sequence == len(out)
    kinds = [e["type"] for e in out]
    assert kinds[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
    ]
    assert kinds[-1] == "response.completed"
    added = [e["output_index"] for e in out if e["type"] == "response.output_item.added"]
    done = [e["output_index"] for e in out if e["type"] == "response.output_item.done"]
    assert added == done == [0, 1, 2]
    arguments = [e["delta"] for e in out if e["type"] == "response.function_call_arguments.delta"]
    assert json.loads("".join(arguments)) == {"city": "Paris"}
    completed = out[-1]["response"]
    reasoning, message, call = completed["output"]
    assert reasoning["summary"][0]["text"] == "The user wants Paris weather."
    assert reasoning["encrypted_content"] == "EqQBCkgIAxABGAIiQLf3Zk9vQ2s0"
    assert message["content"][0]["text"] == "Let me look that up. Ünïcödé ✓"
    assert call["call_id"] == "tooluse_kZJMlvQmRJ6eAyJE5GIl7Q"
    assert completed["usage"] == converse_object()["usage"]
    assert reader.usage == TokenUsage(
        input_tokens=412 + 2048, output_tokens=87, cache_read_tokens=2048
    )
    assert not reader.errored


def test_a_gemini_stream_becomes_typed_events_ending_in_the_plain_answer() -> None:
    reader = gemini_reader()
    out = events(translate_stream(reader, [sample("gemini_stream.sse")]))
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    completed = out[-1]
    assert completed["type"] == "response.completed"
    plain = gemini_object()
    assert completed["response"]["usage"] == plain["usage"]
    assert [item["type"] for item in completed["response"]["output"]] == [
        "reasoning",
        "message",
        "function_call",
    ]
    call_id = completed["response"]["output"][2]["call_id"]
    assert _gemini.signature_of(call_id) == "CiUBVKhc7+Xk/3Qs0aB9cZ1u2Q=="
    assert reader.model == GEMINI_MODEL and not reader.errored


def test_an_exception_frame_ends_a_converse_stream_as_a_failed_response() -> None:
    whole = b"".join(
        eventstream.event(name, payload)
        for name, payload in json.loads(sample("converse_stream.json"))[:3]
    )
    throttled = eventstream.exception("throttlingException", "Too many tokens, slow down.")
    reader = converse_reader()
    out = events(translate_stream(reader, [whole, throttled]))
    failed = out[-1]
    assert failed["type"] == "response.failed"
    assert failed["response"]["error"]["message"] == "Too many tokens, slow down."
    assert failed["response"]["output"][0]["type"] == "reasoning"
    assert reader.errored
    before = converse_reader()
    [error] = events(translate_stream(before, [throttled]))
    assert (error["type"], error["code"]) == ("error", "provider_rate_limited")
    assert error["sequence_number"] == 0


def test_a_blocked_gemini_prompt_in_a_stream_is_an_error_event() -> None:
    blocked = b'data: {"promptFeedback": {"blockReason": "SAFETY"}}\r\n\r\n'
    reader = gemini_reader()
    out = events(translate_stream(reader, [blocked]))
    assert out[-1]["type"] == "response.failed"
    assert "SAFETY" in out[-1]["response"]["error"]["message"]
    assert reader.errored


def converse_recorded() -> bytes:
    return stream_sample()


@pytest.mark.parametrize(
    ("reader", "recorded"),
    [(converse_reader, converse_recorded), (gemini_reader, lambda: sample("gemini_stream.sse"))],
)
@PROPERTIES
@given(data=st.data())
def test_a_translated_cloud_stream_is_the_same_however_it_is_cut(
    reader: Any, recorded: Any, data: Any
) -> None:
    body = recorded()
    whole = translate_stream(reader(), [body])
    pieces = data.draw(cuts(body))
    # Gemini names no call id: each translation makes one up.
    assert NEW_CALL_ID.sub(b"call_", translate_stream(reader(), pieces)) == NEW_CALL_ID.sub(
        b"call_", whole
    )

"""OpenAI and Anthropic clients, Google's Gemini API: requests, answers, errors and SSE streams on
recorded wire data. Every field is translated or refused with a 400 naming it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.errors import ProxyError
from proxy.translate import _gemini, anthropic_gemini, openai_embeddings, openai_gemini
from proxy.usage import TokenUsage
from vkgate.errors import ErrorCode

SAMPLES = Path(__file__).parent / "samples"
MODEL = "gemini-2.5-flash"
CREATED = 1_767_225_600
SIGNATURE = "CiUBVKhc7+Xk/3Qs0aB9cZ1u2Q=="
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
}


def sample(name: str) -> Any:
    return json.loads((SAMPLES / name).read_bytes())


def from_openai(body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(openai_gemini.request(json.dumps(body).encode(), MODEL))
    return out


def from_anthropic(body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(anthropic_gemini.request(json.dumps(body).encode(), MODEL))
    return out


def refusal(translate: Any, body: dict[str, Any]) -> ProxyError:
    with pytest.raises(ProxyError) as caught:
        translate(body)
    assert caught.value.code == ErrorCode.INVALID_REQUEST and caught.value.status == 400
    return caught.value


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "alias", "messages": [{"role": "user", "content": "hi"}], **fields}


def message(**fields: Any) -> dict[str, Any]:
    return {
        "model": "alias",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}],
        **fields,
    }


# -- requests --------------------------------------------------------------------------------------


def test_the_recorded_openai_request_becomes_a_gemini_request() -> None:
    body = sample("openai_request.json")
    assert refusal(from_openai, body).param == "parallel_tool_calls"
    del body["parallel_tool_calls"]
    assert from_openai(body) == {
        "contents": [
            {
                "role": "user",
                "parts": [
                    {"text": "What is the weather in Paris and Berlin? Here are two maps."},
                    {"inlineData": {"mimeType": "image/png", "data": PNG}},
                    {
                        "fileData": {
                            "mimeType": "image/jpeg",
                            "fileUri": "https://example.com/maps/europe.jpg",
                        }
                    },
                ],
            },
            {
                "role": "model",
                "parts": [
                    {"text": "Let me look both up."},
                    {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}},
                    {
                        "functionCall": {
                            "name": "get_weather",
                            "args": {"city": "Berlin", "unit": "celsius"},
                        }
                    },
                ],
            },
            {
                "role": "user",
                "parts": [
                    {
                        "functionResponse": {
                            "name": "get_weather",
                            "response": {"content": "18 C, sunny"},
                        }
                    },
                    {
                        "functionResponse": {
                            "name": "get_weather",
                            "response": {"content": "12 C, rain"},
                        }
                    },
                    {"text": "Which city is warmer?"},
                ],
            },
        ],
        "systemInstruction": {
            "parts": [{"text": "You are a weather assistant."}, {"text": "Answer in metric units."}]
        },
        "generationConfig": {
            "maxOutputTokens": 512,
            "temperature": 0.2,
            "topP": 0.9,
            "presencePenalty": 0,
            "frequencyPenalty": 0,
            "stopSequences": ["\n\nHuman:", "END"],
        },
        "tools": [
            {
                "functionDeclarations": [
                    {
                        "name": "get_weather",
                        "description": "Current weather in a city",
                        "parametersJsonSchema": WEATHER_SCHEMA,
                    }
                ]
            }
        ],
        "toolConfig": {"functionCallingConfig": {"mode": "AUTO"}},
    }


def test_json_output_thinking_and_a_forced_function_have_their_gemini_fields() -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    out = from_openai(
        chat(
            response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
            reasoning_effort="low",
            seed=7,
            tools=[{"type": "function", "function": {"name": "f"}}],
            tool_choice={"type": "function", "function": {"name": "f"}},
        )
    )
    assert out["generationConfig"] == {
        "seed": 7,
        "responseMimeType": "application/json",
        "responseJsonSchema": schema,
        "thinkingConfig": {"thinkingLevel": "low"},
    }
    assert out["toolConfig"] == {
        "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["f"]}
    }
    assert from_openai(chat(reasoning_effort="none"))["generationConfig"] == {
        "thinkingConfig": {"thinkingBudget": 0}
    }
    assert from_openai(chat(response_format={"type": "json_object"}))["generationConfig"] == {
        "responseMimeType": "application/json"
    }


def test_a_tool_call_id_carrying_a_thought_signature_gives_it_back() -> None:
    call_id = _gemini.call_id(None, SIGNATURE)
    assert set(call_id) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
    assert _gemini.signature_of(call_id) == SIGNATURE
    assert _gemini.signature_of("call_plain") is None
    out = from_openai(
        {
            "model": "a",
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"a": 1}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": call_id, "content": '{"ok": true}'},
            ],
        }
    )
    assert out["contents"][1]["parts"] == [
        {"functionCall": {"name": "f", "args": {"a": 1}}, "thoughtSignature": SIGNATURE}
    ]
    assert out["contents"][2]["parts"] == [
        {"functionResponse": {"name": "f", "response": {"ok": True}}}
    ]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"reasoning_effort": "xhigh"}, "reasoning_effort"),
        ({"service_tier": "flex"}, "service_tier"),
        ({"frobnicate": True}, "frobnicate"),
        (
            {"messages": [{"role": "tool", "tool_call_id": "nobody", "content": "x"}]},
            "messages[0].tool_call_id",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": "https://example.com/map"}}
                        ],
                    }
                ]
            },
            "messages[0].content[0].image_url.url",
        ),
    ],
)
def test_what_gemini_cannot_say_is_refused_naming_the_field(
    fields: dict[str, Any], param: str
) -> None:
    assert refusal(from_openai, chat(**fields)).param == param


def test_the_recorded_anthropic_request_becomes_a_gemini_request() -> None:
    body = sample("anthropic_request.json")
    assert refusal(from_anthropic, body).param == "tool_choice.disable_parallel_tool_use"
    body["tool_choice"] = {"type": "any"}
    body["thinking"] = {"type": "enabled", "budget_tokens": 1024}
    body["top_k"] = 40
    out = from_anthropic(body)
    assert out["systemInstruction"] == {"parts": [{"text": "You are a weather assistant."}]}
    assert out["contents"][0]["parts"][1:] == [
        {"inlineData": {"mimeType": "image/png", "data": PNG}},
        {"fileData": {"mimeType": "image/jpeg", "fileUri": "https://example.com/maps/france.jpg"}},
    ]
    assert out["contents"][1] == {
        "role": "model",
        "parts": [
            {"text": "Let me look it up."},
            {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}},
        ],
    }
    assert out["contents"][2]["parts"] == [
        {"functionResponse": {"name": "get_weather", "response": {"content": "18 C, sunny"}}},
        {"text": "Is that warm?"},
    ]
    assert out["generationConfig"] == {
        "maxOutputTokens": 1024,
        "temperature": 0.5,
        "topP": 0.9,
        "topK": 40,
        "stopSequences": ["END"],
        "thinkingConfig": {"includeThoughts": True, "thinkingBudget": 1024},
    }
    assert out["toolConfig"] == {"functionCallingConfig": {"mode": "ANY"}}


def test_anthropic_thinking_and_failed_results_go_to_gemini_and_redacted_thinking_does_not() -> (
    None
):
    out = from_anthropic(
        message(
            messages=[
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hmm", "signature": SIGNATURE},
                        {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": "boom",
                            "is_error": True,
                        }
                    ],
                },
            ]
        )
    )
    assert out["contents"][1]["parts"][0] == {
        "text": "hmm",
        "thought": True,
        "thoughtSignature": SIGNATURE,
    }
    assert out["contents"][2]["parts"] == [
        {"functionResponse": {"name": "f", "response": {"error": "boom"}}}
    ]
    redacted = message(
        messages=[{"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]}]
    )
    assert refusal(from_anthropic, redacted).param == "messages[0].content[0]"


# -- answers -------------------------------------------------------------------------------------


def test_a_gemini_answer_as_an_openai_completion_and_as_an_anthropic_message() -> None:
    data = (SAMPLES / "gemini_response.json").read_bytes()
    completion = json.loads(openai_gemini.response(data, CREATED, "chatcmpl-unused", MODEL))
    assert completion["id"] == "chatcmpl-5Kd8aM2xBfqYz7IP7uGR8Qg"
    assert completion["model"] == "gemini-2.5-flash"
    choice = completion["choices"][0]
    assert choice["message"]["content"] == "Let me look that up.", "thoughts are left out"
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert _gemini.signature_of(call["id"]) == SIGNATURE
    assert completion["usage"] == {
        "prompt_tokens": 120,
        "completion_tokens": 70,
        "total_tokens": 190,
        "prompt_tokens_details": {"cached_tokens": 64},
        "completion_tokens_details": {"reasoning_tokens": 45},
    }
    claude = json.loads(anthropic_gemini.response(data, "msg_unused", MODEL))
    assert claude["id"] == "msg_5Kd8aM2xBfqYz7IP7uGR8Qg"
    assert [b["type"] for b in claude["content"]] == ["thinking", "text", "tool_use"]
    assert claude["stop_reason"] == "tool_use"
    assert claude["usage"]["output_tokens_details"] == {"thinking_tokens": 45}
    assert _gemini.usage_of(data) == (
        TokenUsage(input_tokens=120, output_tokens=70, cache_read_tokens=64, reasoning_tokens=45),
        "gemini-2.5-flash",
    )


def test_a_blocked_prompt_is_a_400_and_an_error_keeps_googles_message() -> None:
    blocked = (SAMPLES / "gemini_blocked.json").read_bytes()
    with pytest.raises(ProxyError) as caught:
        openai_gemini.response(blocked, CREATED, "chatcmpl-b", MODEL)
    assert caught.value.status == 400 and "PROHIBITED_CONTENT" in caught.value.message
    error = (SAMPLES / "gemini_error.json").read_bytes()
    message = sample("gemini_error.json")["error"]["message"]
    assert json.loads(openai_gemini.error(429, error))["error"]["message"] == message
    assert json.loads(anthropic_gemini.error(429, error))["error"] == {
        "type": "rate_limit_error",
        "message": message,
    }


# -- streams ---------------------------------------------------------------------------------------


def data_events(stream: bytes) -> list[dict[str, Any]]:
    return [
        json.loads(line[6:])
        for line in stream.decode().split("\n")
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


def test_a_gemini_stream_as_openai_chunks_and_as_anthropic_events() -> None:
    stream = (SAMPLES / "gemini_stream.sse").read_bytes()
    reader = openai_gemini.stream(CREATED, True, "chatcmpl-s", MODEL)
    out = reader.feed(stream) + reader.finish()
    chunks = data_events(out)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == (
        "Let me look that up. Ünïcödé ✓"
    )
    assert {c["id"] for c in chunks} == {"chatcmpl-5Kd8aM2xBfqYz7IP7uGR8Qg"}
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
    assert chunks[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": 45}
    assert reader.usage == TokenUsage(
        input_tokens=120, output_tokens=70, cache_read_tokens=64, reasoning_tokens=45
    )
    assert reader.model == "gemini-2.5-flash" and not reader.errored

    claude = anthropic_gemini.stream("msg_s", MODEL)
    events = data_events(claude.feed(stream) + claude.finish())
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text", "tool_use"]
    assert events[-2]["delta"]["stop_reason"] == "tool_use"
    assert events[-2]["usage"]["input_tokens"] == 56, (
        "cached input counted apart, as Anthropic does"
    )


def test_a_gemini_stream_that_is_blocked_errs_or_ends_early_is_an_error_event() -> None:
    blocked = (
        b"data: " + (SAMPLES / "gemini_blocked.json").read_bytes().replace(b"\n", b"") + b"\r\n\r\n"
    )
    reader = openai_gemini.stream(CREATED, False, "chatcmpl-b", MODEL)
    out = reader.feed(blocked) + reader.finish()
    assert reader.errored and b"safety filters blocked" in out
    failed = b'data: {"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}\r\n\r\n'
    claude = anthropic_gemini.stream("msg_e", MODEL)
    out = claude.feed(failed) + claude.finish()
    assert claude.errored and b"overloaded_error" in out
    stream = (SAMPLES / "gemini_stream.sse").read_bytes()
    two_events = stream[: stream.index(b"\r\n\r\n", stream.index(b"\r\n\r\n") + 4) + 4]
    cut = openai_gemini.stream(CREATED, False, "chatcmpl-c", MODEL)
    cut.feed(two_events)
    assert b"ended before its answer" in cut.finish() and cut.errored
    halfway = openai_gemini.stream(CREATED, False, "chatcmpl-h", MODEL)
    halfway.feed(stream[:300])
    assert b'"provider_error"' in halfway.finish() and halfway.errored


def test_openai_embeddings_become_a_batch_for_studio_and_for_vertex() -> None:
    body = b'{"input": ["a", "b"], "dimensions": 8}'
    studio = json.loads(openai_embeddings.google_request(body, "models/gemini-embedding-001"))
    assert studio == {
        "requests": [
            {
                "content": {"parts": [{"text": "a"}]},
                "model": "models/gemini-embedding-001",
                "outputDimensionality": 8,
            },
            {
                "content": {"parts": [{"text": "b"}]},
                "model": "models/gemini-embedding-001",
                "outputDimensionality": 8,
            },
        ]
    }
    vertex = json.loads(openai_embeddings.google_request(body, None))
    assert all("model" not in one for one in vertex["requests"])
    answer = json.loads(
        openai_embeddings.google_response(
            b'{"embeddings": [{"values": [0.1]}, {"values": [0.2]}], "usageMetadata": {"promptTokenCount": 2}}',
            "gemini-embedding-001",
            "float",
        )
    )
    assert [d["embedding"] for d in answer["data"]] == [[0.1], [0.2]]
    assert answer["usage"]["prompt_tokens"] == 2

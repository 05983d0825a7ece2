"""OpenAI and Anthropic clients, Bedrock's Converse API: requests, answers, errors and event streams
on recorded wire data. Every field is translated or refused with a 400 naming it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.errors import ProxyError
from proxy.translate import anthropic_converse, openai_converse, openai_embeddings
from proxy.translate._converse import opening, usage_of
from proxy.usage import TokenUsage
from tests.support import eventstream
from tests.support.fake_bedrock import embedding_floats
from vkgate.errors import ErrorCode

SAMPLES = Path(__file__).parent / "samples"
MODEL = "anthropic.claude-sonnet-4-5-20250929-v1:0"
CREATED = 1_767_225_600
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
}
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


def sample(name: str) -> Any:
    return json.loads((SAMPLES / name).read_bytes())


def stream_sample() -> bytes:
    return b"".join(
        eventstream.event(name, payload) for name, payload in sample("converse_stream.json")
    )


def from_openai(body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(openai_converse.request(json.dumps(body).encode(), MODEL))
    return out


def from_anthropic(body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(anthropic_converse.request(json.dumps(body).encode(), MODEL))
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


# -- OpenAI requests --------------------------------------------------------------------------------


def test_the_recorded_openai_request_becomes_a_converse_request() -> None:
    body = sample("openai_request.json")
    # Converse fetches no URL and cannot forbid parallel calls: the recorded request asks both,
    # and each is refused by name.
    assert refusal(from_openai, body).param == "messages[2].content[2].image_url.url"
    del body["messages"][2]["content"][2]
    assert refusal(from_openai, body).param == "parallel_tool_calls"
    del body["parallel_tool_calls"]
    assert from_openai(body) == {
        "system": [{"text": "You are a weather assistant."}, {"text": "Answer in metric units."}],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"text": "What is the weather in Paris and Berlin? Here are two maps."},
                    {"image": {"format": "png", "source": {"bytes": PNG}}},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"text": "Let me look both up."},
                    {
                        "toolUse": {
                            "toolUseId": "call_paris",
                            "name": "get_weather",
                            "input": {"city": "Paris"},
                        }
                    },
                    {
                        "toolUse": {
                            "toolUseId": "call_berlin",
                            "name": "get_weather",
                            "input": {"city": "Berlin", "unit": "celsius"},
                        }
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "toolResult": {
                            "toolUseId": "call_paris",
                            "content": [{"text": "18 C, sunny"}],
                        }
                    },
                    {
                        "toolResult": {
                            "toolUseId": "call_berlin",
                            "content": [{"text": "12 C, rain"}],
                        }
                    },
                    {"text": "Which city is warmer?"},
                ],
            },
        ],
        "inferenceConfig": {
            "maxTokens": 512,
            "temperature": 0.2,
            "topP": 0.9,
            "stopSequences": ["\n\nHuman:", "END"],
        },
        "toolConfig": {
            "tools": [
                {
                    "toolSpec": {
                        "name": "get_weather",
                        "description": "Current weather in a city",
                        "inputSchema": {"json": WEATHER_SCHEMA},
                    }
                }
            ],
            "toolChoice": {"auto": {}},
        },
    }


def test_json_schema_output_effort_and_service_tier_have_their_converse_fields() -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    out = from_openai(
        chat(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "reply", "schema": schema},
            },
            reasoning_effort="high",
            service_tier="flex",
            tools=[{"type": "function", "function": {"name": "f"}}],
            tool_choice={"type": "function", "function": {"name": "f"}},
        )
    )
    assert out["outputConfig"] == {
        "textFormat": {
            "type": "json_schema",
            "structure": {
                "jsonSchema": {"schema": json.dumps(schema, separators=(",", ":")), "name": "reply"}
            },
        },
        "effort": "high",
    }
    assert out["serviceTier"] == {"type": "flex"}
    assert out["toolConfig"]["toolChoice"] == {"tool": {"name": "f"}}
    assert out["toolConfig"]["tools"][0]["toolSpec"]["inputSchema"] == {
        "json": {"type": "object", "properties": {}}
    }


def test_tool_choice_none_leaves_the_tools_out_unless_the_conversation_holds_tool_calls() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert "toolConfig" not in from_openai(chat(tools=tools, tool_choice="none"))
    history = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
    ]
    error = refusal(
        from_openai, {"model": "a", "messages": history, "tools": tools, "tool_choice": "none"}
    )
    assert error.param == "tool_choice"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 2}, "n"),
        ({"seed": 7}, "seed"),
        ({"logprobs": True}, "logprobs"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"reasoning_effort": "minimal"}, "reasoning_effort"),
        ({"service_tier": "scale"}, "service_tier"),
        ({"max_tokens": 5, "max_completion_tokens": 6}, "max_completion_tokens"),
        ({"frobnicate": True}, "frobnicate"),
        ({"messages": [{"role": "user", "content": "hi", "name": "bob"}]}, "messages[0].name"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image_url",
                                "image_url": {"url": "data:image/tiff;base64,AAAA"},
                            }
                        ],
                    }
                ]
            },
            "messages[0].content[0].image_url.url",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "c",
                                "type": "function",
                                "function": {"name": "f", "arguments": "[1]"},
                            }
                        ],
                    }
                ]
            },
            "messages[0].tool_calls[0].function.arguments",
        ),
    ],
)
def test_what_converse_cannot_say_is_refused_naming_the_field(
    fields: dict[str, Any], param: str
) -> None:
    assert refusal(from_openai, chat(**fields)).param == param


def test_an_s3_image_becomes_an_s3_location() -> None:
    part = {"type": "image_url", "image_url": {"url": "s3://bucket/maps/paris.JPG"}}
    out = from_openai({"model": "a", "messages": [{"role": "user", "content": [part]}]})
    assert out["messages"][0]["content"] == [
        {
            "image": {
                "format": "jpeg",
                "source": {"s3Location": {"uri": "s3://bucket/maps/paris.JPG"}},
            }
        }
    ]


# -- Anthropic requests -----------------------------------------------------------------------------


def test_the_recorded_anthropic_request_becomes_a_converse_request_with_cache_points() -> None:
    body = sample("anthropic_request.json")
    assert refusal(from_anthropic, body).param == "messages[0].content[2].source"
    del body["messages"][0]["content"][2]
    assert refusal(from_anthropic, body).param == "tool_choice.disable_parallel_tool_use"
    body["tool_choice"] = {"type": "auto"}
    body["thinking"] = {"type": "enabled", "budget_tokens": 2048}
    body["top_k"] = 40
    assert from_anthropic(body) == {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"text": "What is the weather in Paris? Here is a map."},
                    {"image": {"format": "png", "source": {"bytes": PNG}}},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"text": "Let me look it up."},
                    {
                        "toolUse": {
                            "toolUseId": "toolu_01A09q90qw90lq917835lq9",
                            "name": "get_weather",
                            "input": {"city": "Paris"},
                        }
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "toolResult": {
                            "toolUseId": "toolu_01A09q90qw90lq917835lq9",
                            "content": [{"text": "18 C, sunny"}],
                        }
                    },
                    {"text": "Is that warm?"},
                    {"cachePoint": {"type": "default"}},
                ],
            },
        ],
        "system": [{"text": "You are a weather assistant."}, {"cachePoint": {"type": "default"}}],
        "inferenceConfig": {
            "maxTokens": 1024,
            "temperature": 0.5,
            "topP": 0.9,
            "stopSequences": ["END"],
        },
        "toolConfig": {
            "tools": [
                {
                    "toolSpec": {
                        "name": "get_weather",
                        "description": "Current weather in a city",
                        "inputSchema": {
                            "json": {
                                "type": "object",
                                "properties": {"city": {"type": "string"}},
                                "required": ["city"],
                            }
                        },
                    }
                }
            ],
            "toolChoice": {"auto": {}},
        },
        "additionalModelRequestFields": {
            "top_k": 40,
            "thinking": {"type": "enabled", "budget_tokens": 2048},
        },
    }


def test_thinking_documents_and_failed_tool_results_keep_their_meaning() -> None:
    out = from_anthropic(
        message(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "document",
                            "source": {"type": "text", "media_type": "text/plain", "data": "notes"},
                        },
                        {
                            "type": "text",
                            "text": "summarise",
                            "cache_control": {"type": "ephemeral", "ttl": "1h"},
                        },
                    ],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hmm", "signature": "sig=="},
                        {"type": "redacted_thinking", "data": "opaque"},
                        {
                            "type": "tool_use",
                            "id": "t1",
                            "name": "f",
                            "input": {},
                            "caller": {"type": "direct"},
                        },
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
            ],
            tools=[
                {
                    "name": "f",
                    "input_schema": {"type": "object"},
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        )
    )
    assert out["messages"][0]["content"] == [
        {"document": {"format": "txt", "name": "document-1", "source": {"bytes": "bm90ZXM="}}},
        {"text": "summarise"},
        {"cachePoint": {"type": "default", "ttl": "1h"}},
    ]
    assert out["messages"][1]["content"][:2] == [
        {"reasoningContent": {"reasoningText": {"text": "hmm", "signature": "sig=="}}},
        {"reasoningContent": {"redactedContent": "opaque"}},
    ]
    assert out["messages"][2]["content"] == [
        {"toolResult": {"toolUseId": "t1", "content": [{"text": "boom"}], "status": "error"}}
    ]
    assert out["toolConfig"]["tools"][1] == {"cachePoint": {"type": "default"}}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"container": "c1"}, "container"),
        ({"mcp_servers": []}, "mcp_servers"),
        ({"service_tier": "priority"}, "service_tier"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"frobnicate": 1}, "frobnicate"),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": [
                            {
                                "type": "tool_use",
                                "id": "t",
                                "name": "f",
                                "input": {},
                                "caller": {"type": "code_execution_20250825", "tool_id": "x"},
                            }
                        ],
                    }
                ]
            },
            "messages[0].content[0].caller",
        ),
    ],
)
def test_what_converse_cannot_say_of_an_anthropic_request_is_refused_naming_it(
    fields: dict[str, Any], param: str
) -> None:
    assert refusal(from_anthropic, message(**fields)).param == param


# -- answers -------------------------------------------------------------------------------------


def test_a_converse_answer_as_an_openai_completion_and_as_an_anthropic_message() -> None:
    data = (SAMPLES / "converse_response.json").read_bytes()
    completion = json.loads(openai_converse.response(data, CREATED, "chatcmpl-x1", MODEL))
    assert completion == {
        "id": "chatcmpl-x1",
        "object": "chat.completion",
        "created": CREATED,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Let me look that up.",
                    "refusal": None,
                    "tool_calls": [
                        {
                            "id": "tooluse_kZJMlvQmRJ6eAyJE5GIl7Q",
                            "type": "function",
                            # the provider's input, byte for byte
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                "logprobs": None,
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {
            "prompt_tokens": 2460,
            "completion_tokens": 87,
            "total_tokens": 2547,
            "prompt_tokens_details": {"cached_tokens": 2048},
        },
    }
    claude = json.loads(anthropic_converse.response(data, "msg_x1", MODEL))
    assert [block["type"] for block in claude["content"]] == ["thinking", "text", "tool_use"]
    assert claude["content"][0]["signature"] == "EqQBCkgIAxABGAIiQLf3Zk9vQ2s0"
    assert claude["content"][2]["input"] == {"city": "Paris"}
    assert claude["stop_reason"] == "tool_use"
    assert claude["usage"] == {
        "input_tokens": 412,
        "output_tokens": 87,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 2048,
    }
    assert usage_of(data) == (
        TokenUsage(input_tokens=2460, output_tokens=87, cache_read_tokens=2048),
        None,
    )


def test_a_bedrock_error_keeps_its_message_in_either_format() -> None:
    data = (SAMPLES / "converse_error.json").read_bytes()
    assert json.loads(openai_converse.error(400, data))["error"] == {
        "message": sample("converse_error.json")["message"],
        "type": "invalid_request_error",
        "code": "provider_error",
        "param": None,
    }
    claude = json.loads(anthropic_converse.error(429, b'{"Message": "slow down"}'))
    assert claude == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "slow down"},
    }


# -- streams ---------------------------------------------------------------------------------------


def data_events(stream: bytes) -> list[dict[str, Any]]:
    return [
        json.loads(line[6:])
        for line in stream.decode().split("\n")
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


def test_a_converse_stream_as_openai_chunks() -> None:
    reader = openai_converse.stream(CREATED, True, "chatcmpl-s1", MODEL)
    out = reader.feed(stream_sample()) + reader.finish()
    assert out.endswith(b"data: [DONE]\n\n") and not reader.errored
    chunks = data_events(out)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "Let me look that up. Ünïcödé ✓"
    calls = [
        c["choices"][0]["delta"]["tool_calls"][0]
        for c in chunks
        if c["choices"] and "tool_calls" in c["choices"][0]["delta"]
    ]
    assert (
        calls[0]["id"] == "tooluse_kZJMlvQmRJ6eAyJE5GIl7Q"
        and calls[0]["function"]["name"] == "get_weather"
    )
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {"city": "Paris"}
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "tool_calls"
    assert chunks[-1]["usage"]["prompt_tokens"] == 2460
    assert {c["id"] for c in chunks} == {"chatcmpl-s1"} and {c["model"] for c in chunks} == {MODEL}
    assert reader.usage == TokenUsage(input_tokens=2460, output_tokens=87, cache_read_tokens=2048)


def test_a_converse_stream_as_anthropic_events() -> None:
    reader = anthropic_converse.stream("msg_s1", MODEL)
    out = (reader.feed(stream_sample()) + reader.finish()).decode()
    events = [line[7:] for line in out.split("\n") if line.startswith("event: ")]
    assert events[0] == "message_start" and events[-2:] == ["message_delta", "message_stop"]
    payloads = data_events(out.encode())
    starts = [p["content_block"]["type"] for p in payloads if p["type"] == "content_block_start"]
    assert starts == ["thinking", "text", "tool_use"]
    deltas = [p["delta"] for p in payloads if p["type"] == "content_block_delta"]
    assert "".join(d.get("thinking", "") for d in deltas) == "The user wants Paris weather."
    assert [d["signature"] for d in deltas if d["type"] == "signature_delta"] == [
        "EqQBCkgIAxABGAIiQLf3Zk9vQ2s0"
    ]
    final = payloads[-2]
    assert final["delta"]["stop_reason"] == "tool_use"
    assert final["usage"]["cache_read_input_tokens"] == 2048


def test_a_corrupt_frame_or_an_exception_ends_the_stream_with_an_error() -> None:
    frames = stream_sample()
    corrupt = frames[:40] + bytes([frames[40] ^ 0xFF]) + frames[41:]
    reader = openai_converse.stream(CREATED, False, "chatcmpl-s2", MODEL)
    out = reader.feed(corrupt) + reader.finish()
    assert reader.errored and b'"provider_error"' in out and b"[DONE]" not in out
    thrown = eventstream.event("messageStart", {"role": "assistant"}) + eventstream.exception(
        "modelStreamErrorException", "the model broke"
    )
    claude = anthropic_converse.stream("msg_s2", MODEL)
    out = claude.feed(thrown) + claude.finish()
    assert claude.errored and b"event: error" in out and b"the model broke" in out
    cut = openai_converse.stream(CREATED, False, "chatcmpl-s3", MODEL)
    cut.feed(frames[: len(frames) // 2])
    assert b"ended before its answer" in cut.finish() and cut.errored


def test_a_streams_first_frame_tells_an_exception_from_an_event() -> None:
    throttled = eventstream.exception("throttlingException", "Too many requests")
    assert opening(throttled[:10]) is None
    assert opening(throttled) is not None and opening(throttled).status == 429  # type: ignore[union-attr]
    assert opening(stream_sample()).status == 200  # type: ignore[union-attr]


# -- embeddings ------------------------------------------------------------------------------------


def test_openai_embeddings_become_titan_and_cohere_bodies_and_come_back() -> None:
    titan = "amazon.titan-embed-text-v2:0"
    cohere = "cohere.embed-multilingual-v3"
    assert json.loads(
        openai_embeddings.bedrock_request(b'{"input": "hi", "dimensions": 256}', titan)
    ) == {
        "inputText": "hi",
        "dimensions": 256,
    }
    assert json.loads(openai_embeddings.bedrock_request(b'{"input": ["a", "b"]}', cohere)) == {
        "texts": ["a", "b"],
        "input_type": "search_document",
        "embedding_types": ["float"],
    }
    with pytest.raises(ProxyError, match="Titan embeds one text"):
        openai_embeddings.bedrock_request(b'{"input": ["a", "b"]}', titan)
    with pytest.raises(ProxyError, match="token arrays"):
        openai_embeddings.bedrock_request(b'{"input": [1, 2, 3]}', cohere)
    with pytest.raises(ProxyError, match="not an embedding model"):
        openai_embeddings.bedrock_request(b'{"input": "a"}', MODEL)
    answer = json.loads(
        openai_embeddings.bedrock_response(
            b'{"embedding": [0.5, -0.25], "inputTextTokenCount": 2}', titan, "base64"
        )
    )
    assert embedding_floats(answer["data"][0]["embedding"]) == [0.5, -0.25]
    assert answer["usage"] == {"prompt_tokens": 2, "total_tokens": 2}
    assert answer["model"] == titan

"""The offline `mock` provider: deterministic answers in OpenAI's wire format, honest usage."""

from __future__ import annotations

import base64
import json
import math
import struct
from typing import Any

import pytest

from proxy.providers import Operation, Upstream
from proxy.providers.mock import (
    EMBEDDING_DIMENSIONS,
    REPLY,
    MockProvider,
    MockReply,
    count_tokens,
)
from proxy.sse import UsageChunkFilter
from proxy.usage import TokenUsage
from tests.support.clock import ManualClock
from vkgate.wire import ChainTarget

HELLO = [{"role": "user", "content": "Hello there, mock!"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def mock(clock: ManualClock) -> MockProvider:
    return MockProvider(clock)


@pytest.fixture
def upstream(mock: MockProvider) -> Upstream:
    return mock.compile(
        ChainTarget(
            provider_id="prov-1", provider_name="demo", kind="mock", base_url=None, model="mock-1"
        )
    )


async def send(
    mock: MockProvider, upstream: Upstream, request: dict[str, Any], operation: Operation
) -> MockReply:
    return await mock.send(upstream, operation, json.dumps(request).encode(), {})


async def chat(mock: MockProvider, upstream: Upstream, **fields: Any) -> dict[str, Any]:
    reply = await send(
        mock, upstream, {"model": "mock-1", "messages": HELLO, **fields}, Operation.CHAT
    )
    assert reply.status == 200
    assert reply.content_type == b"application/json"
    answer: dict[str, Any] = json.loads(await reply.read())
    return answer


async def stream(mock: MockProvider, upstream: Upstream, **fields: Any) -> bytes:
    request = {"model": "mock-1", "messages": HELLO, "stream": True, **fields}
    reply = await send(mock, upstream, request, Operation.CHAT)
    assert reply.status == 200
    assert reply.content_type == b"text/event-stream"
    assert await reply.read() == b""
    return b"".join([piece async for piece in reply.chunks()])


async def embed(mock: MockProvider, upstream: Upstream, **fields: Any) -> MockReply:
    return await send(mock, upstream, {"model": "mock-1", **fields}, Operation.EMBEDDINGS)


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    """OpenAI's accounting: 3 per message plus its text, and 3 to prime the answer."""
    return sum(3 + count_tokens(m["content"]) for m in messages) + 3


def chunks(body: bytes) -> list[dict[str, Any]]:
    """The JSON chunks of a stream, after checking it is well-formed SSE ending in [DONE]."""
    assert body.endswith(b"data: [DONE]\n\n")
    events = body.split(b"\n\n")
    assert events[-1] == b""
    assert events[-2] == b"data: [DONE]"
    decoded = []
    for raw in events[:-2]:
        assert raw.startswith(b"data: ")
        assert b"\n" not in raw
        decoded.append(json.loads(raw[len(b"data: ") :]))
    return decoded


def test_count_tokens_counts_words_and_punctuation_marks() -> None:
    assert count_tokens("Hello, world!") == 4
    assert count_tokens("vkgate's mock") == 4
    assert count_tokens("  ") == 0
    assert count_tokens("") == 0


# -- chat ------------------------------------------------------------------------------------


async def test_chat_answers_in_openai_format_with_real_usage(
    mock: MockProvider, upstream: Upstream, clock: ManualClock
) -> None:
    answer = await chat(mock, upstream)
    assert answer["object"] == "chat.completion"
    assert answer["model"] == "mock-1"
    assert answer["created"] == int(clock.time())
    assert answer["id"].startswith("chatcmpl-mock-")
    assert answer["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": REPLY, "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    prompt, completion = prompt_tokens(HELLO), count_tokens(REPLY)
    assert answer["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


async def test_the_same_request_gets_the_same_answer(
    mock: MockProvider, upstream: Upstream
) -> None:
    first = await send(mock, upstream, {"model": "mock-1", "messages": HELLO}, Operation.CHAT)
    again = await send(mock, upstream, {"model": "mock-1", "messages": HELLO}, Operation.CHAT)
    assert await first.read() == await again.read()
    other = await chat(mock, upstream, temperature=0.5)
    assert other["id"] != json.loads(await first.read())["id"]


async def test_prompt_tokens_count_every_message_and_text_parts(
    mock: MockProvider, upstream: Upstream
) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        },
    ]
    reply = await send(mock, upstream, {"model": "mock-1", "messages": messages}, Operation.CHAT)
    usage = json.loads(await reply.read())["usage"]
    assert usage["prompt_tokens"] == (3 + 3) + (3 + 4) + 3


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
async def test_max_tokens_cuts_the_answer_and_says_length(
    mock: MockProvider, upstream: Upstream, field: str
) -> None:
    answer = await chat(mock, upstream, **{field: 7})
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "length"
    assert REPLY.startswith(choice["message"]["content"])
    assert count_tokens(choice["message"]["content"]) == 7
    assert answer["usage"]["completion_tokens"] == 7


async def test_max_tokens_above_the_answer_changes_nothing(
    mock: MockProvider, upstream: Upstream
) -> None:
    answer = await chat(mock, upstream, max_tokens=count_tokens(REPLY))
    assert answer["choices"][0]["message"]["content"] == REPLY
    assert answer["choices"][0]["finish_reason"] == "stop"


async def test_max_completion_tokens_wins_over_max_tokens(
    mock: MockProvider, upstream: Upstream
) -> None:
    answer = await chat(mock, upstream, max_tokens=3, max_completion_tokens=5)
    assert answer["usage"]["completion_tokens"] == 5


@pytest.mark.parametrize("kind", ["json_object", "json_schema"])
async def test_json_mode_answers_a_json_object(
    mock: MockProvider, upstream: Upstream, kind: str
) -> None:
    answer = await chat(mock, upstream, response_format={"type": kind})
    content = answer["choices"][0]["message"]["content"]
    assert json.loads(content) == {"mock": True, "reply": REPLY}
    assert answer["usage"]["completion_tokens"] == count_tokens(content)


async def test_json_mode_cut_by_max_tokens_never_uses_more_than_asked(
    mock: MockProvider, upstream: Upstream
) -> None:
    answer = await chat(mock, upstream, response_format={"type": "json_object"}, max_tokens=10)
    content = answer["choices"][0]["message"]["content"]
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == count_tokens(content) == 10
    assert json.dumps({"mock": True, "reply": REPLY}, separators=(",", ":")).startswith(content)


async def test_n_choices_are_each_counted_in_usage(mock: MockProvider, upstream: Upstream) -> None:
    answer = await chat(mock, upstream, n=3)
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2]
    assert all(c["message"]["content"] == REPLY for c in answer["choices"])
    assert answer["usage"]["completion_tokens"] == 3 * count_tokens(REPLY)


async def test_a_tool_is_called_when_the_user_spoke_last(
    mock: MockProvider, upstream: Upstream
) -> None:
    answer = await chat(mock, upstream, tools=[WEATHER_TOOL])
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert choice["message"]["tool_calls"] == [
        {
            "id": "call_mock_0",
            "type": "function",
            "function": {"name": "get_weather", "arguments": "{}"},
        }
    ]
    assert answer["usage"]["completion_tokens"] > 0


async def test_the_chosen_tool_is_the_one_called(mock: MockProvider, upstream: Upstream) -> None:
    other = {"type": "function", "function": {"name": "get_time", "parameters": {}}}
    answer = await chat(
        mock,
        upstream,
        tools=[WEATHER_TOOL, other],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    assert answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_time"


@pytest.mark.parametrize(
    "fields",
    [
        {"tools": [WEATHER_TOOL], "tool_choice": "none"},
        {
            "tools": [WEATHER_TOOL],
            "messages": [
                *HELLO,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_mock_0",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_mock_0", "content": "sunny"},
            ],
        },
    ],
    ids=["tool-choice-none", "after-the-tool-answered"],
)
async def test_text_is_answered_when_no_tool_call_is_due(
    mock: MockProvider, upstream: Upstream, fields: dict[str, Any]
) -> None:
    answer = await chat(mock, upstream, **fields)
    assert answer["choices"][0]["message"]["content"] == REPLY
    assert answer["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    "messages", [[1, 2], ["hi"], "hi", None], ids=["numbers", "strings", "a-string", "null"]
)
async def test_messages_that_are_not_objects_get_a_400_not_a_crash(
    mock: MockProvider, upstream: Upstream, messages: Any
) -> None:
    reply = await send(mock, upstream, {"model": "mock-1", "messages": messages}, Operation.CHAT)
    assert reply.status == 400
    error = json.loads(await reply.read())["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "messages"


async def test_odd_optional_fields_are_ignored_not_a_crash(
    mock: MockProvider, upstream: Upstream
) -> None:
    answer = await chat(
        mock, upstream, response_format="json", tools=["not-a-tool"], stream_options=None
    )
    assert answer["choices"][0]["message"]["content"] == REPLY


# -- streaming -------------------------------------------------------------------------------


async def test_stream_is_sse_whose_deltas_spell_the_answer(
    mock: MockProvider, upstream: Upstream
) -> None:
    events = chunks(await stream(mock, upstream))
    assert all(e["object"] == "chat.completion.chunk" and e["model"] == "mock-1" for e in events)
    assert len({e["id"] for e in events}) == 1
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    assert text == REPLY
    assert [e["choices"][0]["finish_reason"] for e in events][-1] == "stop"
    assert all(e["choices"][0]["finish_reason"] is None for e in events[:-1])
    assert all("usage" not in e for e in events)


async def test_stream_ends_with_a_usage_chunk_only_when_asked(
    mock: MockProvider, upstream: Upstream
) -> None:
    body = await stream(mock, upstream, stream_options={"include_usage": True})
    events = chunks(body)
    *content, last = events
    assert all(e["usage"] is None for e in content)
    assert last["choices"] == []
    plain = await chat(mock, upstream)
    assert last["usage"] == plain["usage"]

    usage_filter = UsageChunkFilter()
    passed = usage_filter.feed(body) + usage_filter.flush()
    assert chunks(passed) == content
    assert usage_filter.usage == TokenUsage(
        input_tokens=plain["usage"]["prompt_tokens"],
        output_tokens=plain["usage"]["completion_tokens"],
    )


async def test_stream_without_include_usage_has_no_usage_chunk(
    mock: MockProvider, upstream: Upstream
) -> None:
    events = chunks(await stream(mock, upstream, stream_options={"include_usage": False}))
    assert all(e["choices"] for e in events)


async def test_stream_cut_by_max_tokens_says_length(mock: MockProvider, upstream: Upstream) -> None:
    body = await stream(mock, upstream, max_tokens=4, stream_options={"include_usage": True})
    *content, last = chunks(body)
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in content)
    assert count_tokens(text) == 4
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert last["usage"]["completion_tokens"] == 4


async def test_stream_of_a_tool_call(mock: MockProvider, upstream: Upstream) -> None:
    events = chunks(await stream(mock, upstream, tools=[WEATHER_TOOL]))
    calls = [
        e["choices"][0]["delta"]["tool_calls"]
        for e in events
        if "tool_calls" in e["choices"][0]["delta"]
    ]
    assert calls == [
        [
            {
                "index": 0,
                "id": "call_mock_0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": "{}"},
            }
        ]
    ]
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_stream_of_n_choices_carries_each_index(
    mock: MockProvider, upstream: Upstream
) -> None:
    events = chunks(await stream(mock, upstream, n=2))
    assert all([c["index"] for c in e["choices"]] == [0, 1] for e in events)


# -- embeddings ------------------------------------------------------------------------------


async def embeddings(mock: MockProvider, upstream: Upstream, **fields: Any) -> dict[str, Any]:
    reply = await embed(mock, upstream, **fields)
    assert reply.status == 200
    answer: dict[str, Any] = json.loads(await reply.read())
    return answer


async def test_embedding_is_a_deterministic_unit_vector(
    mock: MockProvider, upstream: Upstream
) -> None:
    answer = await embeddings(mock, upstream, input="Hello, world!")
    assert answer["object"] == "list"
    assert answer["model"] == "mock-1"
    assert answer["usage"] == {"prompt_tokens": 4, "total_tokens": 4}
    [item] = answer["data"]
    assert item["object"] == "embedding"
    assert item["index"] == 0
    vector = item["embedding"]
    assert len(vector) == EMBEDDING_DIMENSIONS
    assert math.isclose(math.fsum(v * v for v in vector), 1.0)
    again = await embeddings(mock, upstream, input="Hello, world!")
    assert again["data"][0]["embedding"] == vector
    other = await embeddings(mock, upstream, input="Goodbye")
    assert other["data"][0]["embedding"] != vector


async def test_a_batch_is_embedded_in_order_and_counted_whole(
    mock: MockProvider, upstream: Upstream
) -> None:
    answer = await embeddings(mock, upstream, input=["one", "two words", "one"])
    assert [item["index"] for item in answer["data"]] == [0, 1, 2]
    assert answer["data"][0]["embedding"] == answer["data"][2]["embedding"]
    assert answer["usage"]["prompt_tokens"] == 1 + 2 + 1


@pytest.mark.parametrize(
    ("tokens", "count", "items"),
    [([1, 2, 3], 3, 1), ([[1, 2], [3]], 3, 2)],
    ids=["one-token-list", "token-lists"],
)
async def test_token_inputs_are_counted_by_length(
    mock: MockProvider, upstream: Upstream, tokens: list[Any], count: int, items: int
) -> None:
    answer = await embeddings(mock, upstream, input=tokens)
    assert answer["usage"]["prompt_tokens"] == count
    assert len(answer["data"]) == items


async def test_base64_embedding_holds_the_same_float32_values(
    mock: MockProvider, upstream: Upstream
) -> None:
    floats = (await embeddings(mock, upstream, input="text"))["data"][0]["embedding"]
    encoded = (await embeddings(mock, upstream, input="text", encoding_format="base64"))["data"][0]
    raw = base64.b64decode(encoded["embedding"])
    assert len(raw) == 4 * EMBEDDING_DIMENSIONS
    decoded = struct.unpack(f"<{EMBEDDING_DIMENSIONS}f", raw)
    assert all(
        math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7) for a, b in zip(decoded, floats, strict=True)
    )


@pytest.mark.parametrize("dimensions", [1, 8, 100, 4096])
async def test_dimensions_sets_the_vector_length(
    mock: MockProvider, upstream: Upstream, dimensions: int
) -> None:
    answer = await embeddings(mock, upstream, input="text", dimensions=dimensions)
    vector = answer["data"][0]["embedding"]
    assert len(vector) == dimensions
    assert math.isclose(math.fsum(v * v for v in vector), 1.0)


@pytest.mark.parametrize("dimensions", [0, -1, 4097, "8", 8.0, True])
async def test_impossible_dimensions_get_a_400(
    mock: MockProvider, upstream: Upstream, dimensions: Any
) -> None:
    reply = await embed(mock, upstream, input="text", dimensions=dimensions)
    assert reply.status == 400
    assert json.loads(await reply.read())["error"]["param"] == "dimensions"

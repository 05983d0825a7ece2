"""A fake provider whose answers carry everything a cached answer must keep: reasoning, text, a
tool call, a refusal, the finish reason and usage. It serves OpenAI's chat completions (the
`reasoning_content` field of vLLM and DeepSeek) and Anthropic's messages (thinking blocks with
their signature, `tool_use`), plain and streamed, each stream adding up to its plain answer.

A request whose last user message says `refuse` is refused (OpenAI's `refusal`)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.support.fake_openai import serving

API_KEY = "sk-fake-reasoning-upstream-41c2"
REASONING = ("The user greets me. ", "I should greet back ", "and look up the weather.")
TEXT = ("Hello! ", "Let me check ", "the weather.")
SIGNATURE = "sig-EqQBCkYIBxgCKkD-fake"
TOOL_ARGUMENTS = ('{"city": ', '"Paris"}')
REFUSAL = ("I can't ", "help with that.")


@dataclass
class FakeReasoning:
    url: str = ""
    """The origin: OpenAI's SDK takes it with `/v1`, Anthropic's without."""
    calls: list[dict[str, Any]] = field(default_factory=list)
    """Every request body the fake answered, in order."""


def _refused(payload: dict[str, Any]) -> bool:
    last = (payload.get("messages") or [{}])[-1]
    return last.get("content") == "refuse"


def _openai_usage() -> dict[str, Any]:
    return {
        "prompt_tokens": 120,
        "completion_tokens": 80,
        "total_tokens": 200,
        "prompt_tokens_details": {"cached_tokens": 20},
        "completion_tokens_details": {"reasoning_tokens": 30},
    }


def _chat(payload: dict[str, Any]) -> web.StreamResponse | dict[str, Any]:
    refused = _refused(payload)
    head = {
        "id": "chatcmpl-reasoning-1",
        "created": 1_700_000_100,
        "model": payload["model"],
        "system_fingerprint": "fp_reasoning",
    }
    if refused:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None,
            "refusal": "".join(REFUSAL),
        }
        finish = "stop"
    else:
        message = {
            "role": "assistant",
            "content": "".join(TEXT),
            "refusal": None,
            "reasoning_content": "".join(REASONING),
            "tool_calls": [
                {
                    "id": "call_weather_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": "".join(TOOL_ARGUMENTS)},
                }
            ],
        }
        finish = "tool_calls"
    return {
        **head,
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": _openai_usage(),
    }


def _chat_events(payload: dict[str, Any]) -> list[bytes]:
    plain = _chat(payload)
    assert isinstance(plain, dict)
    head = {k: plain[k] for k in ("id", "created", "model", "system_fingerprint")}
    head["object"] = "chat.completion.chunk"

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        body = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    events = [chunk({"role": "assistant", "content": ""})]
    if _refused(payload):
        events += [chunk({"refusal": piece}) for piece in REFUSAL]
        events.append(chunk({}, "stop"))
    else:
        events += [chunk({"reasoning_content": piece}) for piece in REASONING]
        events += [chunk({"content": piece}) for piece in TEXT]
        events.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_weather_1",
                            "type": "function",
                            "function": {"name": "weather", "arguments": ""},
                        }
                    ]
                }
            )
        )
        events += [
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            for piece in TOOL_ARGUMENTS
        ]
        events.append(chunk({}, "tool_calls"))
    if (payload.get("stream_options") or {}).get("include_usage"):
        usage = {**head, "choices": [], "usage": _openai_usage()}
        events.append(b"data: " + json.dumps(usage).encode() + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events


def _message(payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "msg_reasoning_1",
        "type": "message",
        "role": "assistant",
        "model": payload["model"],
        "content": [
            {"type": "thinking", "thinking": "".join(REASONING), "signature": SIGNATURE},
            {"type": "text", "text": "".join(TEXT)},
            {
                "type": "tool_use",
                "id": "toolu_weather_1",
                "name": "weather",
                "input": json.loads("".join(TOOL_ARGUMENTS)),
            },
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 100,
            "output_tokens": 80,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 20,
        },
    }


def _message_events(payload: dict[str, Any]) -> list[bytes]:
    plain = _message(payload)

    def event(name: str, data: dict[str, Any]) -> bytes:
        return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

    def delta(index: int, body: dict[str, Any]) -> bytes:
        return event(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": body}
        )

    def block(index: int, start: dict[str, Any], deltas: list[bytes]) -> list[bytes]:
        return [
            event(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            ),
            *deltas,
            event("content_block_stop", {"type": "content_block_stop", "index": index}),
        ]

    start = {**plain, "content": [], "stop_reason": None, "usage": {**plain["usage"]}}
    start["usage"]["output_tokens"] = 1
    return [
        event("message_start", {"type": "message_start", "message": start}),
        *block(
            0,
            {"type": "thinking", "thinking": "", "signature": ""},
            [delta(0, {"type": "thinking_delta", "thinking": p}) for p in REASONING]
            + [delta(0, {"type": "signature_delta", "signature": SIGNATURE})],
        ),
        event("ping", {"type": "ping"}),
        *block(
            1,
            {"type": "text", "text": ""},
            [delta(1, {"type": "text_delta", "text": p}) for p in TEXT],
        ),
        *block(
            2,
            {"type": "tool_use", "id": "toolu_weather_1", "name": "weather", "input": {}},
            [delta(2, {"type": "input_json_delta", "partial_json": p}) for p in TOOL_ARGUMENTS],
        ),
        event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"output_tokens": 80},
            },
        ),
        event("message_stop", {"type": "message_stop"}),
    ]


def _app(fake: FakeReasoning) -> web.Application:
    async def stream(request: web.Request, events: list[bytes]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for one in events:
            await response.write(one)
        await response.write_eof()
        return response

    async def chat(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {API_KEY}":
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        payload = await request.json()
        fake.calls.append(payload)
        if payload.get("stream"):
            return await stream(request, _chat_events(payload))
        return web.json_response(_chat(payload))

    async def messages(request: web.Request) -> web.StreamResponse:
        if request.headers.get("x-api-key") != API_KEY:
            return web.json_response(
                {"type": "error", "error": {"type": "authentication_error", "message": "no"}},
                status=401,
            )
        payload = await request.json()
        fake.calls.append(payload)
        if payload.get("stream"):
            return await stream(request, _message_events(payload))
        return web.json_response(_message(payload))

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/messages", messages)
    return app


@asynccontextmanager
async def serve_fake_reasoning() -> AsyncIterator[FakeReasoning]:
    fake = FakeReasoning()
    async with serving(_app(fake)) as origin:
        fake.url = origin
        yield fake

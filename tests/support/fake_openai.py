"""A fake OpenAI-compatible provider: a real HTTP server on loopback speaking OpenAI's wire format.

It answers chat completions (plain and SSE, with `stream_options.include_usage`, tool calls),
embeddings (float and base64) and the model list; records every request it receives, byte for
byte; and can be told to fail, stall or stream slowly for the next requests.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

API_KEY = "sk-fake-upstream-credential-0f3a"
REPLY = "Hi there! I am the fake upstream."


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def header(self, name: str) -> str | None:
        """A request header by its case-insensitive name."""
        wanted = name.lower()
        return next((v for k, v in self.headers.items() if k.lower() == wanted), None)


@dataclass
class Failure:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class FakeOpenAI:
    url: str = ""
    """Base URL as OpenAI's SDK takes it, ending in /v1."""
    api_key: str = API_KEY
    received: list[Received] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    """Answered, in order, to the next requests instead of a normal reply."""
    stall_s: float = 0.0
    """Wait this long before answering (to trigger the proxy's timeouts)."""
    hold: asyncio.Event | None = None
    """When set to an event, each request waits for it before it is answered."""
    chunk_delay_s: float = 0.0
    """Wait this long between two stream events."""
    stream_events: int = 0
    """Stream this many extra content events (a long stream, for disconnect tests)."""
    stream_cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a client went away in the middle of a stream."""

    def fail_next(self, status: int, message: str = "upstream says no", **headers: str) -> None:
        kind = "rate_limit_error" if status == 429 else "invalid_request_error"
        if status >= 500:
            kind = "server_error"
        body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
        self.failures.append(Failure(status, body, dict(headers)))


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
    }


def _chunk(model: str, delta: dict[str, Any], finish: str | None, usage: bool) -> bytes:
    body: dict[str, Any] = {
        "id": "chatcmpl-fake0001",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": model,
        "system_fingerprint": "fp_fake",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    if usage:
        body["usage"] = None
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _app(fake: FakeOpenAI) -> web.Application:
    async def gate(request: web.Request) -> web.StreamResponse | None:
        body = await request.read()
        fake.received.append(Received(request.method, request.path, dict(request.headers), body))
        if fake.stall_s:
            await asyncio.sleep(fake.stall_s)
        if fake.hold is not None:
            await fake.hold.wait()
        if request.headers.get("Authorization") != f"Bearer {fake.api_key}":
            return web.json_response(
                {
                    "error": {
                        "message": "Incorrect API key provided",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": "invalid_api_key",
                    }
                },
                status=401,
            )
        if fake.failures:
            failure = fake.failures.pop(0)
            return web.json_response(failure.body, status=failure.status, headers=failure.headers)
        return None

    async def chat(request: web.Request) -> web.StreamResponse:
        refusal = await gate(request)
        if refusal is not None:
            return refusal
        payload = json.loads(fake.received[-1].body)
        model = payload["model"]
        tools = payload.get("tools")
        if tools and payload.get("tool_choice") != "none":
            name = tools[0]["function"]["name"]
            message: dict[str, Any] = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_fake1",
                        "type": "function",
                        "function": {"name": name, "arguments": '{"city": "Paris"}'},
                    }
                ],
            }
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": REPLY, "refusal": None}
            finish = "stop"
        if not payload.get("stream"):
            return web.json_response(
                {
                    "id": "chatcmpl-fake0001",
                    "object": "chat.completion",
                    "created": 1_700_000_000,
                    "model": model,
                    "system_fingerprint": "fp_fake",
                    "choices": [
                        {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
                    ],
                    "usage": _usage(11, 7),
                }
            )
        usage = bool((payload.get("stream_options") or {}).get("include_usage"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        events = [_chunk(model, {"role": "assistant", "content": ""}, None, usage)]
        if message.get("tool_calls"):
            call = message["tool_calls"][0]
            events.append(_chunk(model, {"tool_calls": [{"index": 0, **call}]}, None, usage))
        else:
            events += [_chunk(model, {"content": w}, None, usage) for w in ("Hi", " there", "!")]
            events += [_chunk(model, {"content": "."}, None, usage)] * fake.stream_events
        events.append(_chunk(model, {}, finish, usage))
        if usage:
            final = {
                "id": "chatcmpl-fake0001",
                "object": "chat.completion.chunk",
                "created": 1_700_000_000,
                "model": model,
                "system_fingerprint": "fp_fake",
                "choices": [],
                "usage": _usage(11, 4),
            }
            events.append(b"data: " + json.dumps(final).encode() + b"\n\n")
        events.append(b"data: [DONE]\n\n")
        try:
            for event in events:
                await response.write(event)
                if fake.chunk_delay_s:
                    await asyncio.sleep(fake.chunk_delay_s)
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            fake.stream_cancelled.set()
            raise
        return response

    async def embeddings(request: web.Request) -> web.StreamResponse:
        refusal = await gate(request)
        if refusal is not None:
            return refusal
        payload = json.loads(fake.received[-1].body)
        inputs = payload["input"] if isinstance(payload["input"], list) else [payload["input"]]
        data = []
        for index, _ in enumerate(inputs):
            vector = [0.25 * (index + 1), -0.5, 0.125]
            embedding: Any = vector
            if payload.get("encoding_format") == "base64":
                embedding = base64.b64encode(struct.pack("<3f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": embedding})
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "model": payload["model"],
                "usage": {"prompt_tokens": 4 * len(inputs), "total_tokens": 4 * len(inputs)},
            }
        )

    async def models(request: web.Request) -> web.StreamResponse:
        refusal = await gate(request)
        if refusal is not None:
            return refusal
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {"id": "gpt-4o-mini", "object": "model", "created": 1, "owned_by": "fake"}
                ],
            }
        )

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_get("/v1/models", models)
    return app


@asynccontextmanager
async def serve_fake_openai() -> AsyncIterator[FakeOpenAI]:
    fake = FakeOpenAI()
    runner = web.AppRunner(_app(fake), handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    fake.url = f"http://127.0.0.1:{port}/v1"
    try:
        yield fake
    finally:
        await runner.cleanup()

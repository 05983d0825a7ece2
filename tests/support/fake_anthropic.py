"""A fake Anthropic provider: a real HTTP server on loopback speaking the Messages API's wire format.

It answers `POST /v1/messages` plain and streamed (the SSE events Anthropic sends, usage in
`message_start` and `message_delta`), with a `tool_use` block when the request offers tools and
text once a tool's result came back; refuses what Anthropic refuses (the key, in `x-api-key` or
as a bearer token; the version header; required fields) with Anthropic's error bodies; records
every request byte for byte; and has the knobs of `FakeProvider` (failures, stalls, slow or cut
streams) and settable usage numbers.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.support.fake_openai import FakeProvider, serving

API_KEY = "sk-ant-fake-upstream-credential-7c1d"
REPLY = "Hi there! I am the fake Anthropic upstream."
REPLY_PIECES = ("Hi", " there!", " I am the fake Anthropic upstream.")
"""The text deltas of a streamed reply: together, `REPLY`."""
TOOL_INPUT = {"city": "Paris"}
TOOL_INPUT_PIECES = ('{"city": ', '"Paris"}')
"""The `partial_json` pieces of a streamed tool use: together, `TOOL_INPUT` as JSON."""
JSON_REPLY = '{"city":"Paris","temperature_c":21}'
"""The text of an answer whose request asks for a JSON schema (`output_config.format`)."""
MESSAGE_ID = "msg_01FakeUpstreamReply000001"
TOOL_USE_ID = "toolu_01FakeUpstreamCall00001"
EVENT_STREAM = "text/event-stream; charset=utf-8"
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


@dataclass
class FakeAnthropic(FakeProvider):
    url: str = ""
    """Base URL as Anthropic's SDK takes it: the server's root, without /v1."""
    api_key: str = API_KEY
    input_tokens: int = 11
    output_tokens: int = 7
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": message}}

    def usage(self, output_tokens: int) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "output_tokens": output_tokens,
        }


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _tool_to_call(payload: dict[str, Any]) -> str | None:
    """The name of the tool the model calls: the chosen or first one, unless a result is back."""
    tools = payload.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    choice = payload.get("tool_choice") or {}
    if choice.get("type") == "none":
        return None
    last = payload["messages"][-1]
    content = last.get("content")
    if (
        last.get("role") == "user"
        and isinstance(content, list)
        and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
    ):
        return None
    return str(choice["name"] if choice.get("type") == "tool" else tools[0]["name"])


def _invalid_body(payload: Any) -> str | None:
    """Why Anthropic would refuse this body with a 400, if it would."""
    if not isinstance(payload, dict):
        return "body must be a JSON object"
    if not isinstance(payload.get("model"), str):
        return "model: Field required"
    max_tokens = payload.get("max_tokens")
    if max_tokens is None:
        return "max_tokens: Field required"
    if type(max_tokens) is not int or max_tokens < 1:
        return "max_tokens: Input should be a valid integer greater than or equal to 1"
    messages = payload.get("messages")
    if messages is None:
        return "messages: Field required"
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    if not all(isinstance(m, dict) for m in messages):
        return "messages: Input should be a valid dictionary"
    return None


def _app(fake: FakeAnthropic) -> web.Application:
    def refused(status: int, message: str) -> web.Response:
        return web.json_response(fake.error_body(status, message), status=status)

    def gate(request: web.Request) -> web.Response | None:
        """Anthropic's refusal of the request's headers, or the next failure it was told."""
        key = request.headers.get("x-api-key")
        if key is None and request.headers.get("Authorization", "").startswith("Bearer "):
            # Anthropic's own SDK sends its key this way.
            key = request.headers["Authorization"].removeprefix("Bearer ")
        if key is None:
            return refused(401, "x-api-key header is required")
        if key != fake.api_key:
            return refused(401, "invalid x-api-key")
        if not request.headers.get("anthropic-version"):
            return refused(400, "anthropic-version: header is required")
        return fake.next_failure()

    async def messages(request: web.Request) -> web.StreamResponse:
        body = await fake.admit(request)
        refusal = gate(request)
        if refusal is not None:
            return refusal
        try:
            payload = json.loads(body)
        except ValueError:
            return refused(400, "There was an error parsing the body of your request")
        problem = _invalid_body(payload)
        if problem is not None:
            return refused(400, problem)
        tool = _tool_to_call(payload)
        structured = ((payload.get("output_config") or {}).get("format") or {}).get("type")
        if tool is None and structured == "json_schema":
            # Structured outputs: the text is JSON the schema allows.
            block: dict[str, Any] = {"type": "text", "text": JSON_REPLY}
            stop_reason = "end_turn"
        elif tool is None:
            block = {"type": "text", "text": REPLY}
            stop_reason = "end_turn"
        else:
            block = {"type": "tool_use", "id": TOOL_USE_ID, "name": tool, "input": TOOL_INPUT}
            stop_reason = "tool_use"
        message = {
            "id": MESSAGE_ID,
            "type": "message",
            "role": "assistant",
            "model": payload["model"],
            "content": [block],
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": fake.usage(fake.output_tokens),
        }
        if payload.get("stream") is not True:
            return web.json_response(message)
        # The stream opens with the message as it stands before any token: no content yet.
        start = {**message, "content": [], "stop_reason": None, "usage": fake.usage(1)}
        if tool is None:
            empty: dict[str, Any] = {"type": "text", "text": ""}
            pieces = REPLY_PIECES if block["text"] == REPLY else (block["text"],)
            deltas = [{"type": "text_delta", "text": t} for t in pieces]
            deltas += [{"type": "text_delta", "text": "."}] * fake.stream_events
        else:
            empty = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in TOOL_INPUT_PIECES]
        events = [
            _event("message_start", {"type": "message_start", "message": start}),
            _event(
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": empty},
            ),
            _event("ping", {"type": "ping"}),
            *(
                _event(
                    "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": d}
                )
                for d in deltas
            ),
            _event("content_block_stop", {"type": "content_block_stop", "index": 0}),
            _event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                    "usage": {"output_tokens": fake.output_tokens},
                },
            ),
            _event("message_stop", {"type": "message_stop"}),
        ]
        return await fake.stream(request, EVENT_STREAM, events)

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/messages", messages)
    return app


@asynccontextmanager
async def serve_fake_anthropic() -> AsyncIterator[FakeAnthropic]:
    fake = FakeAnthropic()
    async with serving(_app(fake)) as origin:
        fake.url = origin
        yield fake

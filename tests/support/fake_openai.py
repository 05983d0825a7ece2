"""A fake OpenAI-compatible provider: a real HTTP server on loopback speaking OpenAI's wire format.

It answers chat completions (plain and SSE, with `stream_options.include_usage`, tool calls),
embeddings (float and base64), the model list, and the audio and image routes
(`fake_openai_media`), under OpenAI's paths and Azure OpenAI's
deployment paths; records every request it receives, byte for byte; and can be told to fail,
stall, stream slowly or cut a stream for the next requests. `FakeProvider` holds what every fake
provider shares.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.support import fake_openai_media

API_KEY = "sk-fake-upstream-credential-0f3a"
REPLY = "Hi there! I am the fake upstream."
REPLY_PIECES = ("Hi", " there!", " I am the fake upstream.")
"""The `output_text` deltas of a streamed response: together, `REPLY`."""
JSON_REPLY = '{"city":"Paris","temperature_c":21}'
"""A response's text when its request asks for a JSON schema (`text.format`)."""
TOOL_ARGUMENTS = '{"city": "Paris"}'
RESPONSES_USAGE = {
    "input_tokens": 13,
    "input_tokens_details": {"cached_tokens": 5, "cache_write_tokens": 0},
    "output_tokens": 9,
    "output_tokens_details": {"reasoning_tokens": 2},
    "total_tokens": 22,
}
"""What every response of the fake reports: some input cached, some output reasoning."""


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    query: dict[str, str] = field(default_factory=dict)

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
class FakeProvider:
    """What every fake provider records, and the knobs that make it misbehave."""

    url: str = ""
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
    break_after_events: int | None = None
    """Cut the connection once a stream has sent this many events, without ending the body
    (at 0 the cut may come before the status line reaches the client)."""
    stream_gate: asyncio.Event | None = None
    """When set, a stream waits for this event after its first event (a stream held open)."""
    streamed: list[bytes] = field(default_factory=list)
    """Every stream event sent, in order, across requests: the bytes a client should see."""
    stream_cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a client went away in the middle of a stream."""

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        """The provider's own error object for `status`."""
        raise NotImplementedError

    def fail_next(self, status: int, message: str = "upstream says no", **headers: str) -> None:
        self.failures.append(Failure(status, self.error_body(status, message), dict(headers)))

    async def admit(self, request: web.Request) -> bytes:
        """Record the request, then wait as told; its body."""
        body = await request.read()
        self.received.append(
            Received(request.method, request.path, dict(request.headers), body, dict(request.query))
        )
        if self.stall_s:
            await asyncio.sleep(self.stall_s)
        if self.hold is not None:
            await self.hold.wait()
        return body

    def next_failure(self) -> web.Response | None:
        if not self.failures:
            return None
        failure = self.failures.pop(0)
        return web.json_response(failure.body, status=failure.status, headers=failure.headers)

    async def stream(
        self, request: web.Request, content_type: str, events: Iterable[bytes]
    ) -> web.StreamResponse:
        """Send `events` as a chunked body, honouring the delay and break knobs."""
        response = web.StreamResponse(headers={"Content-Type": content_type})
        await response.prepare(request)
        try:
            for sent, event in enumerate(events):
                if sent == self.break_after_events:
                    # close(), not abort(): what was written still arrives, then the body stops
                    # short of its last chunk, as when a provider's connection drops.
                    assert request.transport is not None
                    request.transport.close()
                    return response
                await response.write(event)
                self.streamed.append(event)
                if sent == 0 and self.stream_gate is not None:
                    await self.stream_gate.wait()
                if self.chunk_delay_s:
                    await asyncio.sleep(self.chunk_delay_s)
            await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            # A reset, or the connection lost while a write waited for the client to read.
            self.stream_cancelled.set()
            raise
        return response


@dataclass
class FakeOpenAI(FakeProvider):
    url: str = ""
    """Base URL as OpenAI's SDK takes it, ending in /v1."""
    azure_deployments: set[str] | None = None
    """Deployments the Azure routes know (others are 404 `DeploymentNotFound`); None: any."""
    responses: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Stored responses by id, each `{"response": …, "input": […]}`, as OpenAI keeps them."""
    reply_pieces: tuple[str, ...] | None = None
    """When set, chat completions answer this text (streamed: one content event a piece)."""
    flagged_word: str = "KILL"
    """`/v1/moderations` flags an input holding this word (violence 0.9), else scores 0.01."""

    @property
    def azure_endpoint(self) -> str:
        """The resource endpoint as Azure's SDK takes it: the server's root."""
        return self.url.removesuffix("/v1")

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = "rate_limit_error" if status == 429 else "invalid_request_error"
        if status >= 500:
            kind = "server_error"
        return {"error": {"message": message, "type": kind, "param": None, "code": None}}


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


def _azure_error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Responder = Callable[[web.Request, dict[str, Any]], Awaitable[web.StreamResponse]]


def _app(fake: FakeOpenAI) -> web.Application:
    def gate(request: web.Request) -> web.Response | None:
        """OpenAI's refusal of the request, or the next failure it was told to answer."""
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
        return fake.next_failure()

    def azure_gate(request: web.Request) -> web.Response | None:
        """Azure's refusal of the request, or the next failure it was told to answer."""
        # Azure answers a missing version as an unknown route, before it looks at the key.
        if not request.query.get("api-version"):
            return _azure_error(404, "404", "Resource not found")
        if request.headers.get("api-key") != fake.api_key:
            return _azure_error(
                401,
                "401",
                "Access denied due to invalid subscription key or wrong API endpoint. Make sure "
                "to provide a valid key for an active subscription and use a correct regional "
                "API endpoint for your resource.",
            )
        deployment = request.match_info["deployment"]
        if fake.azure_deployments is not None and deployment not in fake.azure_deployments:
            return _azure_error(
                404,
                "DeploymentNotFound",
                "The API deployment for this resource does not exist. If you created the "
                "deployment within the last 5 minutes, please wait a moment and try again.",
            )
        return fake.next_failure()

    def openai_route(answer: Responder) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            body = await fake.admit(request)
            refusal = gate(request)
            if refusal is not None:
                return refusal
            return await answer(request, json.loads(body))

        return handle

    def azure_route(answer: Responder) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            body = await fake.admit(request)
            refusal = azure_gate(request)
            if refusal is not None:
                return refusal
            payload = json.loads(body)
            # Azure takes the model from the deployment; a body may leave it out.
            payload.setdefault("model", request.match_info["deployment"])
            return await answer(request, payload)

        return handle

    async def chat(request: web.Request, payload: dict[str, Any]) -> web.StreamResponse:
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
            content = "".join(fake.reply_pieces) if fake.reply_pieces is not None else REPLY
            message = {"role": "assistant", "content": content, "refusal": None}
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
        events = [_chunk(model, {"role": "assistant", "content": ""}, None, usage)]
        if message.get("tool_calls"):
            call = message["tool_calls"][0]
            events.append(_chunk(model, {"tool_calls": [{"index": 0, **call}]}, None, usage))
        else:
            pieces = fake.reply_pieces or ("Hi", " there", "!")
            events += [_chunk(model, {"content": w}, None, usage) for w in pieces]
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
        return await fake.stream(request, "text/event-stream", events)

    async def embeddings(request: web.Request, payload: dict[str, Any]) -> web.StreamResponse:
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

    async def moderations(request: web.Request, payload: dict[str, Any]) -> web.StreamResponse:
        inputs = payload["input"] if isinstance(payload["input"], list) else [payload["input"]]
        results = []
        for text in inputs:
            score = 0.9 if fake.flagged_word in text else 0.01
            results.append(
                {
                    "flagged": score > 0.5,
                    "categories": {"violence": score > 0.5, "harassment": False},
                    "category_scores": {"violence": score, "harassment": 0.01},
                }
            )
        return web.json_response(
            {"id": "modr-fake", "model": payload.get("model", ""), "results": results}
        )

    async def models(request: web.Request) -> web.StreamResponse:
        await fake.admit(request)
        refusal = gate(request)
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

    def responses_gate(request: web.Request) -> web.Response | None:
        if request.path.startswith("/openai/"):
            if not request.query.get("api-version"):
                return _azure_error(404, "404", "Resource not found")
            if request.headers.get("api-key") != fake.api_key:
                return _azure_error(401, "401", "Access denied due to invalid subscription key.")
            return fake.next_failure()
        return gate(request)

    async def create_response(request: web.Request) -> web.StreamResponse:
        body = await fake.admit(request)
        refusal = responses_gate(request)
        if refusal is not None:
            return refusal
        return await _create_response(fake, request, json.loads(body))

    async def stored_response(request: web.Request) -> web.StreamResponse:
        await fake.admit(request)
        refusal = responses_gate(request)
        if refusal is not None:
            return refusal
        ident = request.match_info["id"]
        kept = fake.responses.get(ident)
        if kept is None:
            return _not_found(ident)
        suffix = request.match_info.get("suffix", "")
        if suffix == "input_items":
            items = kept["input"]
            return web.json_response(
                {
                    "object": "list",
                    "data": items,
                    "first_id": items[0]["id"] if items else None,
                    "last_id": items[-1]["id"] if items else None,
                    "has_more": False,
                }
            )
        if suffix == "cancel":
            return web.json_response(
                {
                    "error": {
                        "message": "Only responses created with background=true can be cancelled.",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": None,
                    }
                },
                status=400,
            )
        if request.method == "DELETE":
            del fake.responses[ident]
            return web.json_response({"id": ident, "object": "response", "deleted": True})
        return web.json_response(kept["response"])

    app = web.Application(client_max_size=64 * 1024 * 1024)
    for base in ("/v1/responses", "/openai/responses"):
        app.router.add_post(base, create_response)
        app.router.add_get(base + "/{id}", stored_response)
        app.router.add_delete(base + "/{id}", stored_response)
        app.router.add_get(base + "/{id}/{suffix:input_items}", stored_response)
        app.router.add_post(base + "/{id}/{suffix:cancel}", stored_response)
    app.router.add_post("/v1/chat/completions", openai_route(chat))
    app.router.add_post("/v1/embeddings", openai_route(embeddings))
    app.router.add_post("/v1/moderations", openai_route(moderations))
    app.router.add_get("/v1/models", models)
    deployment = "/openai/deployments/{deployment}"
    app.router.add_post(deployment + "/chat/completions", azure_route(chat))
    app.router.add_post(deployment + "/embeddings", azure_route(embeddings))
    fake_openai_media.add_routes(app, fake, gate, azure_gate)
    return app


def _not_found(ident: str, param: str | None = None) -> web.Response:
    return web.json_response(
        {
            "error": {
                "message": f"Response with id '{ident}' not found.",
                "type": "invalid_request_error",
                "param": param,
                "code": None,
            }
        },
        status=404,
    )


def _input_items(payload: dict[str, Any], first: int) -> list[dict[str, Any]]:
    """The request's input as OpenAI stores it: every item with an id, strings as messages."""
    given = payload.get("input", [])
    if isinstance(given, str):
        given = [{"role": "user", "content": given}]
    items = []
    for index, item in enumerate(given, start=first):
        kept = {"id": f"msg_in{index:044x}", "type": "message", "status": "completed", **item}
        if isinstance(kept.get("content"), str):
            kept["content"] = [{"type": "input_text", "text": kept["content"]}]
        items.append(kept)
    return items


def _response_output(payload: dict[str, Any], ident: str) -> list[dict[str, Any]]:
    """A function call when tools are offered and no result came back yet; else text (JSON when
    the request asks for a schema)."""
    tools = payload.get("tools") or []
    given = payload.get("input")
    last = given[-1] if isinstance(given, list) and given else {}
    if (
        tools
        and payload.get("tool_choice") != "none"
        and last.get("type") != "function_call_output"
    ):
        return [
            {
                "id": "fc_" + ident[5:],
                "type": "function_call",
                "status": "completed",
                "arguments": TOOL_ARGUMENTS,
                "call_id": "call_fake1",
                "name": tools[0]["name"],
            }
        ]
    text_format = ((payload.get("text") or {}).get("format") or {}).get("type")
    text = JSON_REPLY if text_format == "json_schema" else REPLY
    return [
        {
            "id": "msg_" + ident[5:],
            "type": "message",
            "status": "completed",
            "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}],
            "role": "assistant",
        }
    ]


def _response(payload: dict[str, Any], ident: str, status: str) -> dict[str, Any]:
    return {
        "id": ident,
        "object": "response",
        "created_at": 1_700_000_000,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": payload.get("instructions"),
        "max_output_tokens": payload.get("max_output_tokens"),
        "model": payload["model"],
        "output": [],
        "parallel_tool_calls": payload.get("parallel_tool_calls", True),
        "previous_response_id": payload.get("previous_response_id"),
        "reasoning": payload.get("reasoning") or {"effort": None, "summary": None},
        "store": payload.get("store", True),
        "temperature": payload.get("temperature", 1.0),
        "text": payload.get("text") or {"format": {"type": "text"}},
        "tool_choice": payload.get("tool_choice", "auto"),
        "tools": payload.get("tools", []),
        "top_p": payload.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": None,
        "user": payload.get("user"),
        "metadata": payload.get("metadata") or {},
    }


def _response_events(created: dict[str, Any], done: dict[str, Any]) -> list[bytes]:
    """The typed events of a streamed response, as OpenAI sends them."""
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": created},
        {"type": "response.in_progress", "response": created},
    ]
    for index, item in enumerate(done["output"]):
        if item["type"] == "function_call":
            events.append(
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "status": "in_progress", "arguments": ""},
                }
            )
            for piece in ('{"city": ', '"Paris"}'):
                events.append(
                    {
                        "type": "response.function_call_arguments.delta",
                        "item_id": item["id"],
                        "output_index": index,
                        "delta": piece,
                    }
                )
            events.append(
                {
                    "type": "response.function_call_arguments.done",
                    "item_id": item["id"],
                    "output_index": index,
                    "name": item["name"],
                    "arguments": item["arguments"],
                }
            )
        else:
            part = item["content"][0]
            empty = {**part, "text": ""}
            events.append(
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "status": "in_progress", "content": []},
                }
            )
            events.append(
                {
                    "type": "response.content_part.added",
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "part": empty,
                }
            )
            pieces = REPLY_PIECES if part["text"] == REPLY else (part["text"],)
            for piece in pieces:
                events.append(
                    {
                        "type": "response.output_text.delta",
                        "item_id": item["id"],
                        "output_index": index,
                        "content_index": 0,
                        "delta": piece,
                        "logprobs": [],
                    }
                )
            events.append(
                {
                    "type": "response.output_text.done",
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "text": part["text"],
                    "logprobs": [],
                }
            )
            events.append(
                {
                    "type": "response.content_part.done",
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "part": part,
                }
            )
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": "response.completed", "response": done})
    return [
        f"event: {event['type']}\ndata: {json.dumps({**event, 'sequence_number': n})}\n\n".encode()
        for n, event in enumerate(events)
    ]


async def _create_response(
    fake: FakeOpenAI, request: web.Request, payload: dict[str, Any]
) -> web.StreamResponse:
    previous = payload.get("previous_response_id")
    history: list[dict[str, Any]] = []
    if previous is not None:
        kept = fake.responses.get(previous)
        if kept is None:
            return web.json_response(
                {
                    "error": {
                        "message": f"Previous response with id '{previous}' not found.",
                        "type": "invalid_request_error",
                        "param": "previous_response_id",
                        "code": "previous_response_not_found",
                    }
                },
                status=400,
            )
        history = kept["input"] + kept["response"]["output"]
    ident = f"resp_{len(fake.received):048x}"
    created = _response(payload, ident, "in_progress")
    done = {**_response(payload, ident, "completed"), "usage": RESPONSES_USAGE}
    done["output"] = _response_output(payload, ident)
    if payload.get("store", True):
        fake.responses[ident] = {
            "response": done,
            "input": history + _input_items(payload, len(history)),
        }
    if not payload.get("stream"):
        return web.json_response(done)
    return await fake.stream(request, "text/event-stream", _response_events(created, done))


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """`app` served on a free loopback port; yields its origin, `http://127.0.0.1:<port>`."""
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def serve_fake_openai() -> AsyncIterator[FakeOpenAI]:
    fake = FakeOpenAI()
    async with serving(_app(fake)) as origin:
        fake.url = origin + "/v1"
        yield fake

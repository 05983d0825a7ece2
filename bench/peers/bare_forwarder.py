"""The ceiling: the least a Python forwarder can do per request on this machine.

A raw ASGI app that decodes `model` and `stream` with msgspec and POSTs the body to the nginx
mock, returning its answer (relayed chunk by chunk for `"stream": true`, which goes to the
mock's SSE path). No auth, no limits, no spend record: whatever a real gateway adds is
measured against this. `bench/run.sh` runs it with one worker as the `bare-forwarder` target:

  UPSTREAM=http://127.0.0.1:18080 .venv/bin/uvicorn --app-dir bench/peers --host 127.0.0.1 \
      --port 8100 --loop uvloop --http httptools --no-access-log bare_forwarder:app

UPSTREAM is the mock's base URL (default http://127.0.0.1:18080). CLIENT=aiohttp (default) or
httpx picks the provider client, to compare them.
"""

from __future__ import annotations

import os
from typing import Any

import aiohttp
import httpx
import msgspec

UPSTREAM = os.environ.get("UPSTREAM", "http://127.0.0.1:18080").rstrip("/")
CHAT_URL = UPSTREAM + "/v1/chat/completions"
STREAM_URL = UPSTREAM + "/stream/v1/chat/completions"
CLIENT = os.environ.get("CLIENT", "aiohttp")
HEADERS = {"content-type": "application/json", "authorization": "Bearer sk-dummy-upstream-key"}


class ChatRequest(msgspec.Struct):
    model: str
    stream: bool = False


decode = msgspec.json.Decoder(ChatRequest).decode
_session: aiohttp.ClientSession | None = None
_client: httpx.AsyncClient | None = None


def session() -> aiohttp.ClientSession:
    global _session
    if _session is None:
        _session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256))
    return _session


def client() -> httpx.AsyncClient:
    global _client
    if _client is None:
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
        _client = httpx.AsyncClient(limits=limits)
    return _client


async def start(send: Any, status: int, content_type: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type)],
        }
    )


async def forward(body: bytes, send: Any) -> None:
    if CLIENT == "aiohttp":
        async with session().post(CHAT_URL, data=body, headers=HEADERS) as response:
            data = await response.read()
            status = response.status
    else:
        answer = await client().post(CHAT_URL, content=body, headers=HEADERS)
        data, status = answer.content, answer.status_code
    await start(send, status, b"application/json")
    await send({"type": "http.response.body", "body": data})


async def forward_stream(body: bytes, send: Any) -> None:
    if CLIENT == "aiohttp":
        async with session().post(STREAM_URL, data=body, headers=HEADERS) as response:
            await start(send, response.status, b"text/event-stream")
            async for chunk in response.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
    else:
        request = client().build_request("POST", STREAM_URL, content=body, headers=HEADERS)
        answer = await client().send(request, stream=True)
        try:
            await start(send, answer.status_code, b"text/event-stream")
            async for chunk in answer.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            await answer.aclose()
    await send({"type": "http.response.body", "body": b""})


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if _session is not None:
                    await _session.close()
                if _client is not None:
                    await _client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if decode(body).stream:
        await forward_stream(body, send)
    else:
        await forward(body, send)

"""An OpenAI-compatible upstream that misbehaves on demand, and what a test needs to reach it
through a deployment: an organization whose aliases name each way of misbehaving, and a request
that reports however it ended."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from aiohttp import web

from tests.proxy.conftest import CHAT_ALIAS
from tests.proxy.test_processes import Tenant, admin_create
from tests.support.fake_openai import serving
from tests.support.processes import Service

HELLO: Any = [{"role": "user", "content": "hello"}]


class OpenAILikeUpstream:
    """An OpenAI-compatible upstream whose path prefix picks how it misbehaves."""

    def __init__(self) -> None:
        self.calls = 0
        self.url = ""
        self.reached = asyncio.Event()
        """A request of the `held` mode arrived."""
        self.release = asyncio.Event()
        """Lets `held` requests stream their answer."""
        self.closing = asyncio.Event()
        """Ends the requests that hang, so the server stops without waiting on them."""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/{mode}/v1/chat/completions", self.chat)
        return app

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        payload = await request.json()
        mode = request.match_info["mode"]
        if mode == "ok" and not payload.get("stream"):
            return web.json_response(answer(payload["model"]))
        if mode == "garbage":
            return web.Response(
                body=b"<html>502 Bad Gateway</html>", content_type="application/json"
            )
        if mode == "truncated":
            return web.Response(
                body=b'{"id": "chatcmpl-1", "choices": [', content_type="application/json"
            )
        if mode == "hang":
            await self.closing.wait()  # the proxy gives up on it first
        if mode == "held":
            self.reached.set()
            await self.release.wait()
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        await stream.write(sse(chunk(payload["model"], "Hi")))
        if mode == "reset":
            assert request.transport is not None
            request.transport.abort()
            return stream
        if mode == "stall":
            await self.closing.wait()
        if mode == "noise":
            await stream.write(b"data: {not json at all\n\n")
            await stream.write(b"\xff\xfe binary noise \x00\n\n")
        await stream.write(sse(chunk(payload["model"], " there")))
        await stream.write(b"data: [DONE]\n\n")
        return stream


def answer(model: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }


def chunk(model: str, text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }


def sse(event: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(event)}\n\n".encode()


@asynccontextmanager
async def openai_like_upstream() -> AsyncIterator[OpenAILikeUpstream]:
    upstream = OpenAILikeUpstream()
    async with serving(upstream.app()) as url:
        upstream.url = url
        try:
            yield upstream
        finally:
            upstream.closing.set()
            upstream.release.set()


MODES = ("ok", "garbage", "truncated", "hang", "reset", "stall", "noise")
"""How the upstream misbehaves, by path prefix (`held` also waits for the test's go-ahead)."""


def upstream_tenant(controlplane: Service, upstream_url: str) -> tuple[Tenant, str]:
    """An organization whose alias `<mode>` reaches the upstream's `/<mode>/v1`, and a key."""
    org = admin_create(
        controlplane, "/api/admin/organizations", {"name": f"faults-{uuid.uuid4().hex[:8]}"}
    )["id"]
    project = admin_create(
        controlplane, "/api/admin/projects", {"organization_id": org, "name": "faults"}
    )["id"]
    aliases: dict[str, list[dict[str, str]]] = {}
    for mode in (*MODES, "held"):
        provider = admin_create(
            controlplane,
            "/api/admin/providers",
            {
                "organization_id": org,
                "name": mode,
                "kind": "openai_compatible",
                "base_url": f"{upstream_url}/{mode}/v1",
                "api_key": "sk-upstream-test",
                "price_overrides": {"m": {"input_per_mtok": "1", "output_per_mtok": "2"}},
            },
        )["id"]
        aliases[mode] = [{"provider_id": provider, "model": "m"}]
    aliases[CHAT_ALIAS] = aliases["ok"]
    aliases["fallthrough"] = aliases["garbage"] + aliases["ok"]
    policy = admin_create(
        controlplane,
        "/api/admin/routing-policies",
        {"organization_id": org, "name": "faults", "aliases": aliases},
    )["id"]
    key = admin_create(
        controlplane,
        "/api/admin/virtual-keys",
        {"project_id": project, "name": "faults", "routing_policy_id": policy},
    )["key"]
    return Tenant(project, policy, org), key


async def send(
    proxy: Service, key: str, mode: str, stream: bool, request_id: str = ""
) -> tuple[str, int, bytes]:
    """(request id, status, body as received) of one request, however it ends."""
    request_id = request_id or uuid.uuid4().hex
    body: dict[str, Any] = {"model": mode, "messages": HELLO, "stream": stream}
    headers = {"Authorization": f"Bearer {key}", "X-Request-ID": request_id}
    received = b""
    async with httpx.AsyncClient(timeout=30) as http:
        try:
            async with http.stream(
                "POST", f"{proxy.url}/v1/chat/completions", json=body, headers=headers
            ) as response:
                async for part in response.aiter_raw():
                    received += part
                return request_id, response.status_code, received
        except httpx.RemoteProtocolError:
            return request_id, 200, received  # a stream cut off after its head

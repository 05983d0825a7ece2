"""A customer's guardrail webhook: a real HTTP server on loopback that checks each call's
signature as a customer should, records what it was sent, and answers as the test scripts."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.support.fake_openai import serving

SECRET = "whsec-test-0123456789abcdef"


@dataclass
class FakeWebhook:
    url: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    """Every correctly signed call's body, in order."""
    forged: int = 0
    """Calls whose signature did not check out (answered 401)."""
    answer: Callable[[dict[str, Any]], dict[str, Any]] = lambda call: {"action": "allow"}
    hang: asyncio.Event | None = None
    """When set, each call waits for this event before it is answered (a slow webhook)."""


def _app(fake: FakeWebhook) -> web.Application:
    async def check(request: web.Request) -> web.Response:
        body = await request.read()
        timestamp = request.headers.get("x-vkgate-timestamp", "")
        wanted = hmac.new(
            SECRET.encode(), timestamp.encode() + b"." + body, hashlib.sha256
        ).hexdigest()
        if not hmac.compare_digest(wanted, request.headers.get("x-vkgate-signature", "")):
            fake.forged += 1
            return web.json_response({"error": "bad signature"}, status=401)
        call = json.loads(body)
        fake.calls.append(call)
        if fake.hang is not None:
            await fake.hang.wait()
        return web.json_response(fake.answer(call))

    app = web.Application()
    app.router.add_post("/check", check)
    return app


@asynccontextmanager
async def serve_fake_webhook() -> AsyncIterator[FakeWebhook]:
    fake = FakeWebhook()
    async with serving(_app(fake)) as base:
        fake.url = f"{base}/check"
        try:
            yield fake
        finally:
            if fake.hang is not None:
                fake.hang.set()

"""Guardrails that ask someone else: a customer's webhook, or a provider's `/v1/moderations`.

Both go through one pooled httpx client per process (`RemoteChecks`); neither is on the path
of a key that has no such guardrail. The webhook is signed like the internal API, under the
guardrail's own secret: `X-Vkgate-Timestamp` and `X-Vkgate-Signature` = hex
HMAC-SHA256(secret, `TIMESTAMP.BODY`), so the receiver can refuse replays and forgeries.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import msgspec

from vkgate.clock import Clock
from vkgate.guardrails import ModerationConfig, WebhookConfig
from vkgate.wire import ChainTarget

_encode = msgspec.json.Encoder().encode


class RemoteFailed(Exception):
    """The check gave no usable verdict (unreachable, an error status, a malformed answer)."""


class WebhookVerdict(msgspec.Struct):
    action: Literal["allow", "block", "redact"]
    texts: list[str] | None = None
    """With `redact`: the texts as they may go on, one for each text sent."""


class _ModerationResult(msgspec.Struct):
    flagged: bool = False
    category_scores: dict[str, float] = {}


class _ModerationAnswer(msgspec.Struct):
    results: list[_ModerationResult]


@dataclass(frozen=True, slots=True)
class Verdict:
    action: str
    """`allow`, `block` or `redact`."""
    texts: list[str] | None = None


def signature(secret: str, timestamp: str, body: bytes) -> str:
    return hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


class RemoteChecks:
    """The process's client for webhook and moderation calls."""

    def __init__(self, clock: Clock, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._clock = clock
        self._client = httpx.AsyncClient(
            transport=transport,
            follow_redirects=False,
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def webhook(
        self,
        config: WebhookConfig,
        secret: str,
        *,
        guardrail: str,
        stage: str,
        model: str,
        texts: list[str],
    ) -> Verdict:
        body = _encode({"guardrail": guardrail, "stage": stage, "model": model, "texts": texts})
        timestamp = str(int(self._clock.time()))
        headers = {
            "content-type": "application/json",
            "x-vkgate-timestamp": timestamp,
            "x-vkgate-signature": signature(secret, timestamp, body),
        }
        try:
            response = await self._client.post(config.url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            raise RemoteFailed(type(exc).__name__) from None
        if response.status_code != 200:
            raise RemoteFailed(f"HTTP {response.status_code}")
        try:
            verdict = msgspec.json.decode(response.content, type=WebhookVerdict)
        except msgspec.DecodeError:
            raise RemoteFailed("malformed answer") from None
        if verdict.action == "redact" and (
            verdict.texts is None or len(verdict.texts) != len(texts)
        ):
            raise RemoteFailed("a redact answer without one text for each text sent")
        return Verdict(verdict.action, verdict.texts)

    async def moderation(
        self, config: ModerationConfig, target: ChainTarget, texts: list[str]
    ) -> bool:
        """Whether any text is flagged: a category at or over its threshold, or with no
        thresholds, the provider's own `flagged`."""
        if not target.base_url:
            raise RemoteFailed("the moderation provider has no base URL")
        headers = {**target.headers, "content-type": "application/json"}
        if target.api_key:
            headers["authorization"] = f"Bearer {target.api_key}"
        body: dict[str, Any] = {"model": config.model, "input": texts}
        try:
            response = await self._client.post(
                target.base_url.rstrip("/") + "/moderations", content=_encode(body), headers=headers
            )
        except httpx.HTTPError as exc:
            raise RemoteFailed(type(exc).__name__) from None
        if response.status_code != 200:
            raise RemoteFailed(f"HTTP {response.status_code}")
        try:
            answer = msgspec.json.decode(response.content, type=_ModerationAnswer)
        except msgspec.DecodeError:
            raise RemoteFailed("malformed answer") from None
        for result in answer.results:
            if not config.thresholds:
                if result.flagged:
                    return True
                continue
            for category, threshold in config.thresholds.items():
                if result.category_scores.get(category, 0.0) >= threshold:
                    return True
        return False

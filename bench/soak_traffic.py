"""The soak's traffic: the kinds of request in the mix, what each one costs, and the generator.

The models and their seeded prices, each kind's body and how the client reads the usage of its
answer, the keys' shares of the mix, and `Generator`, which sends the mix open loop at a fixed
rate and keeps what happened to each request (`Sent`) and in each interval (`Window`).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import aiohttp
import msgspec

NANO = Decimal(1_000_000_000)

GPT, GPT_UPSTREAM = "gpt-4o-mini", "gpt-4o-mini"
CLAUDE, CLAUDE_UPSTREAM = "claude-haiku", "claude-3-5-haiku-20241022"
EMBED, EMBED_UPSTREAM = "text-embedding-3-small", "text-embedding-3-small"
PRICES = {
    # upstream model -> (input, output) USD per million tokens
    GPT_UPSTREAM: ("0.15", "0.6"),
    CLAUDE_UPSTREAM: ("0.8", "4"),
    EMBED_UPSTREAM: ("0.02", "0"),
}
NANO_PER_TOKEN = {
    m: (int(Decimal(i) * 1000), int(Decimal(o) * 1000)) for m, (i, o) in PRICES.items()
}
"""Nano-USD a token: USD per million tokens times 1,000 (0.15 $/Mtok is 150 nano-USD a token)."""
MAX_TOKENS = 64
"""Every chat and message request's `max_tokens`: what a budget reserves for its answer."""

_decode = msgspec.json.decode
_encode = msgspec.json.encode


# -- the traffic -----------------------------------------------------------------------------

Usage = tuple[int, int] | None
"""(input, output) tokens as the client saw them; None when the answer showed none."""


def _openai_json(body: bytes) -> Usage:
    usage = _decode(body).get("usage")
    if not usage:
        return None
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)


def _openai_sse(body: bytes) -> Usage:
    for line in body.split(b"\n"):
        if line.startswith(b"data: {") and b'"usage":{' in line.replace(b" ", b""):
            found = _openai_json(line[6:])
            if found is not None:
                return found
    return None


def _anthropic_json(body: bytes) -> Usage:
    usage = _decode(body).get("usage")
    if not usage:
        return None
    cached = int(usage.get("cache_read_input_tokens") or 0) + int(
        usage.get("cache_creation_input_tokens") or 0
    )
    return int(usage.get("input_tokens") or 0) + cached, int(usage.get("output_tokens") or 0)


def _anthropic_sse(body: bytes) -> Usage:
    tokens_in: int | None = None
    tokens_out = 0
    for line in body.split(b"\n"):
        if not line.startswith(b"data: ") or b'"usage"' not in line:
            continue
        event = _decode(line[6:])
        if event.get("type") == "message_start":
            usage = event["message"]["usage"]
            cached = int(usage.get("cache_read_input_tokens") or 0) + int(
                usage.get("cache_creation_input_tokens") or 0
            )
            tokens_in = int(usage.get("input_tokens") or 0) + cached
            tokens_out = int(usage.get("output_tokens") or 0)
        elif event.get("type") == "message_delta":
            tokens_out = int(event["usage"].get("output_tokens") or 0)
    return None if tokens_in is None else (tokens_in, tokens_out)


def none(body: bytes) -> Usage:
    return None


@dataclass(frozen=True)
class Kind:
    """One sort of request in the mix."""

    name: str
    weight: int
    path: str
    body: bytes
    usage: Callable[[bytes], Usage]
    anthropic: bool = False
    invalid: str = ""
    """For invalid-key requests: `bearer`, `unknown` or `random`."""
    cost_hint_nano: int = 0
    """About what one answer costs: to size the budget."""


def _chat(model: str, *, stream: bool = False, usage: bool = False) -> bytes:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "Say hello to the soak test."}],
        "max_tokens": MAX_TOKENS,
    }
    if stream:
        body["stream"] = True
        if usage:
            body["stream_options"] = {"include_usage": True}
    return _encode(body)


def _message(model: str, *, stream: bool = False) -> bytes:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": MAX_TOKENS,
        "messages": [{"role": "user", "content": "Say hello to the soak test."}],
    }
    if stream:
        body["stream"] = True
    return _encode(body)


def cost(model: str, tokens_in: int, tokens_out: int) -> int:
    price_in, price_out = NANO_PER_TOKEN[model]
    return tokens_in * price_in + tokens_out * price_out


CHAT, MESSAGES, EMBEDDINGS = "/v1/chat/completions", "/v1/messages", "/v1/embeddings"
KINDS = (
    # The fakes answer chat with 11 + 7 tokens (11 + 4 streamed), messages with 11 + 7,
    # embeddings with 4 input tokens an input.
    Kind("chat", 25, CHAT, _chat(GPT), _openai_json, cost_hint_nano=cost(GPT, 11, 7)),
    Kind(
        "chat stream+usage",
        12,
        CHAT,
        _chat(GPT, stream=True, usage=True),
        _openai_sse,
        cost_hint_nano=cost(GPT, 11, 4),
    ),
    Kind(
        "chat stream",
        6,
        CHAT,
        _chat(GPT, stream=True),
        _openai_sse,
        cost_hint_nano=cost(GPT, 11, 4),
    ),
    Kind(
        "chat->anthropic",
        6,
        CHAT,
        _chat(CLAUDE),
        _openai_json,
        cost_hint_nano=cost(CLAUDE_UPSTREAM, 11, 7),
    ),
    Kind(
        "messages",
        15,
        MESSAGES,
        _message(CLAUDE),
        _anthropic_json,
        anthropic=True,
        cost_hint_nano=cost(CLAUDE_UPSTREAM, 11, 7),
    ),
    Kind(
        "messages stream",
        10,
        MESSAGES,
        _message(CLAUDE, stream=True),
        _anthropic_sse,
        anthropic=True,
        cost_hint_nano=cost(CLAUDE_UPSTREAM, 11, 7),
    ),
    Kind(
        "embeddings",
        10,
        EMBEDDINGS,
        _encode({"model": EMBED, "input": ["soak one", "soak two"]}),
        _openai_json,
        cost_hint_nano=cost(EMBED_UPSTREAM, 8, 0),
    ),
    Kind("invalid: bearer", 2, CHAT, _chat(GPT), none, invalid="bearer"),
    Kind("invalid: unknown vk", 2, CHAT, _chat(GPT), none, invalid="unknown"),
    Kind("invalid: random vk", 2, CHAT, _chat(GPT), none, invalid="random"),
)
KEY_SHARES = {"open-1": 24, "open-2": 23, "open-3": 23, "limited": 15, "budgeted": 15}
"""How a valid-key request picks its key (percent)."""


# -- what happened to each request -----------------------------------------------------------


@dataclass(slots=True)
class Sent:
    """One request as the generator saw it."""

    kind: Kind
    key: str
    """The key's name (`open-1`, …), '' for an invalid key."""
    status: int = 0
    """0: no HTTP answer (a transport error or a timeout)."""
    code: str | None = None
    """The error object's `code` of a non-2xx answer."""
    usage: Usage = None


@dataclass
class Window:
    """One interval: the requests sent in it, and the answers that ended in it."""

    sent: int = 0
    skipped: int = 0
    classes: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    max_lag_s: float = 0.0


def status_class(status: int) -> str:
    return "err" if status == 0 else f"{status // 100}xx"


class Generator:
    """Sends the mix at a fixed rate over one aiohttp session and records every outcome."""

    def __init__(
        self,
        proxy_url: str,
        keys: dict[str, str],
        args: argparse.Namespace,
        seed: int,
    ) -> None:
        self.url = proxy_url
        self.keys = keys
        self.rate = args.rate
        self.max_in_flight = args.max_in_flight
        self.timeout = aiohttp.ClientTimeout(total=args.request_timeout)
        self.run_id = secrets.token_hex(4)
        self.random = random.Random(seed)
        self.sent: dict[str, Sent] = {}
        self.window = Window()
        self.in_flight = 0
        self.skipped = 0
        self.unknown_key = "vk-soak-unknown-" + secrets.token_hex(16)
        self._tasks: set[asyncio.Task[None]] = set()
        self._weights = list(itertools.accumulate(k.weight for k in KINDS))
        self._key_names = list(KEY_SHARES)
        self._key_weights = list(itertools.accumulate(KEY_SHARES.values()))
        self.session: aiohttp.ClientSession | None = None

    def request_ids(self) -> Iterator[str]:
        n = 0
        while True:
            yield f"soak-{self.run_id}-{n:08d}"
            n += 1

    async def drive(self, seconds: float) -> None:
        """Send for `seconds`, open loop, then wait (bounded) for the answers still due."""
        loop = asyncio.get_running_loop()
        connector = aiohttp.TCPConnector(limit=self.max_in_flight, ttl_dns_cache=None)
        async with aiohttp.ClientSession(connector=connector, timeout=self.timeout) as session:
            self.session = session
            start = loop.time()
            period = 1.0 / self.rate
            ids = self.request_ids()
            n = 0
            while True:
                due = start + n * period
                if due - start >= seconds:
                    break
                now = loop.time()
                if due > now:
                    await asyncio.sleep(due - now)
                lag = loop.time() - due
                self.window.max_lag_s = max(self.window.max_lag_s, lag)
                n += 1
                if self.in_flight >= self.max_in_flight:
                    self.skipped += 1
                    self.window.skipped += 1
                    continue
                task = asyncio.create_task(self.one(next(ids)))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            if self._tasks:
                # Each request is bounded by its own timeout.
                await asyncio.wait(list(self._tasks), timeout=self.timeout.total or 60)
            for task in list(self._tasks):
                task.cancel()
            self.session = None

    def _pick(self) -> tuple[Kind, str]:
        kind = self.random.choices(KINDS, cum_weights=self._weights)[0]
        if kind.invalid:
            return kind, ""
        return kind, self.random.choices(self._key_names, cum_weights=self._key_weights)[0]

    def _headers(self, kind: Kind, key_name: str, request_id: str) -> dict[str, str]:
        if kind.invalid == "bearer":
            secret = "sk-soak-not-a-virtual-key"
        elif kind.invalid == "unknown":
            secret = self.unknown_key
        elif kind.invalid == "random":
            secret = "vk-soak-random-" + secrets.token_hex(16)
        else:
            secret = self.keys[key_name]
        headers = {"Content-Type": "application/json", "X-Request-ID": request_id}
        if kind.anthropic:
            headers["x-api-key"] = secret
            headers["anthropic-version"] = "2023-06-01"
        else:
            headers["Authorization"] = f"Bearer {secret}"
        return headers

    async def one(self, request_id: str) -> None:
        assert self.session is not None
        kind, key_name = self._pick()
        sent = self.sent[request_id] = Sent(kind, key_name)
        self.window.sent += 1
        self.in_flight += 1
        began = time.perf_counter()
        try:
            async with self.session.post(
                self.url + kind.path,
                data=kind.body,
                headers=self._headers(kind, key_name, request_id),
            ) as response:
                body = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError):
            self.window.classes["err"] += 1
            return
        finally:
            self.in_flight -= 1
        self.window.latencies.append(time.perf_counter() - began)
        self.window.classes[status_class(status)] += 1
        sent.status = status
        try:
            if 200 <= status < 300:
                sent.usage = kind.usage(body)
            else:
                error = _decode(body).get("error")
                sent.code = error.get("code") if isinstance(error, dict) else None
        except (msgspec.DecodeError, KeyError, TypeError, ValueError, AttributeError):
            sent.code = "unparsed answer"

    def take_window(self) -> Window:
        window, self.window = self.window, Window()
        return window

"""`mock`: a built-in offline provider for demos and trials, answering in OpenAI's wire format.

Deterministic: the same request gets the same answer, with usage counted the same way every
time (one token per word or punctuation mark), so spend and limits can be tried without a
provider account. It never touches the network.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
import struct
from collections.abc import AsyncIterator, Mapping
from typing import Any

import msgspec

from proxy.providers.base import Operation, Upstream
from vkgate.clock import Clock
from vkgate.wire import ChainTarget

REPLY = (
    "Hello from vkgate's mock provider. This answer is offline and deterministic; "
    "point a routing policy at a real provider to get real completions."
)
EMBEDDING_DIMENSIONS = 16
_TOKEN = re.compile(r"\w+|[^\w\s]")
_encode = msgspec.json.Encoder().encode
JSON = b"application/json"
EVENT_STREAM = b"text/event-stream"


def count_tokens(text: str) -> int:
    return len(_TOKEN.findall(text))


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


class MockReply:
    __slots__ = ("_body", "_events", "_left", "content_type", "retry_after", "status")

    def __init__(self, status: int, content_type: bytes, body: bytes, events: list[bytes]) -> None:
        self.status = status
        self.content_type = content_type
        self.retry_after: bytes | None = None
        self._body = body
        self._events = events
        self._left = len(events)

    async def read(self) -> bytes:
        return self._body

    @property
    def drained(self) -> bool:
        return self._left == 0

    async def chunks(self) -> AsyncIterator[bytes]:
        for event in self._events:
            self._left -= 1
            yield event

    def close(self) -> None:
        return None


def _error(message: str, param: str | None = None) -> MockReply:
    body = _encode(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": param,
                "code": None,
            }
        }
    )
    return MockReply(400, JSON, body, [])


class MockProvider:
    kind = "mock"

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def compile(self, target: ChainTarget) -> Upstream:
        return Upstream(
            provider_id=target.provider_id,
            provider_name=target.provider_name,
            kind=target.kind,
            model=target.model,
            model_json=_encode(target.model),
            adapter=self,
            # Never dialled: the addresses only say which operations the mock serves.
            urls={Operation.CHAT: "mock:chat", Operation.EMBEDDINGS: "mock:embeddings"},
            price=target.price,
        )

    async def send(
        self, upstream: Upstream, operation: Operation, body: bytes, headers: Mapping[str, str]
    ) -> MockReply:
        request = msgspec.json.decode(body)
        if operation is Operation.EMBEDDINGS:
            return self._embeddings(request)
        return self._chat(request, body)

    def _chat(self, request: dict[str, Any], body: bytes) -> MockReply:
        messages = request.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            # A real provider refuses such a body with a 400; so does this one.
            return _error("messages must be a list of message objects", "messages")
        prompt_tokens = sum(3 + count_tokens(_text(m.get("content"))) for m in messages) + 3
        content = REPLY
        if _object(request, "response_format").get("type") in ("json_object", "json_schema"):
            content = _encode({"mock": True, "reply": content}).decode()
        # Cut last, as a provider does: JSON mode can end mid-object when `max_tokens` is hit.
        content, finish = _truncated(
            content, request.get("max_completion_tokens") or request.get("max_tokens")
        )
        tool_call = _tool_call(request, messages)
        asked_n = request.get("n")
        n: int = asked_n if isinstance(asked_n, int) and asked_n > 0 else 1
        # Every choice is generated, and paid for.
        completion_tokens = n * (count_tokens(content) if tool_call is None else 5)
        ident = "chatcmpl-mock-" + hashlib.sha256(body).hexdigest()[:24]
        created = int(self._clock.time())
        model = request.get("model", "mock")
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        if tool_call is not None:
            message: dict[str, Any] = {
                "role": "assistant",
                "content": None,
                "tool_calls": [tool_call],
            }
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": content, "refusal": None}
        if request.get("stream"):
            include_usage = bool(_object(request, "stream_options").get("include_usage"))
            events = _stream(
                ident, created, model, message, finish, n, usage if include_usage else None
            )
            return MockReply(200, EVENT_STREAM, b"", events)
        choices = [
            {"index": i, "message": message, "logprobs": None, "finish_reason": finish}
            for i in range(n)
        ]
        return MockReply(
            200,
            JSON,
            _encode(
                {
                    "id": ident,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "system_fingerprint": "fp_vkgate_mock",
                    "choices": choices,
                    "usage": usage,
                }
            ),
            [],
        )

    def _embeddings(self, request: dict[str, Any]) -> MockReply:
        raw = request.get("input")
        inputs = raw if isinstance(raw, list) and raw and not isinstance(raw[0], int) else [raw]
        dimensions = request.get("dimensions")
        if dimensions is None:
            dimensions = EMBEDDING_DIMENSIONS
        if type(dimensions) is not int or not 1 <= dimensions <= 4096:
            return _error("dimensions must be a whole number from 1 to 4096", "dimensions")
        as_base64 = request.get("encoding_format") == "base64"
        data, tokens = [], 0
        for index, item in enumerate(inputs):
            text = item if isinstance(item, str) else " ".join(map(str, item or []))
            tokens += count_tokens(text) if isinstance(item, str) else len(item or [])
            vector = _vector(text, dimensions)
            embedding: Any = (
                base64.b64encode(struct.pack(f"<{dimensions}f", *vector)).decode()
                if as_base64
                else vector
            )
            data.append({"object": "embedding", "index": index, "embedding": embedding})
        body = {
            "object": "list",
            "data": data,
            "model": request.get("model", "mock"),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        return MockReply(200, JSON, _encode(body), [])


def _truncated(text: str, limit: Any) -> tuple[str, str]:
    """`text` cut after its `limit`-th token, and the finish reason.

    Cut there, the answer uses exactly `limit` tokens, as a provider's does when it stops for
    length; a word can be cut in two.
    """
    if type(limit) is not int or limit <= 0 or count_tokens(text) <= limit:
        return text, "stop"
    ends = [token.end() for token in _TOKEN.finditer(text)]
    return text[: ends[limit - 1]], "length"


def _object(parent: dict[str, Any], name: str) -> dict[str, Any]:
    """`parent[name]` when it is an object, else an empty one: odd values are not a crash."""
    value = parent.get(name)
    return value if isinstance(value, dict) else {}


def _tool_call(request: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A call of the first (or the chosen) tool, when the last message is the user's."""
    tools = request.get("tools")
    choice = request.get("tool_choice", "auto")
    if not tools or not isinstance(tools, list) or not isinstance(tools[0], dict):
        return None
    if choice == "none" or not messages or messages[-1].get("role") != "user":
        return None
    name = _object(tools[0], "function").get("name", "tool")
    if isinstance(choice, dict):
        name = _object(choice, "function").get("name", name)
    return {"id": "call_mock_0", "type": "function", "function": {"name": name, "arguments": "{}"}}


def _vector(text: str, dimensions: int) -> list[float]:
    seed = hashlib.sha256(text.encode()).digest()
    values: list[float] = []
    counter = 0
    while len(values) < dimensions:
        block = hashlib.sha256(seed + counter.to_bytes(4, "big")).digest()
        values.extend((b - 127.5) / 127.5 for b in block)
        counter += 1
    values = values[:dimensions]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def _stream(
    ident: str,
    created: int,
    model: str,
    message: dict[str, Any],
    finish: str,
    n: int,
    usage: dict[str, int] | None,
) -> list[bytes]:
    def event(choices: list[dict[str, Any]], chunk_usage: Any = None) -> bytes:
        chunk = {
            "id": ident,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": "fp_vkgate_mock",
            "choices": choices,
        }
        if usage is not None:
            chunk["usage"] = chunk_usage
        return b"data: " + _encode(chunk) + b"\n\n"

    def each(delta: dict[str, Any], finish_reason: str | None = None) -> list[dict[str, Any]]:
        return [
            {"index": i, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            for i in range(n)
        ]

    events = [event(each({"role": "assistant", "content": ""}))]
    if message.get("tool_calls"):
        call = message["tool_calls"][0]
        events.append(event(each({"tool_calls": [{"index": 0, **call}]})))
    else:
        for piece in re.findall(r"\s*\S+", message["content"]):
            events.append(event(each({"content": piece})))
    events.append(event(each({}, finish)))
    if usage is not None:
        events.append(event([], usage))
    events.append(b"data: [DONE]\n\n")
    return events

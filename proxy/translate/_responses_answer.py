"""The Responses API answer as a client expects it: a response object, or its typed events.

Answers are built by one `ResponseBuilder`, fed the provider's answer piece by piece: a plain
answer is fed whole and its final response object kept; a stream emits each event as its piece
arrives. So a stream's `response.completed` and a plain answer of the same provider reply are
the same object.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from proxy.errors import ProxyError
from proxy.usage import TokenUsage

Seal = Callable[[str], str]
"""The provider's id of an answer (its message id) → the response id the client sees."""

_encode = msgspec.json.Encoder().encode


def usage_out(usage: TokenUsage) -> dict[str, Any]:
    """A response's `usage`: input counts cached tokens in, output counts reasoning in."""
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cache_read_tokens,
            "cache_write_tokens": usage.cache_write_tokens,
        },
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


_ECHOED = (
    "instructions",
    "max_output_tokens",
    "metadata",
    "parallel_tool_calls",
    "reasoning",
    "safety_identifier",
    "prompt_cache_key",
    "temperature",
    "text",
    "tool_choice",
    "tools",
    "top_p",
    "truncation",
    "user",
)
_DEFAULTS: dict[str, Any] = {
    "instructions": None,
    "max_output_tokens": None,
    "metadata": {},
    "parallel_tool_calls": True,
    "reasoning": {"effort": None, "summary": None},
    "temperature": 1.0,
    "text": {"format": {"type": "text"}},
    "tool_choice": "auto",
    "tools": [],
    "top_p": 1.0,
    "truncation": "disabled",
}
_top_level = msgspec.json.Decoder(dict[str, msgspec.Raw])


@dataclass(slots=True)
class Frame:
    """What every response object of one request carries besides its output."""

    seal: Seal
    created_at: int
    echo: dict[str, Any] = field(default_factory=dict)
    """The request's settings, as a response object repeats them (its defaults otherwise)."""

    @classmethod
    def of(cls, body: bytes, seal: Seal, created_at: int) -> Frame:
        given = _top_level.decode(body)
        echo: dict[str, Any] = {}
        for name in _ECHOED:
            value = given.get(name)
            if value is not None and bytes(value) != b"null":
                echo[name] = value
            elif name in _DEFAULTS:
                echo[name] = _DEFAULTS[name]
        return cls(seal, created_at, echo)


def item_id(prefix: str, base: str, index: int) -> str:
    """A stable id for the `index`-th output item of the answer `base`: the same answer gets
    the same ids, in its stream and as a plain answer."""
    digest = hashlib.blake2b(f"{base}:{index}".encode(), digest_size=20).hexdigest()
    return f"{prefix}_{digest}"


REDACTED = "redacted_thinking:"
"""Marks the `encrypted_content` of a reasoning item that holds Anthropic's redacted thinking."""
REFUSAL = "refusal"
"""The key a refusal's message item is fed under (chat completions' `refusal` deltas)."""


@dataclass(slots=True)
class _Item:
    key: object
    index: int
    body: dict[str, Any]
    text: list[str] = field(default_factory=list)
    open: bool = True


class ResponseBuilder:
    """A response object built from the provider's answer piece by piece, and the typed events
    of its stream (`event:` and `data:`, every event with the next `sequence_number`)."""

    def __init__(self, frame: Frame, *, events: bool = True) -> None:
        self._frame = frame
        self._events = events
        """False for a plain answer, which keeps only the final object: no event is encoded."""
        self._items: list[_Item] = []
        self._by_key: dict[object, _Item] = {}
        self._base = ""
        self.id = ""
        self.model = ""
        self.sequence = 0
        self.started = False
        self.ended = False
        self.final: dict[str, Any] = {}
        """The response object once `finish` made it."""

    # -- events ---------------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> bytes:
        if not self._events:
            return b""
        data = {"type": kind, **fields, "sequence_number": self.sequence}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + _encode(data) + b"\n\n"

    def response(
        self,
        status: str,
        usage: TokenUsage | None = None,
        incomplete: str | None = None,
    ) -> dict[str, Any]:
        """The response object as it stands, with `status`."""
        echo = self._frame.echo
        return {
            "id": self.id,
            "object": "response",
            "created_at": self._frame.created_at,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "instructions": echo.get("instructions"),
            "max_output_tokens": echo.get("max_output_tokens"),
            "model": self.model,
            "output": [item.body for item in self._items if not item.open],
            "parallel_tool_calls": echo["parallel_tool_calls"],
            "previous_response_id": None,
            "reasoning": echo["reasoning"],
            "store": False,
            "temperature": echo["temperature"],
            "text": echo["text"],
            "tool_choice": echo["tool_choice"],
            "tools": echo["tools"],
            "top_p": echo["top_p"],
            "truncation": echo["truncation"],
            "usage": usage_out(usage) if usage is not None else None,
            "user": echo.get("user"),
            "safety_identifier": echo.get("safety_identifier"),
            "prompt_cache_key": echo.get("prompt_cache_key"),
            "metadata": echo["metadata"],
        }

    def start(self, upstream_id: str, model: str) -> bytes:
        """`response.created` and `response.in_progress`, once the provider's answer began."""
        self._base = upstream_id
        self.id = self._frame.seal(upstream_id)
        self.model = model
        self.started = True
        created = self.response("in_progress")
        return self._event("response.created", response=created) + self._event(
            "response.in_progress", response=created
        )

    def _add(self, key: object, prefix: str, body: dict[str, Any]) -> tuple[_Item, bytes]:
        index = len(self._items)
        body = {"id": item_id(prefix, self._base, index), **body}
        item = _Item(key, index, body)
        self._items.append(item)
        self._by_key[key] = item
        return item, self._event("response.output_item.added", output_index=index, item=body)

    def item(self, key: object) -> _Item | None:
        """The open item fed under `key`, if any."""
        item = self._by_key.get(key)
        return item if item is not None and item.open else None

    # -- text -----------------------------------------------------------------------------------

    def text(self, key: object, delta: str) -> bytes:
        """`delta` added to the message item under `key` (`REFUSAL` for a refusal), opened when
        it is new."""
        refusal = key == REFUSAL
        out = b""
        item = self.item(key)
        if item is None:
            part = _refusal_part("") if refusal else _text_part("")
            item, out = self._add(
                key,
                "msg",
                {"type": "message", "status": "in_progress", "content": [], "role": "assistant"},
            )
            out += self._event(
                "response.content_part.added",
                item_id=item.body["id"],
                output_index=item.index,
                content_index=0,
                part=part,
            )
        if not delta:
            return out
        item.text.append(delta)
        if refusal:
            return out + self._event(
                "response.refusal.delta",
                item_id=item.body["id"],
                output_index=item.index,
                content_index=0,
                delta=delta,
            )
        return out + self._event(
            "response.output_text.delta",
            item_id=item.body["id"],
            output_index=item.index,
            content_index=0,
            delta=delta,
            logprobs=[],
        )

    # -- function calls ---------------------------------------------------------------------------

    def call(self, key: object, call_id: str, name: str) -> bytes:
        _, out = self._add(
            key,
            "fc",
            {
                "type": "function_call",
                "status": "in_progress",
                "arguments": "",
                "call_id": call_id,
                "name": name,
            },
        )
        return out

    def arguments(self, key: object, delta: str) -> bytes:
        item = self.item(key)
        if item is None or not delta:
            return b""
        item.text.append(delta)
        return self._event(
            "response.function_call_arguments.delta",
            item_id=item.body["id"],
            output_index=item.index,
            delta=delta,
        )

    # -- reasoning (Anthropic's thinking) ---------------------------------------------------------

    def reasoning(self, key: object, redacted: str | None = None) -> bytes:
        body: dict[str, Any] = {"type": "reasoning", "summary": []}
        if redacted is not None:
            body["encrypted_content"] = REDACTED + redacted
            _, out = self._add(key, "rs", body)
            return out
        item, out = self._add(key, "rs", body)
        return out + self._event(
            "response.reasoning_summary_part.added",
            item_id=item.body["id"],
            output_index=item.index,
            summary_index=0,
            part={"type": "summary_text", "text": ""},
        )

    def thought(self, key: object, delta: str) -> bytes:
        item = self.item(key)
        if item is None or not delta:
            return b""
        item.text.append(delta)
        return self._event(
            "response.reasoning_summary_text.delta",
            item_id=item.body["id"],
            output_index=item.index,
            summary_index=0,
            delta=delta,
        )

    def signature(self, key: object, signature: str) -> None:
        item = self.item(key)
        if item is not None and signature:
            item.body["encrypted_content"] = item.body.get("encrypted_content", "") + signature

    # -- ends -------------------------------------------------------------------------------------

    def close(self, key: object) -> bytes:
        """The item under `key` done: its `.done` events, with everything it holds."""
        item = self.item(key)
        if item is None:
            return b""
        item.open = False
        self._by_key.pop(key, None)
        body, ident, index = item.body, item.body["id"], item.index
        text = "".join(item.text)
        kind = body["type"]
        out = b""
        if kind == "message":
            out += self._message_done(item, text)
        elif kind == "function_call":
            body["arguments"] = text
            body["status"] = "completed"
            out += self._event(
                "response.function_call_arguments.done",
                item_id=ident,
                output_index=index,
                name=body["name"],
                arguments=text,
            )
        elif "encrypted_content" not in body or not body["encrypted_content"].startswith(REDACTED):
            summary = {"type": "summary_text", "text": text}
            body["summary"] = [summary]
            out += self._event(
                "response.reasoning_summary_text.done",
                item_id=ident,
                output_index=index,
                summary_index=0,
                text=text,
            )
            out += self._event(
                "response.reasoning_summary_part.done",
                item_id=ident,
                output_index=index,
                summary_index=0,
                part=summary,
            )
        return out + self._event("response.output_item.done", output_index=index, item=body)

    def _message_done(self, item: _Item, text: str) -> bytes:
        body, ident, index = item.body, item.body["id"], item.index
        refusal = item.key == REFUSAL
        part = _refusal_part(text) if refusal else _text_part(text)
        body["content"] = [part]
        body["status"] = "completed"
        if refusal:
            done = self._event(
                "response.refusal.done",
                item_id=ident,
                output_index=index,
                content_index=0,
                refusal=text,
            )
        else:
            done = self._event(
                "response.output_text.done",
                item_id=ident,
                output_index=index,
                content_index=0,
                text=text,
                logprobs=[],
            )
        return done + self._event(
            "response.content_part.done",
            item_id=ident,
            output_index=index,
            content_index=0,
            part=part,
        )

    def finish(self, usage: TokenUsage | None, incomplete: str | None = None) -> bytes:
        """Every open item closed, then `response.completed` (or `response.incomplete`)."""
        out = b"".join(self.close(item.key) for item in list(self._items) if item.open)
        self.ended = True
        if incomplete is not None:
            self.final = self.response("incomplete", usage, incomplete)
            return out + self._event("response.incomplete", response=self.final)
        self.final = self.response("completed", usage)
        return out + self._event("response.completed", response=self.final)

    def fail(self, error: ProxyError) -> bytes:
        """The stream's last event when the provider failed: `response.failed`, with what was
        made so far and the error, once the response began; else an `error` event."""
        self.ended = True
        if not self.started:
            return error_event(error, self.sequence)
        out = b"".join(self.close(item.key) for item in list(self._items) if item.open)
        self.final = self.response("failed")
        self.final["error"] = {"code": "server_error", "message": error.message}
        return out + self._event("response.failed", response=self.final)


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


def _refusal_part(text: str) -> dict[str, Any]:
    return {"type": "refusal", "refusal": text}


def error_event(error: ProxyError, sequence: int) -> bytes:
    """A Responses stream's `error` event: what ends a stream that failed before its response
    began, or whose connection broke off (the gateway then has no response object to fail)."""
    data = {
        "type": "error",
        "code": error.code.value,
        "message": error.message,
        "param": error.param,
        "sequence_number": sequence,
    }
    return b"event: error\ndata: " + _encode(data) + b"\n\n"


def encode(value: Any) -> bytes:
    return _encode(value)

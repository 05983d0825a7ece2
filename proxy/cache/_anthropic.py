"""Anthropic messages in the cache: a stream read back into the plain message it stands for,
and a plain message replayed as the events Anthropic's SDKs read."""

from __future__ import annotations

import copy
from typing import Any

import msgspec

from proxy.cache._events import NotAnAnswer, data_of, event

_EMPTY_STARTS: dict[str, dict[str, Any]] = {
    "text": {"text": ""},
    "thinking": {"thinking": "", "signature": ""},
    "tool_use": {"input": {}},
    "server_tool_use": {"input": {}},
}
"""How a block of these types opens in a stream; its content follows in deltas. Any other
block (redacted thinking, a tool's result) opens whole."""


def assemble(stream: bytes) -> dict[str, Any]:
    """The `message` a stream of events adds up to."""
    message: dict[str, Any] | None = None
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, list[str]] = {}
    stopped = False
    for name, data in data_of(stream):
        kind = data.get("type", name) if isinstance(data, dict) else name
        if kind == "error":
            raise NotAnAnswer("the stream carried an error")
        if kind == "message_start":
            message = dict(data["message"])
            message["content"] = []
        elif kind == "content_block_start":
            blocks[data["index"]] = dict(data["content_block"])
        elif kind == "content_block_delta":
            _apply(blocks[data["index"]], data["delta"], partial.setdefault(data["index"], []))
        elif kind == "message_delta" and message is not None:
            message.update(data.get("delta") or {})
            message["usage"] = {**(message.get("usage") or {}), **(data.get("usage") or {})}
        elif kind == "message_stop":
            stopped = True
    if message is None or not stopped:
        raise NotAnAnswer("the stream did not end its message")
    for index, parts in partial.items():
        if parts:
            try:
                blocks[index]["input"] = msgspec.json.decode("".join(parts))
            except msgspec.DecodeError:
                raise NotAnAnswer("a tool call's input is not JSON") from None
    message["content"] = [blocks[i] for i in sorted(blocks)]
    return message


def _apply(block: dict[str, Any], delta: dict[str, Any], json_parts: list[str]) -> None:
    kind = delta.get("type")
    if kind == "text_delta":
        block["text"] = block.get("text", "") + delta.get("text", "")
    elif kind == "thinking_delta":
        block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
    elif kind == "signature_delta":
        block["signature"] = delta.get("signature", "")
    elif kind == "input_json_delta":
        json_parts.append(delta.get("partial_json", ""))
    elif kind == "citations_delta":
        block.setdefault("citations", []).append(delta.get("citation"))
    else:
        raise NotAnAnswer(f"a delta of a kind not known here: {kind!r}")


def replay(message: dict[str, Any]) -> bytes:
    """The plain message as the events a stream of it would have sent."""
    usage = dict(message.get("usage") or {})
    opening = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 0},
    }
    out = bytearray(event({"type": "message_start", "message": opening}, "message_start"))
    for index, block in enumerate(message.get("content") or ()):
        kind = block.get("type")
        empty = _EMPTY_STARTS.get(kind)
        start = {**copy.deepcopy(block), **empty} if empty is not None else block
        if kind == "text" and "citations" in block:
            start["citations"] = []
        out.extend(
            event(
                {"type": "content_block_start", "index": index, "content_block": start},
                "content_block_start",
            )
        )
        for delta in _deltas(block) if empty is not None else ():
            out.extend(
                event(
                    {"type": "content_block_delta", "index": index, "delta": delta},
                    "content_block_delta",
                )
            )
        out.extend(event({"type": "content_block_stop", "index": index}, "content_block_stop"))
    out.extend(
        event(
            {
                "type": "message_delta",
                "delta": {
                    "stop_reason": message.get("stop_reason"),
                    "stop_sequence": message.get("stop_sequence"),
                },
                "usage": usage,
            },
            "message_delta",
        )
    )
    out.extend(event({"type": "message_stop"}, "message_stop"))
    return bytes(out)


def _deltas(block: dict[str, Any]) -> list[dict[str, Any]]:
    kind = block.get("type")
    if kind == "text":
        deltas: list[dict[str, Any]] = [{"type": "text_delta", "text": block.get("text", "")}]
        deltas.extend(
            {"type": "citations_delta", "citation": c} for c in block.get("citations") or ()
        )
        return deltas
    if kind == "thinking":
        return [
            {"type": "thinking_delta", "thinking": block.get("thinking", "")},
            {"type": "signature_delta", "signature": block.get("signature", "")},
        ]
    # Tool calls: the input as one piece of JSON.
    return [
        {
            "type": "input_json_delta",
            "partial_json": msgspec.json.encode(block.get("input") or {}).decode(),
        }
    ]

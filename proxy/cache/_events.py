"""Server-sent events read back from a stream the client was sent, and written anew."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec

_decode = msgspec.json.decode
_encode = msgspec.json.encode


class NotAnAnswer(ValueError):
    """A recorded stream that cannot be read back as a whole answer: not cached."""


def data_of(stream: bytes) -> Iterator[tuple[str, Any]]:
    """Each event of `stream` as (event name, decoded data); `[DONE]` and comments skipped."""
    for block in stream.replace(b"\r\n", b"\n").split(b"\n\n"):
        name = ""
        data: list[bytes] = []
        for line in block.split(b"\n"):
            if line.startswith(b"data:"):
                data.append(line[5:].removeprefix(b" "))
            elif line.startswith(b"event:"):
                name = line[6:].strip().decode("utf-8", "replace")
        if not data:
            continue
        payload = b"\n".join(data)
        if payload == b"[DONE]":
            continue
        try:
            yield name, _decode(payload)
        except msgspec.DecodeError:
            raise NotAnAnswer("an event's data is not JSON") from None


def event(data: Any, name: str | None = None) -> bytes:
    """One event: `event: <name>` (when named) and its data as compact JSON."""
    line = b"data: " + _encode(data) + b"\n\n"
    return b"event: " + name.encode() + b"\n" + line if name else line

"""AWS event-stream frames (`application/vnd.amazon.eventstream`), written as Bedrock writes them.

A frame is a prelude (total length, headers length, the prelude's CRC32), headers (name length,
name, value type 7 = string, value length, value), the payload, and the whole frame's CRC32.
botocore only reads frames; the fakes need to write them.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

STRING = 7


def _headers(headers: dict[str, str]) -> bytes:
    out = b""
    for name, value in headers.items():
        raw_name, raw_value = name.encode(), value.encode()
        out += struct.pack(">B", len(raw_name)) + raw_name
        out += struct.pack(">BH", STRING, len(raw_value)) + raw_value
    return out


def frame(headers: dict[str, str], payload: bytes) -> bytes:
    head = _headers(headers)
    total = 12 + len(head) + len(payload) + 4
    prelude = struct.pack(">II", total, len(head))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    message = prelude + head + payload
    return message + struct.pack(">I", zlib.crc32(message))


def event(event_type: str, payload: dict[str, Any]) -> bytes:
    """One event of a ConverseStream, as Bedrock frames it (a `p` field pads the payload)."""
    body = json.dumps({**payload, "p": "abcdefghijklmnopqrstu"}, separators=(",", ":")).encode()
    return frame(
        {
            ":event-type": event_type,
            ":content-type": "application/json",
            ":message-type": "event",
        },
        body,
    )


def exception(exception_type: str, message: str) -> bytes:
    """An exception inside a ConverseStream (`throttlingException`, …)."""
    return frame(
        {
            ":exception-type": exception_type,
            ":content-type": "application/json",
            ":message-type": "exception",
        },
        json.dumps({"message": message}).encode(),
    )

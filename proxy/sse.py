"""Server-sent events on the way through: split at event boundaries, drop the usage-only chunk.

Bytes are forwarded as they arrive; an event is held only until its terminating blank line
arrives, and only when something must be dropped from the stream.
"""

from __future__ import annotations

import msgspec

_TERMINATORS = (b"\n\n", b"\r\n\r\n", b"\r\r")


class Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class _Chunk(msgspec.Struct):
    choices: list[msgspec.Raw] = []
    usage: Usage | None = None


_chunk = msgspec.json.Decoder(_Chunk)


def _boundary(buffer: bytes, start: int) -> tuple[int, int]:
    """Index and length of the first event terminator at or after `start`, or (-1, 0)."""
    best, size = -1, 0
    for terminator in _TERMINATORS:
        at = buffer.find(terminator, start)
        if at >= 0 and (best < 0 or at < best):
            best, size = at, len(terminator)
    return best, size


class UsageChunkFilter:
    """Passes an OpenAI chat stream through minus the usage-only chunk the client didn't ask for.

    The proxy asks the provider for that chunk (for accounting); `usage` keeps what it said.
    """

    __slots__ = ("_pending", "usage")

    def __init__(self) -> None:
        self._pending = b""
        self.usage: Usage | None = None

    def feed(self, data: bytes) -> bytes:
        """The complete events in `data` (plus what was pending) that go to the client."""
        buffer = self._pending + data if self._pending else data
        out: list[bytes] = []
        start = 0
        while True:
            at, size = _boundary(buffer, start)
            if at < 0:
                break
            end = at + size
            event = buffer[start:end]
            if not self._is_usage_only(event):
                out.append(event)
            start = end
        self._pending = buffer[start:]
        return b"".join(out)

    def flush(self) -> bytes:
        """Whatever is left when the upstream ends (an unterminated last event)."""
        rest, self._pending = self._pending, b""
        return b"" if self._is_usage_only(rest) else rest

    def _is_usage_only(self, event: bytes) -> bool:
        if b'"usage"' not in event or b'"choices"' not in event:
            return False
        for line in event.splitlines():
            if not line.startswith(b"data:"):
                continue
            try:
                chunk = _chunk.decode(line[5:].strip())
            except msgspec.DecodeError:
                return False
            if chunk.usage is not None and not chunk.choices:
                self.usage = chunk.usage
                return True
        return False

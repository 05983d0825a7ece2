"""Server-sent events on the way through: split at event boundaries, drop the usage-only chunk.

Bytes are forwarded as they arrive; an event is held only until its terminating blank line
arrives, and only when something must be dropped from the stream.
"""

from __future__ import annotations

import msgspec

_TERMINATORS = (b"\n\n", b"\r\n\r\n", b"\r\r")
_SIZES = tuple(len(terminator) for terminator in _TERMINATORS)
_LONGEST = max(_SIZES)


class Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class _Chunk(msgspec.Struct):
    choices: list[msgspec.Raw] = []
    usage: Usage | None = None


_chunk = msgspec.json.Decoder(_Chunk)


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
        if self._pending:
            # The pending bytes hold no terminator: only one straddling the seam can be new.
            search = max(len(self._pending) - _LONGEST + 1, 0)
            buffer = self._pending + data
        else:
            search, buffer = 0, data
        out: list[bytes] = []
        start = 0
        lf = buffer.find(b"\n\n", search)
        crlf = buffer.find(b"\r\n\r\n", search)
        cr = buffer.find(b"\r\r", search)
        if crlf < 0 and cr < 0:  # the usual stream: LF line endings only
            while lf >= 0:
                end = lf + 2
                event = buffer[start:end]
                if not self._is_usage_only(event):
                    out.append(event)
                start = end
                lf = buffer.find(b"\n\n", start)
        else:
            start = self._split_mixed(buffer, [lf, crlf, cr], out)
        self._pending = buffer[start:]
        return b"".join(out)

    def _split_mixed(self, buffer: bytes, found: list[int], out: list[bytes]) -> int:
        """Events ended by any terminator; `found` holds where each occurs next.

        A position is searched again only once passed, so a chunk of many events is scanned
        once, not once per event. Returns where the unterminated rest begins.
        """
        start = 0
        while True:
            first = -1  # the terminator that starts first
            for index, at in enumerate(found):
                if at >= 0 and (first < 0 or at < found[first]):
                    first = index
            if first < 0:
                return start
            end = found[first] + _SIZES[first]
            event = buffer[start:end]
            if not self._is_usage_only(event):
                out.append(event)
            start = end
            for index, at in enumerate(found):
                if 0 <= at < start:
                    found[index] = buffer.find(_TERMINATORS[index], start)

    def flush(self) -> bytes:
        """Whatever is left when the upstream ends (an unterminated last event)."""
        rest, self._pending = self._pending, b""
        return b"" if self._is_usage_only(rest) else rest

    def _is_usage_only(self, event: bytes) -> bool:
        """Whether `event` is the usage-only chunk, keeping its usage when it is.

        Only an event whose one `data:` line is that chunk: an event that also carries other
        data (a malformed stream that glued chunks together) passes whole.
        """
        if b'"usage"' not in event or b'"choices"' not in event or b'"usage":null' in event:
            # Once usage is asked for, every chunk carries `"usage":null`: no need to decode.
            return False
        data = [line for line in event.splitlines() if line.startswith(b"data:")]
        if len(data) != 1:
            return False
        try:
            chunk = _chunk.decode(data[0][5:].strip())
        except msgspec.DecodeError:
            return False
        if chunk.usage is None or chunk.choices:
            return False
        self.usage = chunk.usage
        return True

"""Server-sent events on the way through: split at event boundaries, read the usage chunk.

`UsageChunkFilter` forwards an OpenAI stream as it arrives; an event is held only until its
terminating blank line arrives, and only when something must be dropped from the stream.
`EventReader` parses events for the translators, which rewrite every event anyway.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import msgspec

from proxy.usage import OpenAIUsage, TokenUsage, from_openai

_TERMINATORS = (b"\n\n", b"\r\n\r\n", b"\r\r")
_SIZES = tuple(len(terminator) for terminator in _TERMINATORS)
_LONGEST = max(_SIZES)


class _Chunk(msgspec.Struct):
    choices: list[msgspec.Raw] = []
    usage: OpenAIUsage | None = None
    model: str | None = None


class _Model(msgspec.Struct):
    model: str | None = None


_chunk = msgspec.json.Decoder(_Chunk)
_model = msgspec.json.Decoder(_Model)


class UsageChunkFilter:
    """Passes an OpenAI chat stream through, reading the usage-only chunk on the way.

    The proxy asks the provider for that chunk (for accounting): with `drop` (the default) the
    chunk is left out, for a client that did not ask for it; without, every byte passes at
    once, as it arrived. Either way `usage` keeps what the chunk said and `model` the first
    `model` a chunk names.
    """

    __slots__ = ("_drop", "_pending", "model", "usage")

    def __init__(self, *, drop: bool = True) -> None:
        self._drop = drop
        self._pending = b""
        self.usage: TokenUsage | None = None
        self.model: str | None = None

    def feed(self, data: bytes) -> bytes:
        """The complete events in `data` (plus what was pending) that go to the client.

        Without `drop`: `data` itself, whole or not.
        """
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
        return b"".join(out) if self._drop else data

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
        usage_only = self._is_usage_only(rest)
        # Without `drop`, `feed` already passed these bytes on.
        return b"" if usage_only or not self._drop else rest

    def _is_usage_only(self, event: bytes) -> bool:
        """Whether `event` is the usage-only chunk, keeping its usage when it is.

        Only an event whose one `data:` line is that chunk: an event that also carries other
        data (a malformed stream that glued chunks together) passes whole.
        """
        if self.model is None:
            self._read_model(event)
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
        self.usage = from_openai(chunk.usage)
        self.model = chunk.model or self.model
        return True

    def _read_model(self, event: bytes) -> None:
        """The served model, from the first chunk that names one: one small decode a stream."""
        if b'"model"' not in event:
            return
        for line in event.splitlines():
            if line.startswith(b"data:"):
                try:
                    self.model = _model.decode(line[5:].strip()).model
                except msgspec.DecodeError:
                    return
                return


# -- parsing events, for the translators ------------------------------------------------------


class Event(NamedTuple):
    name: bytes
    """The `event:` field; empty when the event has none."""
    data: bytes
    """The `data:` lines, joined by `\\n`."""


_LINE_END = re.compile(rb"\r\n|\r|\n")


class EventReader:
    """Parses server-sent events out of bytes cut at any boundary, with any line endings.

    Fields other than `event` and `data` (`id`, `retry`) and comments are skipped. Unlike a
    browser, `flush` also hands over an event whose final blank line never came: a provider
    that closed its stream right after its last event meant that event.
    """

    __slots__ = ("_data", "_line", "_name", "_skip_lf")

    def __init__(self) -> None:
        self._line = b""
        self._skip_lf = False  # the last chunk ended in CR: an LF starting the next is its pair
        self._name = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[Event]:
        if not chunk:
            return []
        if self._skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        buffer = self._line + chunk if self._line else chunk
        if b"\r" in buffer:
            lines = _LINE_END.split(buffer)
            self._skip_lf = buffer.endswith(b"\r")
        else:
            lines = buffer.split(b"\n")
            self._skip_lf = False
        self._line = lines.pop()
        events: list[Event] = []
        for line in lines:
            self._take(line, events)
        return events

    def flush(self) -> list[Event]:
        events: list[Event] = []
        if self._line:
            self._take(self._line, events)
            self._line = b""
        self._take(b"", events)
        return events

    def _take(self, line: bytes, events: list[Event]) -> None:
        if not line:
            if self._data:
                events.append(Event(self._name, b"\n".join(self._data)))
            self._name, self._data = b"", []
            return
        name, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._name = value

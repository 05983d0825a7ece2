"""A Responses stream from a provider that serves the API, passed on with its id swapped."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from proxy import usage as U
from proxy.usage import TokenUsage, events_end


class _Response(msgspec.Struct):
    id: str | None = None
    model: str | None = None
    usage: U.ResponsesUsage | None = None


class _Event(msgspec.Struct):
    type: str = ""
    response: _Response | None = None
    sequence_number: int | None = None


_event = msgspec.json.Decoder(_Event)
_ENDS = (b'"response.completed"', b'"response.incomplete"', b'"response.failed"')
_FAILED = (b'"response.failed"', b"event: error", b'"type":"error"')


class PassThrough:
    """A Responses stream passed on event by event, its response id swapped for the sealed one.

    Only what is needed is read: the first event that names the response (its id, once), and
    the last (`response.completed`, `.incomplete` or `.failed`: the usage). An event is held
    only until its blank line arrives, so the id can be swapped whole.
    """

    __slots__ = ("_swap_for", "_swaps", "_tail", "errored", "model", "sequence", "usage")

    def __init__(self, swap_for: Callable[[str | None], list[tuple[bytes, bytes]]]) -> None:
        self._swap_for = swap_for
        self._swaps: list[tuple[bytes, bytes]] | None = None
        self._tail = b""
        self.usage: TokenUsage | None = None
        self.model: str | None = None
        self.errored = False
        self.sequence = 0
        """The next `sequence_number`: an error the gateway adds follows the provider's last."""

    def feed(self, data: bytes) -> bytes:
        buffer = self._tail + data if self._tail else data
        end = events_end(buffer)
        if end <= 0:
            self._tail = buffer
            return b""
        self._tail = buffer[end:]
        return self._pass(buffer[:end] if end < len(buffer) else buffer)

    def finish(self) -> bytes:
        rest, self._tail = self._tail, b""
        return self._pass(rest) if rest else b""

    def _pass(self, complete: bytes) -> bytes:
        if self._swaps is None:
            self._learn(complete)
        if any(end in complete for end in _ENDS):
            self._read_end(complete)
        if not self.errored and any(failed in complete for failed in _FAILED):
            self.errored = self._failed(complete)
        for old, new in self._swaps or ():
            complete = complete.replace(old, new)
        return complete

    def _events(self, complete: bytes) -> list[_Event]:
        if b"\r" in complete:
            complete = complete.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        events = []
        for block in complete.split(b"\n\n"):
            data = b"\n".join(
                line[5:].removeprefix(b" ")
                for line in block.split(b"\n")
                if line.startswith(b"data:")
            )
            if not data:
                continue
            try:
                events.append(_event.decode(data))
            except msgspec.DecodeError:
                continue
        if events and events[-1].sequence_number is not None:
            self.sequence = events[-1].sequence_number + 1
        return events

    def _learn(self, complete: bytes) -> None:
        """The response's id, from the first event that names the response."""
        if b'"response"' not in complete:
            return
        for event in self._events(complete):
            if event.response is not None and event.response.id:
                self.model = event.response.model or self.model
                self._swaps = self._swap_for(event.response.id)
                return

    def _read_end(self, complete: bytes) -> None:
        for event in self._events(complete):
            if event.response is not None and event.type.startswith("response."):
                self.model = event.response.model or self.model
                if event.response.usage is not None:
                    self.usage = U.from_responses(event.response.usage)

    def _failed(self, complete: bytes) -> bool:
        return any(event.type in ("error", "response.failed") for event in self._events(complete))

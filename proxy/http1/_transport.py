"""What the proxy's HTTP/1.1 protocol puts between itself and the socket: `OneWrite`, which
sends an answer's head with the body that follows it, and `ReadDeadlines`, one timer per event
loop that closes the connections of clients too slow to send their request."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from proxy.pace import pace_of

if TYPE_CHECKING:
    from proxy.http1._protocol import OneWriteHttpToolsProtocol


class OneWrite:
    """A transport that holds one write until the next write or the loop's next turn, and a
    whole answer (`writelines`) until the loop's next turn while its `Pace` is busy."""

    __slots__ = ("_held", "_loop", "_pace", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pace = pace_of(loop)
        self._held: tuple[bytes, ...] | None = None
        """Buffers held for one system call (writev) with what follows, none of them copied
        but a lone `write`'s (which may be a view of a buffer its caller reuses)."""

    def write(self, data: bytes) -> None:
        held = self._held
        if held is None:
            self._held = (bytes(data),)
            self._loop.call_soon(self._flush)
            return
        self._held = None
        self._transport.writelines((*held, data))

    def writelines(self, data: Iterable[bytes]) -> None:
        held, self._held = self._held, None
        if held is not None:
            data = (*held, *data)
        if self._pace.busy:
            # Sent with the loop's other writes at its next turn (see proxy/pace.py); what
            # is written meanwhile goes after it.
            self._held = tuple(data)
            if held is None:
                self._loop.call_soon(self._flush)
            return
        self._transport.writelines(data)

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.writelines(held)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_write_buffer_size(self) -> int:
        held = self._held
        return self._transport.get_write_buffer_size() + (sum(map(len, held)) if held else 0)

    def __getattr__(self, name: str) -> Any:
        # Everything else (is_closing, get_extra_info, pause_reading, …) is the transport's.
        return getattr(self._transport, name)


class ReadDeadlines:
    """One timer for every connection of a loop: each sweep closes the connections it found
    waiting for the same part of a request at the previous sweep, so none waits for one much
    longer than two intervals."""

    def __init__(self, interval_s: float) -> None:
        # Not the loop itself: this is the value of a weak mapping keyed by the loop.
        self._interval_s = interval_s
        self._watched: set[OneWriteHttpToolsProtocol] = set()
        self._timer: asyncio.TimerHandle | None = None

    def watch(self, connection: OneWriteHttpToolsProtocol) -> None:
        self._watched.add(connection)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._interval_s, self._sweep)

    def forget(self, connection: OneWriteHttpToolsProtocol) -> None:
        self._watched.discard(connection)

    def _sweep(self) -> None:
        self._timer = None
        for connection in [c for c in self._watched if c.overdue()]:
            connection.cut_slow_client()
        if self._watched:
            self._timer = asyncio.get_running_loop().call_later(self._interval_s, self._sweep)


_deadlines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ReadDeadlines] = (
    weakref.WeakKeyDictionary()
)


def deadlines_of(loop: asyncio.AbstractEventLoop, interval_s: float) -> ReadDeadlines:
    deadlines = _deadlines.get(loop)
    if deadlines is None or deadlines._interval_s != interval_s:
        deadlines = _deadlines[loop] = ReadDeadlines(interval_s)
    return deadlines

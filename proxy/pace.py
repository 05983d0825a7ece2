"""When the proxy's socket writes go: at once, or with the other writes of the loop's turn.

A write to a socket on loopback runs the receiving side's TCP and wakes the process reading
it, and waking one that sleeps on another core is the dearest part of a send: about a tenth of
the proxy's CPU at c=16 on a 2-core VM (`perf`: `sock_def_readable`, some 25 µs a request).
While more than one request is in flight on a loop, the client answers and provider requests
of the loop's turn therefore wait for its next turn and go out one after another, where a peer
woken by the first finds the rest in the same wake-up. Four interleaved pairs of 8 s wrk runs
at c=16, one worker: 2,612-3,488 → 3,149-3,807 requests a second, proxy CPU per request
282-377 → 260-313 µs. With one request in flight nothing else would go in the turn, so its
writes go at once: holding every write cost c=1 a fifth of its throughput. Where clients and
providers are on other machines a write wakes no local process, and the gain is smaller.
"""

from __future__ import annotations

import asyncio
import weakref


class Pace:
    """Requests in flight on one event loop: paid ones counted by the gateway serving them,
    and every request whose head has arrived counted by the loop's HTTP server."""

    __slots__ = ("in_flight", "serving")

    def __init__(self) -> None:
        self.in_flight = 0
        self.serving = 0
        """Requests the server has handed to the app whose tasks are not yet done. An answer
        that needs no await (a cache hit, a refusal) is written in its task's first step,
        before the requests that arrived in the same turn are admitted: counted here from
        their arrival, they make its write go with theirs."""

    @property
    def busy(self) -> bool:
        """More than one request in flight: a write may wait for the loop's next turn."""
        return self.in_flight > 1 or self.serving > 1


_PACES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Pace] = weakref.WeakKeyDictionary()


def pace_of(loop: asyncio.AbstractEventLoop) -> Pace:
    """The loop's one `Pace`, made on first use (the server, the provider client and the
    gateway of a loop share it)."""
    pace = _PACES.get(loop)
    if pace is None:
        pace = _PACES[loop] = Pace()
    return pace

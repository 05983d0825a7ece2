"""Stop signals: noticed the moment they arrive, and a stop by one of them ending in exit 0.

A server (uvicorn) turns SIGTERM into "stop accepting, wait for requests in progress, then shut
the app down": the app hears of it only at the end. A service that must act at once (answer
`/readyz` with 503 so load balancers stop sending, release long-polls that would otherwise hold
the drain for their whole timeout) wraps the server's own handler with `StopSignals`.

Once it has drained, uvicorn raises the signal again, so that the process ends by it; a
service's server takes its signals through `signals_to` instead, and a stop that drained
cleanly exits with 0, as orchestrators and process supervisors read a clean stop.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import uvicorn

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """Calls `on_stop(signal name)` when SIGTERM or SIGINT arrives, then the handler that was
    installed before (the server's), so the server stops as it always does."""

    def __init__(self, on_stop: Callable[[str], None]) -> None:
        self._on_stop = on_stop
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """Wrap the installed handlers. Only a Python handler is wrapped: where the default
        action (die) or none is installed, no server drains, and nothing is gained."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in SIGNALS:
            previous = signal.getsignal(sig)
            if callable(previous):
                self._previous[sig] = previous
                signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            if signal.getsignal(sig) == self._handle:
                signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, sig: int, frame: FrameType | None) -> None:
        try:
            self._on_stop(signal.Signals(sig).name)
        finally:
            # Whatever `on_stop` did, the server hears of the stop.
            previous = self._previous.get(sig)
            if previous is not None:
                previous(sig, frame)


@contextlib.contextmanager
def signals_to(handler: Callable[[int, FrameType | None], Any]) -> Iterator[None]:
    """SIGTERM and SIGINT go to `handler` inside the block, to the handlers before it after; a
    server's `capture_signals`, without raising the signal again at the end."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread can set handlers (a server run by a test's thread)
        return
    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)


def returning_server(config: uvicorn.Config) -> uvicorn.Server:
    """A uvicorn server whose `run` returns once a stop signal has drained it."""
    import uvicorn

    class Returning(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with signals_to(self.handle_exit):
                yield

    return Returning(config)

"""Noticing a stop signal the moment it arrives, before the server begins to drain.

A server (uvicorn) turns SIGTERM into "stop accepting, wait for requests in progress, then shut
the app down": the app hears of it only at the end. A service that must act at once (answer
`/readyz` with 503 so load balancers stop sending, release long-polls that would otherwise hold
the drain for their whole timeout) wraps the server's own handler with `StopSignals`.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

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

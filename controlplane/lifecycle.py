"""Stopping gracefully: draining from the moment the stop signal arrives, long-polls released."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from controlplane.feed.service import FeedNotifier
from vkgate.logs import event
from vkgate.stopping import StopSignals

log = logging.getLogger("vkgate.controlplane")


class Lifecycle:
    """Serving, then draining (once, for good): the control plane's shutdown state.

    Draining makes `/readyz` answer 503 so load balancers stop sending, and ends the wait of
    every change-feed long-poll, so the server's graceful shutdown is not held for the whole
    grace by polls that would otherwise wait up to 25 s and then be cut.
    """

    def __init__(self, *, notifier: FeedNotifier, grace_s: float) -> None:
        self._notifier = notifier
        self._grace_s = grace_s
        self._draining = False
        self._signals: StopSignals | None = None

    @property
    def draining(self) -> bool:
        return self._draining

    def drain(self, reason: str) -> None:
        """Begin draining: waiting long-polls answer now, new ones do not wait. Idempotent."""
        if self._draining:
            return
        self._draining = True
        released = self._notifier.waiting
        self._notifier.notify()
        event(
            log, "shutdown_started", reason=reason, grace_s=self._grace_s, released_polls=released
        )

    def completed(self) -> None:
        event(log, "shutdown_completed")

    def hear_stop_signals(self) -> None:
        """Drain as soon as SIGINT or SIGTERM arrives, then let the server's handler run.

        Called at start-up, inside the running loop: uvicorn has installed its handlers with
        `signal.signal` by then, and acts on them only when its main loop next looks (every
        0.1 s), after which it waits for the requests in flight: wrapping its handler starts
        the draining first (vkgate/stopping.py).
        """
        loop = asyncio.get_running_loop()

        def on_stop(name: str) -> None:
            # A signal handler runs between two bytecodes of the main thread, possibly inside
            # the loop's own code: the loop is only asked to drain, through its thread-safe
            # door. A loop already closed (the app gone, the handler not restored) hears nothing.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self.drain, name)

        self._signals = StopSignals(on_stop)
        self._signals.install()

    def restore_signals(self) -> None:
        """Put back the handlers `hear_stop_signals` wrapped (unless since replaced)."""
        if self._signals is not None:
            self._signals.uninstall()
            self._signals = None

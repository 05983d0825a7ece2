"""The change-feed poller: one long-poll per proxy process, applying events to the auth cache.

One poll for every organization (the feed's revision is global), so a replica holds one
connection to the control plane however many organizations it serves. A write on the control
plane wakes the poll at once; the cache evicts or refreshes within milliseconds of it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from proxy.auth import AuthCache
from proxy.control import ControlPlaneClient, Unreachable

log = logging.getLogger("vkgate.proxy.feed")

INITIAL_BACKOFF_S = 0.5
# Capped at a second: after an outage, changes must again reach the proxy within one.
MAX_BACKOFF_S = 1.0


class ChangeFeedPoller:
    def __init__(
        self,
        control: ControlPlaneClient,
        cache: AuthCache,
        *,
        timeout_s: float = 20.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._monotonic = monotonic
        self._control = control
        self._cache = cache
        self._timeout_s = timeout_s
        self.revision: int | None = None
        self.connected = False
        self.answered_at: float | None = None
        """Monotonic time the control plane last answered a poll."""

    async def run(self) -> None:
        backoff = INITIAL_BACKOFF_S
        while True:
            try:
                await self.poll_once()
            except Exception as exc:
                # Whatever went wrong, the poller must live on: it is how revocations arrive.
                if not isinstance(exc, Unreachable):
                    log.exception("change feed poll failed")
                elif self.connected:
                    log.warning("change feed unreachable: %s", exc)
                self.connected = False
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
            else:
                backoff = INITIAL_BACKOFF_S

    async def poll_once(self) -> None:
        if self.revision is None:
            self.revision = (await self._control.health()).revision
            self.connected = True
            self.answered_at = self._monotonic()
            # Keys cached before the feed had a starting point may have missed events that come
            # before it, a revocation among them: drop them, so they are fetched fresh.
            self._cache.clear()
            return
        answer = await self._control.changes(self.revision, self._timeout_s)
        self.connected = True
        self.answered_at = self._monotonic()
        for event in answer.events:
            try:
                self._cache.apply(event)
            except Exception:
                # One event the cache cannot apply must not hold back the ones after it.
                log.exception("change event %d (%s) not applied", event.revision, event.kind)
        if answer.current_revision < self.revision:
            # The control plane's store went back in time (restored or reset): trust nothing.
            log.warning(
                "change feed went back from revision %d to %d; clearing the auth cache",
                self.revision,
                answer.current_revision,
            )
            self._cache.clear()
        self.revision = answer.current_revision

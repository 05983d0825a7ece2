"""The change-feed poller: one long-poll per proxy process, applying events to the auth cache.

One poll for every organization (the feed's revision is global), so a replica holds one
connection to the control plane however many organizations it serves. A write on the control
plane wakes the poll at once; the cache evicts or refreshes within milliseconds of it.
"""

from __future__ import annotations

import asyncio
import logging

from proxy.auth import AuthCache
from proxy.control import ControlPlaneClient, Unreachable

log = logging.getLogger("vkgate.proxy.feed")

INITIAL_BACKOFF_S = 0.5
MAX_BACKOFF_S = 10.0


class ChangeFeedPoller:
    def __init__(
        self, control: ControlPlaneClient, cache: AuthCache, *, timeout_s: float = 20.0
    ) -> None:
        self._control = control
        self._cache = cache
        self._timeout_s = timeout_s
        self.revision: int | None = None
        self.connected = False

    async def run(self) -> None:
        backoff = INITIAL_BACKOFF_S
        while True:
            try:
                await self.poll_once()
            except Unreachable as exc:
                if self.connected:
                    log.warning("change feed unreachable: %s", exc)
                self.connected = False
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
            else:
                backoff = INITIAL_BACKOFF_S

    async def poll_once(self) -> None:
        if self.revision is None:
            # Start from now: anything cached later is fetched fresh anyway.
            self.revision = (await self._control.health()).revision
            self.connected = True
            return
        answer = await self._control.changes(self.revision, self._timeout_s)
        self.connected = True
        for event in answer.events:
            self._cache.apply(event)
        if answer.current_revision < self.revision:
            # The control plane's store went back in time (restored or reset): trust nothing.
            log.warning(
                "change feed went back from revision %d to %d; clearing the auth cache",
                self.revision,
                answer.current_revision,
            )
            self._cache.clear()
        self.revision = answer.current_revision

"""At most one call per name per interval: a call asked for sooner waits for the interval's
end, and the calls asked for meanwhile become that one. None is dropped.

The auth cache paces the refetch of a budget's spend with it. Every worker of every replica
ships a segment a second, and the control plane announces each one to every worker, so
without pacing a budget shared by W workers costs W fetches a second from each of them.

Time comes from the injected `monotonic`, waits from the injected `sleep`, so a test drives
the pacer through any number of intervals without sleeping.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from vkgate.clock import Sleep

log = logging.getLogger("vkgate.proxy.pacer")

Spawn = Callable[[Coroutine[Any, Any, None]], object]

PRUNE_AT_LEAST = 1024
"""Names called within the interval are remembered; the rest are forgotten in a sweep once
this many (or twice as many as the last sweep kept) are held."""


class Pacer:
    def __init__(
        self,
        call: Callable[[str], None],
        interval_s: float,
        monotonic: Callable[[], float],
        spawn: Spawn,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if interval_s < 0:
            raise ValueError(f"a pacer's interval cannot be negative, not {interval_s}")
        self._call = call
        self._interval = interval_s
        self._monotonic = monotonic
        self._spawn = spawn
        self._sleep = sleep
        self._called: dict[str, float] = {}
        """Name → when it was last called; names called longer than an interval ago may be
        missing."""
        self._waiting: dict[str, float] = {}
        """Name → when its deferred call is due."""
        self._running = False
        self._sweep_at = PRUNE_AT_LEAST

    def __len__(self) -> int:
        """Calls waiting for their interval to end."""
        return len(self._waiting)

    def ask(self, name: str) -> None:
        """Call for `name` now, or at the end of its interval if it was called within it."""
        if name in self._waiting:
            return
        now = self._monotonic()
        last = self._called.get(name)
        if last is None or now - last >= self._interval:
            self._fire(name, now)
            return
        self._waiting[name] = last + self._interval
        if not self._running:
            self._running = True
            self._spawn(self._wait())

    def _fire(self, name: str, now: float) -> None:
        self._called[name] = now
        if len(self._called) >= self._sweep_at:
            self._called = {n: t for n, t in self._called.items() if now - t < self._interval}
            self._sweep_at = max(PRUNE_AT_LEAST, 2 * len(self._called))
        try:
            self._call(name)
        except Exception:
            # One failed call must not stop the calls waiting behind it.
            log.exception("paced call failed")

    async def _wait(self) -> None:
        try:
            while self._waiting:
                now = self._monotonic()
                due = min(self._waiting.values())
                if due > now:
                    await self._sleep(due - now)
                    continue
                for name in [n for n, at in self._waiting.items() if at <= now]:
                    del self._waiting[name]
                    self._fire(name, now)
        finally:
            self._running = False

"""Failed admin authentications per client address: logged once an episode, then throttled.

Behind an ingress or load balancer, list it in `VKGATE_TRUSTED_PROXY_CIDRS`: every client would
otherwise share its address, and one of them could keep the others out.

An episode is a minute from an address's first failure. Its first failure is logged; once the
address has failed `per_minute` times in it, every request from that address is answered 429
until the minute is over, without looking its token up. A correct token from that address is
refused too until then: telling it apart would take the lookup the throttle exists to spare, and
would let a guesser behind the same address keep guessing. No address is locked out for longer
than the minute its failures began.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cachetools import TTLCache

from vkgate.addresses import IPNetwork, TrustedProxies, client_of, throttle_key
from vkgate.clock import Clock
from vkgate.logs import event

log = logging.getLogger("vkgate.controlplane.auth")

EPISODE_SECONDS = 60.0
MAX_ADDRESSES = 10_000
"""Addresses remembered at once; past that the least recently seen are forgotten first."""


@dataclass(slots=True)
class _Episode:
    started: float
    failures: int


class AdminAuthThrottle:
    """Counts failed admin authentications by client address, on the injected clock."""

    def __init__(
        self,
        per_minute: int,
        clock: Clock,
        *,
        trusted: Sequence[IPNetwork] = (),
        max_addresses: int = MAX_ADDRESSES,
    ) -> None:
        if per_minute < 1:
            raise ValueError(f"per_minute must be at least 1, got {per_minute}")
        self.per_minute = per_minute
        self._trusted = TrustedProxies(trusted)
        self._now = clock.monotonic
        # An episode is stored once and then changed in place, so its time to live runs from
        # its first failure, not its latest.
        self._episodes: TTLCache[str, _Episode] = TTLCache(
            max_addresses, ttl=EPISODE_SECONDS, timer=clock.monotonic
        )

    def address(self, scope: Mapping[str, Any]) -> str:
        """What a request's failures count against: its client's address (named by a trusted
        proxy in front, if any), an IPv6 client's /64."""
        return throttle_key(client_of(scope, self._trusted))

    def _current(self, address: str, now: float) -> _Episode | None:
        episode = self._episodes.get(address)
        if episode is None or now - episode.started >= EPISODE_SECONDS:
            return None
        return episode

    def retry_after(self, address: str) -> int | None:
        """Whole seconds until `address` may authenticate again; None when it may now."""
        now = self._now()
        episode = self._current(address, now)
        if episode is None or episode.failures < self.per_minute:
            return None
        return max(1, math.ceil(episode.started + EPISODE_SECONDS - now))

    def failed(self, address: str, reason: str) -> None:
        """One failed authentication from `address`; `reason` says what was wrong (never the
        token itself)."""
        now = self._now()
        episode = self._current(address, now)
        if episode is None:
            episode = self._episodes[address] = _Episode(started=now, failures=0)
            event(log, "admin_auth_failed", level=logging.WARNING, address=address, reason=reason)
        episode.failures += 1
        if episode.failures == self.per_minute:
            event(
                log,
                "admin_auth_throttled",
                level=logging.WARNING,
                address=address,
                reason=f"{self.per_minute} failed authentications within a minute",
            )

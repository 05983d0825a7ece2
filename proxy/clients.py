"""Who is asking, and how often they present keys that do not exist.

`InvalidKeyThrottle` is a token bucket of invalid keys per client address (named as
vkgate/addresses.py does), and `KeyGuard` joins the two for the gateway: an address that
presented too many unknown keys is refused with 429 before its next lookup can reach the
control plane.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from cachetools import Cache, TTLCache

from proxy.asgi import Scope
from proxy.errors import ProxyError
from vkgate.addresses import IPNetwork, TrustedProxies, client_of, throttle_key
from vkgate.clock import Clock
from vkgate.errors import ErrorCode

log = logging.getLogger("vkgate.proxy.clients")

MAX_ADDRESSES = 100_000
"""Addresses the throttle remembers at most: a flood from many addresses costs bounded memory."""


# -- the throttle -------------------------------------------------------------------------------


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float
    """When `tokens` was last brought up to date (monotonic seconds)."""
    logged: bool = False
    """This throttle episode was logged; a new episode starts when the bucket is full again."""


_held = Cache.__len__


class InvalidKeyThrottle:
    """Invalid keys per client address: a token bucket of `per_minute`, refilled continuously.

    A full bucket lets `per_minute` invalid keys through at once, then one every
    `60 / per_minute` seconds. An address whose bucket holds less than one token is throttled
    until it holds one again. Memory is bounded: at most `max_addresses` buckets, and a bucket
    left alone until it is full again is dropped (a full bucket and none are the same).
    """

    def __init__(
        self, per_minute: int, clock: Clock, *, max_addresses: int = MAX_ADDRESSES
    ) -> None:
        if per_minute < 1:
            raise ValueError(f"per_minute must be at least 1, got {per_minute}")
        self.capacity = float(per_minute)
        self._rate = per_minute / 60.0
        self._now = clock.monotonic
        self._max_addresses = max_addresses
        self._buckets: TTLCache[str, _Bucket] = TTLCache(
            max_addresses, ttl=self.capacity / self._rate, timer=clock.monotonic
        )
        self._blocked: dict[str, float] = {}
        """Throttled addresses, each with when it may present a key again (monotonic)."""

    @property
    def watching(self) -> bool:
        """Whether any address presented an invalid key lately (its bucket is not full yet)."""
        buckets = self._buckets
        # `Cache.__len__`: the buckets held, due or not. (A TTL cache's own `len` expires them
        # first, four calls more on every request while there are none.)
        if _held(buckets):
            buckets.expire()
            if _held(buckets):
                return True
        if self._blocked:
            # A block ends before its bucket is forgotten (a refill at most, against a full
            # one): with no bucket left, every block is over.
            self._blocked.clear()
        return False

    def retry_after(self, address: str) -> float | None:
        """Seconds until `address` may present a key again; None when it may now."""
        if not self._blocked:
            return None
        until = self._blocked.get(address)
        if until is None:
            return None
        wait = until - self._now()
        if wait <= 0:
            del self._blocked[address]
            return None
        return wait

    def take(self, address: str) -> bool:
        """Before a key from `address` is looked up: when the address presented invalid keys
        lately, take one of its tokens now, so however many of its requests miss the cache at
        once, no more lookups run than it has tokens. True when one was taken (`give_back` it
        if the key was valid; `failed(…, taken=True)` if not). False when the address has no
        recent invalid key (nothing to take: its whole allowance is there), or no token left:
        then it is throttled, and `retry_after` says for how long."""
        now = self._now()
        bucket = self._buckets.get(address)
        if bucket is None:
            return False
        self._refill(bucket, now)
        if bucket.tokens < 1.0:
            self._throttle(address, bucket, now)
            return False
        bucket.tokens -= 1.0
        # Kept until the lookup's outcome is known (a bucket left alone until full is dropped).
        self._buckets[address] = bucket
        return True

    def give_back(self, address: str) -> None:
        """The key a token was taken for was valid: the token is the address's again."""
        bucket = self._buckets.get(address)
        if bucket is not None:
            bucket.tokens = min(self.capacity, bucket.tokens + 1.0)

    def failed(self, address: str, *, taken: bool = False) -> float | None:
        """Record one invalid key from `address` (`taken`: its token was taken before the
        lookup); seconds it must wait when now throttled."""
        now = self._now()
        bucket = self._buckets.get(address)
        if bucket is None:
            # A bucket dropped meanwhile (memory bound) took no token that still counts.
            bucket, taken = _Bucket(self.capacity, now), False
        else:
            self._refill(bucket, now)
        if not taken:
            # Not below empty: an address that keeps failing while throttled waits one refill
            # from its latest failure, and still gets the refill rate's trickle through.
            bucket.tokens = max(bucket.tokens - 1.0, 0.0)
        self._buckets[address] = bucket  # setting it again restarts its TTL
        if bucket.tokens >= 1.0:
            return None
        return self._throttle(address, bucket, now)

    def _refill(self, bucket: _Bucket, now: float) -> None:
        bucket.tokens = min(self.capacity, bucket.tokens + (now - bucket.at) * self._rate)
        bucket.at = now
        if bucket.tokens >= self.capacity:
            bucket.logged = False

    def _throttle(self, address: str, bucket: _Bucket, now: float) -> float:
        wait = (1.0 - bucket.tokens) / self._rate
        self._block(address, now + wait, now)
        if not bucket.logged:
            bucket.logged = True
            # An address is no secret; the key (or its hash) is never logged.
            log.warning("invalid_key_throttled address=%s", address)
        return wait

    def _block(self, address: str, until: float, now: float) -> None:
        blocked = self._blocked
        if address not in blocked and len(blocked) >= self._max_addresses:
            for stale in [a for a, t in blocked.items() if t <= now]:
                del blocked[stale]
            if len(blocked) >= self._max_addresses:
                del blocked[next(iter(blocked))]  # the one blocked first
        blocked[address] = until


# -- the gateway's guard ------------------------------------------------------------------------


def throttled(wait_s: float) -> ProxyError:
    seconds = max(1, math.ceil(wait_s))
    return ProxyError(
        ErrorCode.RATE_LIMITED,
        f"too many invalid API keys from this address; retry after {seconds} s",
        headers=((b"retry-after", str(seconds).encode()),),
        reason="invalid_keys",
    )


class KeyGuard:
    """The throttle at the gateway: a request's client is named only when it matters.

    A request pays for naming its client (and, with trusted proxies, reading its headers) only
    when authentication refused its key, or while some address is throttled.
    """

    def __init__(self, throttle: InvalidKeyThrottle, trusted: Sequence[IPNetwork] = ()) -> None:
        self._throttle = throttle
        self._trusted = TrustedProxies(trusted)

    def address(self, scope: Scope) -> str:
        """The throttle's name for the request's client (an IPv6 client's /64)."""
        return throttle_key(client_of(scope, self._trusted))

    def admission(self, scope: Scope) -> Admission | None:
        """What runs just before this request's key is looked up on the control plane
        (`AuthCache.authenticate(key, admit)`); None while no address presented an invalid
        key lately, so a request names its client only when that may matter."""
        if not self._throttle.watching:
            return None
        return Admission(self, scope)

    def failed(self, scope: Scope, admission: Admission | None = None) -> float | None:
        """Count an `invalid_api_key` refusal against the request's client; seconds it must
        wait when that throttles it (this request has its answer already: the 401)."""
        if admission is not None and admission.address:
            return self._throttle.failed(admission.address, taken=admission.taken)
        return self._throttle.failed(self.address(scope))

    def before_lookup(self, admission: Admission) -> None:
        """Refuse a throttled client, or take one of its tokens for the lookup (see
        `InvalidKeyThrottle.take`)."""
        throttle = self._throttle
        address = admission.address = self.address(admission.scope)
        wait = throttle.retry_after(address)
        if wait is None:
            admission.taken = throttle.take(address)
            if not admission.taken:
                wait = throttle.retry_after(address)
        if wait is not None:
            raise throttled(wait)

    def release(self, admission: Admission | None) -> None:
        """The lookup did not find the key invalid (it was valid, or the control plane could
        not say): a token it took is given back."""
        if admission is not None and admission.taken:
            admission.taken = False
            self._throttle.give_back(admission.address)


class Admission:
    """One request's pass to the control plane: refused while its client is throttled, and
    holding one of the client's tokens while the lookup runs (`KeyGuard.before_lookup`)."""

    __slots__ = ("_guard", "address", "scope", "taken")

    def __init__(self, guard: KeyGuard, scope: Scope) -> None:
        self._guard = guard
        self.scope = scope
        self.address = ""
        self.taken = False

    def __call__(self) -> None:
        self._guard.before_lookup(self)

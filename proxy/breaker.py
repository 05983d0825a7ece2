"""Per-credential circuit breakers: stop paying for calls to a provider credential that is down.

A breaker opens after `threshold` failures (5xx, timeouts, network errors) within `window_s`;
while open its credential is skipped without a call. After `cooldown_s` one request goes
through as a probe (half-open): its success closes the breaker, its failure opens it again for
another cooldown. A 429 is not a failure (the credential works, it is busy), but the provider's
`Retry-After` is honoured: the credential is skipped until then.
"""

from __future__ import annotations

from collections import deque
from datetime import UTC
from email.utils import parsedate_to_datetime
from enum import StrEnum

from vkgate.clock import Clock

MAX_RETRY_AFTER_S = 3600.0
"""A provider asking for longer than this is waited for only this long."""


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """One credential's breaker. Not thread-safe: the event loop owns it."""

    __slots__ = (
        "_clock",
        "_cooldown_s",
        "_failures",
        "_now",
        "_opened_at",
        "_probing",
        "_threshold",
        "_window_s",
        "rate_limited_until",
    )

    def __init__(self, threshold: int, window_s: float, cooldown_s: float, clock: Clock) -> None:
        self._threshold = threshold
        self._window_s = window_s
        self._cooldown_s = cooldown_s
        self._clock = clock
        # Monotonic: a wall-clock jump must neither open nor close a breaker.
        self._now = clock.monotonic
        self._failures: deque[float] = deque()
        self._opened_at: float | None = None
        self._probing = False
        self.rate_limited_until = 0.0

    @property
    def state(self) -> BreakerState:
        if self._opened_at is None:
            return BreakerState.CLOSED
        if self._probing or self._now() - self._opened_at >= self._cooldown_s:
            return BreakerState.HALF_OPEN
        return BreakerState.OPEN

    def admit(self) -> bool:
        """Whether a call may go to this credential now; a half-open breaker admits one probe."""
        if self._opened_at is None:
            return True
        if self._probing or self._now() - self._opened_at < self._cooldown_s:
            return False
        self._probing = True
        return True

    def retry_after_s(self) -> float:
        """Seconds until this credential may be called again (0 when it may be now)."""
        now = self._now()
        wait = max(self.rate_limited_until - now, 0.0)
        if self._opened_at is not None and not self._probing:
            wait = max(wait, self._opened_at + self._cooldown_s - now)
        return wait

    def succeeded(self) -> None:
        self._failures.clear()
        self._opened_at = None
        self._probing = False

    def failed(self) -> bool:
        """Count a failure; True when it opened the breaker."""
        now = self._now()
        if self._opened_at is not None:
            # A failed probe: open again for a whole cooldown.
            self._opened_at = now
            self._probing = False
            return False
        failures = self._failures
        failures.append(now)
        while failures and now - failures[0] > self._window_s:
            failures.popleft()
        if len(failures) >= self._threshold:
            failures.clear()
            self._opened_at = now
            return True
        return False

    def released(self) -> None:
        """The call ended without a verdict (the client left): let another probe through."""
        self._probing = False

    def rate_limited(self, retry_after: bytes | None) -> None:
        """A 429: skip this credential for as long as the provider asked, if it said."""
        seconds = parse_retry_after(retry_after, self._clock)
        if seconds:
            self.rate_limited_until = max(self.rate_limited_until, self._now() + seconds)

    def resting(self) -> bool:
        """Whether a 429's `Retry-After` still holds this credential back."""
        return self.rate_limited_until > self._now()


def parse_retry_after(value: bytes | None, clock: Clock) -> float:
    """`Retry-After` as seconds from now: delta-seconds or an HTTP date; 0 when absent or bad."""
    if not value:
        return 0.0
    text = value.decode("latin-1").strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            moment = parsedate_to_datetime(text)
            if moment.tzinfo is None:  # "-0000": UTC by RFC 5322, not local time
                moment = moment.replace(tzinfo=UTC)
            # An HTTP date is wall time; it becomes a delay, counted on the monotonic clock.
            seconds = moment.timestamp() - clock.time()
        except (TypeError, ValueError, OverflowError):
            return 0.0
    if seconds != seconds or seconds <= 0:  # NaN or past
        return 0.0
    return min(seconds, MAX_RETRY_AFTER_S)


class Breakers:
    """Every credential's breaker in this process, by provider id, made on first use."""

    def __init__(self, threshold: int, window_s: float, cooldown_s: float, clock: Clock) -> None:
        self._threshold = threshold
        self._window_s = window_s
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._by_provider: dict[str, CircuitBreaker] = {}

    def __getitem__(self, provider_id: str) -> CircuitBreaker:
        breaker = self._by_provider.get(provider_id)
        if breaker is None:
            breaker = CircuitBreaker(self._threshold, self._window_s, self._cooldown_s, self._clock)
            self._by_provider[provider_id] = breaker
        return breaker

    def states(self) -> dict[str, BreakerState]:
        return {provider: breaker.state for provider, breaker in self._by_provider.items()}

"""Time as an injected dependency, so expiry, grace periods and signature skew are testable."""

from __future__ import annotations

import time as _time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Protocol

Sleep = Callable[[float], Awaitable[None]]
"""A wait of so many seconds (`asyncio.sleep` in production), injected beside the clock so a
test passes the time at once."""


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""
        ...

    def time(self) -> float:
        """The current time as unix seconds: `now().timestamp()`, without making a datetime."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin that never goes backwards."""
        ...


class SystemClock:
    # The C functions themselves, not methods that call them: a request reads the clock a
    # dozen times, and a Python frame per reading costs more than the reading.
    time = staticmethod(_time.time)
    monotonic = staticmethod(_time.monotonic)

    def now(self) -> datetime:
        return datetime.now(UTC)


def unix_seconds(text: str | None) -> float | None:
    """An RFC 3339 time from the wire as unix seconds; None for none."""
    return datetime.fromisoformat(text).timestamp() if text else None


def rfc3339(moment: datetime) -> str:
    """RFC 3339 UTC with a `Z`, the only time format on vkgate's wire."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")

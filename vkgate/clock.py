"""Time as an injected dependency, so expiry, grace periods and signature skew are testable."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin that never goes backwards."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()


def unix_seconds(text: str | None) -> float | None:
    """An RFC 3339 time from the wire as unix seconds; None for none."""
    return datetime.fromisoformat(text).timestamp() if text else None


def rfc3339(moment: datetime) -> str:
    """RFC 3339 UTC with a `Z`, the only time format on vkgate's wire."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")

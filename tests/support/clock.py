"""A clock whose wall time the test sets; monotonic time stays real so waits still end,
but a test can move it on too (`elapse`), or stop it following real time (`freeze`)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta


class ManualClock:
    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
        self._ahead = 0.0
        self._frozen_at: float | None = None

    def now(self) -> datetime:
        return self._now

    def time(self) -> float:
        return self._now.timestamp()

    def monotonic(self) -> float:
        base = time.monotonic() if self._frozen_at is None else self._frozen_at
        return base + self._ahead

    def freeze(self) -> None:
        """From now on monotonic time moves only by `elapse`: for a test whose expectation
        would change with how fast the machine runs it (a refill during a slow flood)."""
        if self._frozen_at is None:
            self._frozen_at = time.monotonic()

    def elapse(self, seconds: float) -> None:
        """Time passes: the wall clock and the monotonic clock both move on."""
        self._now += timedelta(seconds=seconds)
        self._ahead += seconds

    def advance(self, seconds: float) -> None:
        self._now += timedelta(seconds=seconds)

    def set(self, moment: datetime) -> None:
        self._now = moment

"""Budget windows: calendar periods in UTC, the same on both sides of the internal API."""

from __future__ import annotations

from datetime import datetime, timedelta

WINDOWS = ("day", "week", "month", "total")


def window_bounds(window: str, now: datetime) -> tuple[datetime | None, datetime | None]:
    """The current calendar window (UTC) of a budget: a day, a week from Monday, a month;
    `total` has none."""
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if window == "day":
        return day, day + timedelta(days=1)
    if window == "week":
        start = day - timedelta(days=day.weekday())
        return start, start + timedelta(days=7)
    if window == "month":
        start = day.replace(day=1)
        following = (start + timedelta(days=32)).replace(day=1)
        return start, following
    return None, None

"""Template filters: money exactly as the ledger holds it, times in UTC, counts grouped."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def usd(value: Any) -> str:
    """A decimal string of USD as given (never through a float): `$0.000123`."""
    text = str(value)
    return f"-${text[1:]}" if text.startswith("-") else f"${text}"


def utc(value: Any) -> str:
    """An RFC 3339 time or a datetime, to the second, in UTC, saying so."""
    if value is None or value == "":
        return ""
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def count(value: Any) -> str:
    return f"{int(value or 0):,}"


FILTERS = {"usd": usd, "utc": utc, "count": count}

"""Finance reads of the ledger: the grouped report, raw rows by page, and their CSV form.

Money leaves as exact decimal strings of USD; report totals are the sums of the rows' integer
nano-USD, so they equal the sum of the ledger's rows to the nano-dollar.
"""

from __future__ import annotations

import base64
import binascii
import csv
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from controlplane.errors import invalid
from controlplane.ledger import queries
from controlplane.ledger.queries import GROUPS, MEASURES
from controlplane.ledger.rows import LEDGER_COLUMNS
from controlplane.ledger.store import Ledger
from controlplane.schemas import page_size
from vkgate.clock import rfc3339
from vkgate.money import nanos_to_usd

FORMATS = ("json", "csv")
_MONEY = {"cost_nano_usd": "cost_usd", "saved_nano_usd": "saved_usd"}
"""Nano-USD columns and the decimal USD fields they are given as."""
MONEY_FIELDS: frozenset[str] = frozenset(_MONEY.values())
"""The measures given as decimal USD strings."""
MEASURE_FIELDS: tuple[str, ...] = tuple(_MONEY.get(m, m) for m, _ in MEASURES)
LEDGER_FIELDS: tuple[str, ...] = tuple(_MONEY.get(c, c) for c in LEDGER_COLUMNS)


@dataclass(frozen=True, slots=True)
class Report:
    rows: list[dict[str, Any]]
    totals: dict[str, Any]
    fields: list[str]
    """The CSV columns: the group fields, then the measures."""


def parse_format(text: str | None) -> str:
    chosen = (text or "json").lower()
    if chosen not in FORMATS:
        raise invalid(f"format must be json or csv, got {text!r}", param="format")
    return chosen


def parse_group_by(text: str | None) -> list[str]:
    """`team,model` into its names, checked, in the order given."""
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    for name in names:
        if name not in GROUPS:
            raise invalid(
                f"group_by: unknown field {name!r}; choose from {', '.join(GROUPS)}",
                param="group_by",
            )
    if len(set(names)) != len(names):
        raise invalid("group_by names a field twice", param="group_by")
    return names


def parse_time(text: str | None, param: str) -> datetime | None:
    """RFC 3339 with a zone, or a date (its midnight, UTC)."""
    if text is None or text == "":
        return None
    # A `+` left unescaped in a query string arrives as a space.
    text = text.strip().replace(" ", "+")
    try:
        if len(text) == 10:
            return datetime.combine(date.fromisoformat(text), datetime.min.time(), UTC)
        moment = datetime.fromisoformat(text)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise invalid(
            f"{param} must be a date (2026-03-01) or RFC 3339 with a zone "
            f"(2026-03-01T00:00:00Z), got {text!r}",
            param=param,
        )
    return moment.astimezone(UTC)


def parse_period(organization_id: str, start: str | None, end: str | None) -> queries.Period:
    """`from` inclusive, `to` exclusive; either may be left open."""
    begins, ends = parse_time(start, "from"), parse_time(end, "to")
    if begins is not None and ends is not None and begins >= ends:
        raise invalid("from must be before to (from is inclusive, to exclusive)", param="from")
    return queries.Period(organization_id, begins, ends)


async def report(ledger: Ledger, period: queries.Period, group_by: Sequence[str]) -> Report:
    grouped = await ledger.report(period, group_by)
    group_fields = [GROUPS[g][0] for g in group_by]
    rows = [_report_row(r, group_fields) for r in grouped]
    totals: dict[str, Any] = {}
    for measure, _ in MEASURES:
        total = sum(r[measure] for r in grouped)
        if measure in _MONEY:
            totals[_MONEY[measure]] = nanos_to_usd(total)
        else:
            totals[measure] = total
    totals["audio_seconds"] = seconds_text(totals["audio_seconds"])
    return Report(rows, totals, [*group_fields, *MEASURE_FIELDS])


def seconds_text(value: Any) -> str:
    """Seconds of audio as an exact decimal string, to the millisecond: `"8.470"`."""
    return str(Decimal(value or 0).quantize(_MILLI))


_MILLI = Decimal("0.001")


def _report_row(row: dict[str, Any], group_fields: Sequence[str]) -> dict[str, Any]:
    out = {f: row[f] for f in group_fields}
    for name, _ in MEASURES:
        if name in _MONEY:
            out[_MONEY[name]] = nanos_to_usd(int(row[name]))
        elif name == "audio_seconds":
            out[name] = seconds_text(row[name])
        else:
            out[name] = int(row[name])
    return out


async def ledger_page(
    ledger: Ledger, period: queries.Period, *, cursor: str | None, limit: int | None
) -> tuple[list[dict[str, Any]], str | None]:
    """Raw rows in (at, id) order after `cursor`, and the cursor of the next page if any."""
    size = page_size(limit)
    found = await ledger.rows(period, decode_cursor(cursor) if cursor else None, size + 1)
    more = len(found) > size
    found = found[:size]
    rows = [_ledger_row(r) for r in found]
    next_cursor = encode_cursor(found[-1]["at"], found[-1]["id"]) if more else None
    return rows, next_cursor


def _ledger_row(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for column in LEDGER_COLUMNS:
        value = row[column]
        if column in _MONEY:
            out[_MONEY[column]] = nanos_to_usd(int(value))
        elif column == "audio_seconds":
            out[column] = seconds_text(value)
        elif isinstance(value, datetime):
            out[column] = rfc3339(value)
        else:
            out[column] = value
    return out


def encode_cursor(at: datetime, ident: str) -> str:
    """Opaque to callers: the (time, id) of the last row given, which orders the ledger."""
    return base64.urlsafe_b64encode(f"{_micros(at)}:{ident}".encode()).decode().rstrip("=")


def _micros(at: datetime) -> int:
    delta = at - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        micros, _, ident = text.partition(":")
        at = datetime.fromtimestamp(int(micros) // 1_000_000, UTC).replace(
            microsecond=int(micros) % 1_000_000
        )
    except (ValueError, UnicodeDecodeError, binascii.Error, OverflowError, OSError):
        raise invalid("cursor must be a cursor this route returned", param="cursor") from None
    if not ident:
        raise invalid("cursor must be a cursor this route returned", param="cursor")
    return at, ident


def to_csv(fields: Sequence[str], rows: Iterable[dict[str, Any]]) -> bytes:
    """RFC 4180 CSV with a header; an absent value is an empty cell, booleans are true/false."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(fields)
    for row in rows:
        writer.writerow([_cell(row.get(f)) for f in fields])
    return out.getvalue().encode()


_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        # Client-chosen text (an end-user id) must not run as a spreadsheet formula.
        return "'" + value
    return str(value)

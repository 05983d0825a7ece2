"""Decoding and checking a spool segment before anything of it is written.

A segment is taken whole or refused whole: the first problem found is a 400 (not JSON) or a
422 naming the record and field (`records[3].at`), and nothing of the segment is written.
"""

from __future__ import annotations

import functools
import math
import re
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NoReturn

import msgspec

from controlplane.errors import ApiError, invalid
from controlplane.ledger.rows import TOKEN_COLUMNS, UNIT_COLUMNS, Entry
from vkgate.errors import ErrorCode
from vkgate.spend import SEGMENT_ENCODING, RecordKind, SpendRecord, SpendSegment, UsageSource

MAX_TOKENS = 2**53
MAX_SECONDS = 10**12
"""More seconds than any audio (the ledger's column holds 15 digits before the point)."""
MAX_NANO_USD = 2**62
"""Of a record's `saved_nano_usd`: an Int64 column, with room to sum."""
MAX_ID_LENGTH = 200
_KINDS = frozenset(RecordKind)
_SOURCES = frozenset(UsageSource)
_ADMIT = RecordKind.ADMIT.value
_AT = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$")
_AS_PROXIES_WRITE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z").fullmatch
"""UTC with microseconds, as every record of a proxy is timed: read without the general case's
work (a third of its cost, for each of a segment's thousands of records)."""
_PATH = re.compile(r"at `\$\.?(.*)`$")
_GZIP_ONLY = 16 + zlib.MAX_WBITS


@dataclass(frozen=True, slots=True)
class CheckedSegment:
    segment_id: str
    outcomes: list[Entry]
    """Confirm and fail records: one ledger row each."""
    admits: list[Entry]
    repeated: int
    """Records that appeared twice, identical, in this segment: written once."""


def inflate(body: bytes, encoding: str | None, max_bytes: int) -> bytes:
    """The segment's JSON from a body in `encoding` (its `Content-Encoding`): none or gzip.

    At most `max_bytes` are inflated (413 past that: a small body must not expand into
    gigabytes); a body that is not whole gzip is a 400.
    """
    coding = (encoding or "").strip().lower()
    if coding in ("", "identity"):
        return body
    if coding != SEGMENT_ENCODING:
        raise ApiError(
            ErrorCode.INVALID_REQUEST,
            f"spend segment in Content-Encoding {coding!r}: only {SEGMENT_ENCODING} or none is "
            "taken",
        )
    inflater = zlib.decompressobj(wbits=_GZIP_ONLY)
    try:
        data = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise ApiError(
            ErrorCode.INVALID_REQUEST, f"spend segment is not valid gzip: {exc}"
        ) from None
    if len(data) > max_bytes:
        raise ApiError(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"spend segment inflates past what the control plane takes ({max_bytes} bytes)",
        )
    if not inflater.eof or inflater.unused_data:
        raise ApiError(
            ErrorCode.INVALID_REQUEST,
            "spend segment's gzip body is truncated or has trailing bytes",
        )
    return data


def decode(body: bytes) -> SpendSegment:
    try:
        return msgspec.json.decode(body, type=SpendSegment)
    except msgspec.ValidationError as exc:
        match = _PATH.search(str(exc))
        param = match.group(1) if match else None
        raise invalid(f"malformed spend segment: {exc}", param=param) from None
    except msgspec.DecodeError as exc:
        raise ApiError(ErrorCode.INVALID_REQUEST, f"spend segment is not JSON: {exc}") from None


def check(segment: SpendSegment) -> CheckedSegment:
    if not segment.segment_id or len(segment.segment_id) > MAX_ID_LENGTH:
        raise invalid("segment_id must be 1-200 characters", param="segment_id")
    if not segment.replica_id or len(segment.replica_id) > MAX_ID_LENGTH:
        raise invalid("replica_id must be 1-200 characters", param="replica_id")
    outcomes: list[Entry] = []
    admits: list[Entry] = []
    seen: dict[str, SpendRecord] = {}
    repeated = 0
    for index, record in enumerate(segment.records):
        earlier = seen.get(record.id)
        if earlier is not None:
            if earlier != record:
                raise invalid(
                    f"record id {record.id!r} appears twice in the segment with different contents",
                    param=f"records[{index}].id",
                )
            repeated += 1
            continue
        if not _plausible(record, segment.replica_id):
            _refuse_record(segment, index, record)
        entry = Entry(record, _time(index, record.at), segment.segment_id)
        seen[record.id] = record
        (admits if record.kind == _ADMIT else outcomes).append(entry)
    return CheckedSegment(segment.segment_id, outcomes, admits, repeated)


def _plausible(record: SpendRecord, replica_id: str) -> bool:
    """Every field of the record but its time is as `_refuse_record` wants it.

    One expression, asked of every record: the first failed condition ends it, and only then is
    the record asked field by field which it was, for the message (the checks one by one cost
    twice as much as this, closures and all, for each of a segment's thousands of records)."""
    return (
        0 < len(record.id) <= MAX_ID_LENGTH
        and record.kind in _KINDS
        and record.replica_id == replica_id
        and record.seq >= 1
        and bool(record.request_id)
        and bool(record.route)
        and record.usage_source in _SOURCES
        and 0 <= record.status <= 999
        and record.attempts >= 0
        and 0 <= record.input_tokens < MAX_TOKENS
        and 0 <= record.output_tokens < MAX_TOKENS
        and 0 <= record.cache_read_tokens < MAX_TOKENS
        and 0 <= record.cache_write_tokens < MAX_TOKENS
        and 0 <= record.reasoning_tokens < MAX_TOKENS
        and record.cache_read_tokens + record.cache_write_tokens <= record.input_tokens
        and 0 <= record.latency_ms < math.inf
        and (record.ttfb_ms is None or 0 <= record.ttfb_ms < math.inf)
        and 0 <= record.saved_nano_usd < MAX_NANO_USD
        and _units_plausible(record)
    )


def _units_plausible(record: SpendRecord) -> bool:
    """The units of audio and image calls (all 0 on every other record: checked at once)."""
    return (
        not (
            record.input_audio_tokens
            or record.output_audio_tokens
            or record.input_image_tokens
            or record.output_image_tokens
            or record.input_characters
            or record.images
            or record.audio_seconds
        )
        or _units_problem(record) is None
    )


def _units_problem(record: SpendRecord) -> tuple[str, str] | None:
    """The first unit field of `record` that cannot be, and why."""
    for column in UNIT_COLUMNS:
        if not 0 <= getattr(record, column) < MAX_TOKENS:
            return column, "must be a count of 0 or more"
    if record.input_audio_tokens + record.input_image_tokens > record.input_tokens:
        return "input_audio_tokens", "audio and image input tokens are parts of input_tokens"
    if record.output_audio_tokens + record.output_image_tokens > record.output_tokens:
        return "output_audio_tokens", "audio and image output tokens are parts of output_tokens"
    if not (math.isfinite(record.audio_seconds) and 0 <= record.audio_seconds < MAX_SECONDS):
        return "audio_seconds", "must be a finite number of seconds, 0 or more"
    return None


def _refuse_record(segment: SpendSegment, index: int, record: SpendRecord) -> NoReturn:
    """The 422 naming the first field of the record that `_plausible` refused."""
    refuse = functools.partial(_refused, index)
    if not record.id or len(record.id) > MAX_ID_LENGTH:
        raise refuse("id", "must be 1-200 characters")
    if record.kind not in _KINDS:
        raise refuse("kind", f"must be admit, confirm or fail, got {record.kind!r}")
    if record.replica_id != segment.replica_id:
        raise refuse("replica_id", "must be the segment's replica_id")
    if record.seq < 1:
        raise refuse("seq", "must be 1 or more")
    if not record.request_id:
        raise refuse("request_id", "must not be empty")
    if not record.route:
        raise refuse("route", "must not be empty")
    if record.usage_source not in _SOURCES:
        raise refuse(
            "usage_source", f"must be provider, estimated or none, got {record.usage_source!r}"
        )
    if not 0 <= record.status <= 999:
        raise refuse("status", "must be an HTTP status, or 0")
    if record.attempts < 0:
        raise refuse("attempts", "must be 0 or more")
    for column in TOKEN_COLUMNS:
        if not 0 <= getattr(record, column) < MAX_TOKENS:
            raise refuse(column, "must be a count of 0 or more")
    if record.cache_read_tokens + record.cache_write_tokens > record.input_tokens:
        raise refuse(
            "cache_read_tokens",
            "input_tokens counts cache reads and writes, so it cannot be smaller than their sum",
        )
    if not (math.isfinite(record.latency_ms) and record.latency_ms >= 0):
        raise refuse("latency_ms", "must be a finite number of 0 or more")
    if record.ttfb_ms is not None and not (math.isfinite(record.ttfb_ms) and record.ttfb_ms >= 0):
        raise refuse("ttfb_ms", "must be a finite number of 0 or more")
    if not 0 <= record.saved_nano_usd < MAX_NANO_USD:
        raise refuse("saved_nano_usd", "must be an amount of 0 or more")
    problem = _units_problem(record)
    if problem is not None:
        raise refuse(*problem)
    raise AssertionError(f"records[{index}] was refused, but no field of it is wrong")


def _time(index: int, text: str) -> datetime:
    """The record's time: refused, naming `records[index].at`, unless RFC 3339 with a zone."""
    if _AS_PROXIES_WRITE(text):
        try:
            return datetime.fromisoformat(text)  # `Z`: in UTC already
        except ValueError:
            raise _refused(index, "at", "is not a valid date and time") from None
    if not _AT.match(text):
        raise _refused(
            index, "at", "must be RFC 3339 with a time zone, like 2026-03-10T12:00:00.123456Z"
        )
    # Python keeps microseconds: finer digits are cut, as ClickHouse's DateTime64(6) would.
    head, dot, tail = text.partition(".")
    if dot:
        digits = re.match(r"\d+", tail)
        assert digits is not None
        text = f"{head}.{digits.group()[:6].ljust(6, '0')}{tail[digits.end() :]}"
    try:
        return datetime.fromisoformat(text).astimezone(UTC)
    except (ValueError, OverflowError):  # OverflowError: out of range once moved to UTC
        raise _refused(index, "at", "is not a valid date and time") from None


def _refused(index: int, field: str, message: str) -> ApiError:
    """The 422 for one field of the segment's record `index`, named as the body holds it."""
    return invalid(f"records[{index}].{field}: {message}", param=f"records[{index}].{field}")

"""A spend segment's records are checked field by field before any is priced or written: every
way a record can be wrong refuses the segment with an error naming the record and its field
(the proxy sets such a segment aside, with that error, for its operator to look at)."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest

from controlplane.errors import ApiError
from controlplane.ledger.rows import TOKEN_COLUMNS
from controlplane.spend.segments import MAX_ID_LENGTH, MAX_TOKENS, check
from vkgate.spend import SpendRecord, SpendSegment

REPLICA = "replica-a"


def good(**changes: Any) -> SpendRecord:
    record = SpendRecord(
        id="0f" * 16,
        kind="confirm",
        replica_id=REPLICA,
        seq=7,
        request_id="req-1",
        at="2026-12-04T19:40:01.123456Z",
        route="/v1/chat/completions",
        organization_id="org_1",
        status=200,
        attempts=1,
        input_tokens=30,
        output_tokens=9,
        cache_read_tokens=10,
        cache_write_tokens=5,
        reasoning_tokens=2,
        usage_source="provider",
        latency_ms=1.25,
        ttfb_ms=0.5,
    )
    return msgspec.structs.replace(record, **changes)


def segment(*records: SpendRecord) -> SpendSegment:
    return SpendSegment(replica_id=REPLICA, segment_id="seg-1", records=list(records))


BAD: list[tuple[str, dict[str, Any]]] = [
    ("id", {"id": ""}),
    ("id", {"id": "x" * (MAX_ID_LENGTH + 1)}),
    ("kind", {"kind": "refund"}),
    ("replica_id", {"replica_id": "replica-b"}),
    ("seq", {"seq": 0}),
    ("request_id", {"request_id": ""}),
    ("route", {"route": ""}),
    ("usage_source", {"usage_source": "guessed"}),
    ("status", {"status": -1}),
    ("status", {"status": 1000}),
    ("attempts", {"attempts": -1}),
    *((column, {column: -1}) for column in TOKEN_COLUMNS),
    *((column, {column: MAX_TOKENS}) for column in TOKEN_COLUMNS),
    ("cache_read_tokens", {"input_tokens": 14}),
    ("latency_ms", {"latency_ms": -0.5}),
    ("latency_ms", {"latency_ms": math.inf}),
    ("latency_ms", {"latency_ms": math.nan}),
    ("ttfb_ms", {"ttfb_ms": -0.5}),
    ("ttfb_ms", {"ttfb_ms": math.inf}),
    ("ttfb_ms", {"ttfb_ms": math.nan}),
]


@pytest.mark.parametrize(("field", "changes"), BAD, ids=[f"{f}={c}" for f, c in BAD])
def test_every_wrong_field_is_refused_by_name(field: str, changes: dict[str, Any]) -> None:
    with pytest.raises(ApiError) as refused:
        check(segment(good(id="1f" * 16), good(**changes)))
    assert refused.value.param == f"records[1].{field}"
    assert refused.value.message.startswith(f"records[1].{field}: ")


@pytest.mark.parametrize(
    "changes",
    [{}, {"ttfb_ms": None}, {"kind": "admit", "status": 0, "usage_source": "none"}, {"seq": 1}],
    ids=["confirm", "no-ttfb", "admit", "first-seq"],
)
def test_a_good_record_passes(changes: dict[str, Any]) -> None:
    checked = check(segment(good(**changes)))
    assert len(checked.admits) + len(checked.outcomes) == 1


@pytest.mark.parametrize("at", ["2026-12-04 19:40:01", "2026-13-04T19:40:01.123456Z", ""])
def test_a_bad_time_is_refused_by_name(at: str) -> None:
    with pytest.raises(ApiError) as refused:
        check(segment(good(at=at)))
    assert refused.value.param == "records[0].at"

"""Helpers shared by the spool, recovery and drainer tests: records, a stepped clock, a ledger."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec

from proxy.spend import _lines
from proxy.spend.spool import SpendSpool
from vkgate.spend import SpendAck, SpendRecord, SpendSegment

START = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


class SteppedClock:
    """Wall and monotonic time that move only when the test (or a fake sleep) says so."""

    def __init__(self) -> None:
        self._now = START
        self._monotonic = 1000.0

    def now(self) -> datetime:
        return self._now

    def time(self) -> float:
        return self._now.timestamp()

    def monotonic(self) -> float:
        return self._monotonic

    def elapse(self, seconds: float) -> None:
        self._now += timedelta(seconds=seconds)
        self._monotonic += seconds


def record(request_id: str = "req", kind: str = "admit", **fields: object) -> SpendRecord:
    """A record as the gateway hands it to `append`: the spool fills id, replica, seq and at."""
    return SpendRecord(
        id="",
        kind=kind,
        replica_id="",
        seq=0,
        request_id=request_id,
        at="",
        route="/v1/chat/completions",
        **fields,  # type: ignore[arg-type]
    )


def line(rec: SpendRecord) -> bytes:
    """One spool line, as `append` writes it."""
    json = msgspec.json.encode(rec)
    return json + _lines.checksum_suffix(json)


def stamped(replica_id: str, seq: int, request_id: str | None = None) -> SpendRecord:
    """A record as a previous process would have stamped it."""
    return SpendRecord(
        id=f"{seq:032x}",
        kind="confirm",
        replica_id=replica_id,
        seq=seq,
        request_id=request_id or f"req-{seq}",
        at="2026-03-10T11:00:00.000000Z",
        route="/v1/chat/completions",
        input_tokens=seq,
    )


def replica_dir(root: Path, replica_id: str) -> Path:
    """A replica directory as a previous process would have left it."""
    root.mkdir(parents=True, exist_ok=True)
    (root / ".replica-id").write_text(replica_id + "\n")
    path = root / replica_id
    path.mkdir(exist_ok=True)
    return path


def segment_records(spool: SpendSpool) -> Iterator[tuple[str, list[SpendRecord]]]:
    """(segment_id, records) of every segment waiting, as the ledger would receive them."""
    for segment in spool.pending_segments():
        shipped = msgspec.json.decode(SpendSpool.load(segment).body, type=SpendSegment)
        yield shipped.segment_id, shipped.records


class FakeLedger:
    """The control plane's spend-commands, in process: deduplicates as the real ledger must.

    `outcomes` scripts the answers: an exception instance is raised for one call, `"hang"`
    waits until the call is cancelled; once they are used up every call succeeds.
    """

    def __init__(self, *outcomes: BaseException | str) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[str] = []
        """segment_id of every call, in order, failed ones included."""
        self.segments: list[SpendSegment] = []
        """Every segment accepted, duplicates included."""
        self.ids: set[str] = set()
        self.called = asyncio.Event()
        self.calls_wanted = 0

    async def __call__(self, body: bytes) -> SpendAck:
        segment = msgspec.json.decode(body, type=SpendSegment)
        self.calls.append(segment.segment_id)
        if len(self.calls) >= self.calls_wanted:
            self.called.set()
        if self.outcomes:
            outcome = self.outcomes.pop(0)
            if outcome == "hang":
                await asyncio.Event().wait()
            if isinstance(outcome, BaseException):
                raise outcome
        fresh = [r for r in segment.records if r.id not in self.ids]
        self.ids.update(r.id for r in fresh)
        self.segments.append(segment)
        return SpendAck(
            segment_id=segment.segment_id,
            accepted=len(fresh),
            duplicates=len(segment.records) - len(fresh),
        )

    @property
    def records(self) -> list[SpendRecord]:
        """Every distinct record in the ledger, in the order received."""
        seen: set[str] = set()
        out = []
        for segment in self.segments:
            for rec in segment.records:
                if rec.id not in seen:
                    seen.add(rec.id)
                    out.append(rec)
        return out

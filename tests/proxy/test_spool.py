"""The spend spool on real files: append, seal, sequence, the bound and its two policies."""

from __future__ import annotations

import errno
import os
import uuid
from pathlib import Path

import msgspec
import pytest

from proxy.spend import spool as spool_module
from proxy.spend.spool import FullPolicy, SpendSpool, SpoolError, rfc3339_micro
from tests.proxy.spool_support import SteppedClock, record, segment_records
from vkgate.spend import SpendRecord, SpendSegment


@pytest.fixture
def clock() -> SteppedClock:
    return SteppedClock()


def open_spool(root: Path, clock: SteppedClock, **options: object) -> SpendSpool:
    return SpendSpool.open(root, clock, **options)  # type: ignore[arg-type]


def lines_on_disk(spool: SpendSpool) -> list[bytes]:
    out: list[bytes] = []
    for path in sorted(spool.directory.iterdir()):
        if path.suffix in (".open", ".seg"):
            out += path.read_bytes().splitlines(keepends=True)
    return out


class TestAppend:
    def test_append_stamps_id_replica_seq_and_time(
        self, tmp_path: Path, clock: SteppedClock
    ) -> None:
        spool = open_spool(tmp_path, clock)
        first, second = record("a"), record("b")
        spool.append(first)
        clock.elapse(0.25)
        spool.append(second)
        assert (first.seq, second.seq) == (1, 2)
        assert first.replica_id == second.replica_id == spool.replica_id
        assert first.at == "2026-03-10T12:00:00.000000Z"
        assert second.at == "2026-03-10T12:00:00.250000Z"
        for rec in (first, second):
            assert uuid.UUID(hex=rec.id).version == 4 and len(rec.id) == 32
        assert first.id != second.id
        spool.close()

    def test_ids_stay_unique_across_many_records(self, tmp_path: Path, clock: SteppedClock) -> None:
        spool = open_spool(tmp_path, clock)
        ids = set()
        for n in range(2000):  # more than one batch of the id pool
            rec = record(f"r{n}")
            spool.append(rec)
            ids.add(rec.id)
            assert uuid.UUID(hex=rec.id).variant == uuid.RFC_4122
        assert len(ids) == 2000
        spool.close()

    def test_each_record_is_one_line_of_json_and_its_checksum(
        self, tmp_path: Path, clock: SteppedClock
    ) -> None:
        spool = open_spool(tmp_path, clock)
        spool.append(record("a", input_tokens=12))
        [line] = lines_on_disk(spool)
        json, crc = line.rstrip(b"\n").rsplit(b" ", 1)
        assert msgspec.json.decode(json, type=SpendRecord).input_tokens == 12
        assert len(crc) == 8 and int(crc, 16) >= 0
        spool.close()

    def test_each_append_is_a_single_write(
        self, tmp_path: Path, clock: SteppedClock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        spool = open_spool(tmp_path, clock)
        writes: list[int] = []
        real_write = os.write

        def counting(fd: int, data: bytes | bytearray | memoryview) -> int:
            writes.append(len(data))
            return real_write(fd, data)

        monkeypatch.setattr(os, "write", counting)
        for n in range(3):
            spool.append(record(f"r{n}"))
        monkeypatch.undo()
        assert len(writes) == 3
        assert [len(x) for x in lines_on_disk(spool)] == writes
        spool.close()

    def test_time_is_utc_with_microseconds_whatever_the_clock_zone(self) -> None:
        from datetime import datetime, timedelta, timezone

        moment = datetime(2026, 3, 10, 14, 0, 0, 7, tzinfo=timezone(timedelta(hours=2)))
        assert rfc3339_micro(moment) == "2026-03-10T12:00:00.000007Z"


class TestSeal:
    def test_seal_makes_a_sealed_segment_and_opens_the_next(
        self, tmp_path: Path, clock: SteppedClock
    ) -> None:
        spool = open_spool(tmp_path, clock)
        for n in range(3):
            spool.append(record(f"r{n}"))
        assert spool.seal() == 1
        spool.append(record("r3"))
        names = sorted(p.name for p in spool.directory.iterdir() if p.suffix in (".open", ".seg"))
        assert names == ["00000000000000000001.seg", "00000000000000000004.open"]
        assert (spool.directory / "seq").read_text().strip() == "3"
        spool.close()

    def test_seal_without_records_seals_nothing(self, tmp_path: Path, clock: SteppedClock) -> None:
        spool = open_spool(tmp_path, clock)
        assert spool.seal() == 0
        spool.append(record())
        assert spool.seal() == 1
        assert spool.seal() == 0
        assert len(spool.pending_segments()) == 1
        spool.close()

    def test_segment_ids_sort_oldest_first(self, tmp_path: Path, clock: SteppedClock) -> None:
        spool = open_spool(tmp_path, clock)
        for n in range(12):
            spool.append(record(f"r{n}"))
            if n % 3 == 2:
                spool.seal()
        ids = [segment.segment_id for segment in spool.pending_segments()]
        assert ids == sorted(ids) and len(set(ids)) == 4
        assert ids[0] == "00000000000000000001" and ids[1] == "00000000000000000004"
        spool.close()

    def test_a_segment_ships_as_a_spend_segment_of_its_records(
        self, tmp_path: Path, clock: SteppedClock
    ) -> None:
        spool = open_spool(tmp_path, clock)
        written = [record(f"r{n}", input_tokens=n) for n in range(5)]
        for rec in written:
            spool.append(rec)
        spool.seal()
        [segment] = spool.pending_segments()
        shipped = msgspec.json.decode(SpendSpool.load(segment).body, type=SpendSegment)
        assert shipped.replica_id == spool.replica_id
        assert shipped.segment_id == segment.segment_id == "00000000000000000001"
        assert shipped.records == written
        spool.close()

    def test_a_full_segment_is_closed_at_once_and_wakes_the_drainer(
        self, tmp_path: Path, clock: SteppedClock
    ) -> None:
        spool = open_spool(tmp_path, clock, segment_max_bytes=1000)
        woken: list[int] = []
        spool.on_rotate = lambda: woken.append(spool.seq)
        for n in range(12):
            spool.append(record(f"r{n}"))  # about 190 bytes each
        assert woken == [6, 12]
        assert spool.has_rotated
        assert spool.seal() == 2
        sizes = [segment.size for segment in spool.pending_segments()]
        assert all(1000 <= size < 1000 + 200 for size in sizes)
        spool.close()

    def test_close_seals_what_was_written_and_leaves_no_empty_segment(
        self, tmp_path: Path, clock: SteppedClock
    ) -> None:
        spool = open_spool(tmp_path, clock)
        spool.append(record())
        directory = spool.directory
        spool.close()
        assert sorted(p.name for p in directory.iterdir()) == [
            "00000000000000000001.seg",
            "lock",
            "seq",
        ]
        with pytest.raises(SpoolError, match="closed"):
            spool.append(record())


class TestReplicaIds:
    def test_generated_replica_id_is_kept_in_the_directory(
        self, tmp_path: Path, clock: SteppedClock
    ) -> None:
        first = open_spool(tmp_path, clock)
        replica = first.replica_id
        first.close()
        again = open_spool(tmp_path, clock)
        assert again.replica_id == replica
        assert (tmp_path / ".replica-id").read_text().strip() == replica
        again.close()

    def test_configured_replica_id_names_the_directory(
        self, tmp_path: Path, clock: SteppedClock
    ) -> None:
        spool = open_spool(tmp_path, clock, replica_id="pod-a")
        rec = record()
        spool.append(rec)
        assert rec.replica_id == "pod-a"
        assert spool.directory == tmp_path / "pod-a"
        spool.close()

    @pytest.mark.parametrize("bad", ["", "../x", ".hidden", "a b", "x" * 65])
    def test_a_replica_id_unsafe_as_a_name_is_refused(
        self, tmp_path: Path, clock: SteppedClock, bad: str
    ) -> None:
        with pytest.raises(SpoolError, match="replica id"):
            open_spool(tmp_path, clock, replica_id=bad)

    def test_two_processes_on_one_directory_get_their_own_replicas(
        self, tmp_path: Path, clock: SteppedClock
    ) -> None:
        # Workers of one proxy share VKGATE_SPOOL_DIR; each must have its own sequence.
        one = open_spool(tmp_path, clock, replica_id="pod-a")
        two = open_spool(tmp_path, clock, replica_id="pod-a")
        a, b = record("a"), record("b")
        one.append(a)
        two.append(b)
        assert (a.replica_id, a.seq) == ("pod-a", 1)
        assert (b.replica_id, b.seq) == ("pod-a-1", 1)
        one.close()
        two.close()


class TestRefusePolicy:
    def test_full_spool_refuses_new_requests_but_admitted_ones_are_still_written(
        self, tmp_path: Path, clock: SteppedClock
    ) -> None:
        spool = open_spool(tmp_path, clock, max_bytes=4000, headroom_bytes=1000)
        while not spool.full:
            spool.append(record("admitted", kind="admit"))
        assert spool.bytes >= 3000
        in_flight = spool.seq
        # Requests admitted before the spool filled up still write their outcome records.
        for _ in range(4):
            spool.append(record("admitted", kind="confirm"))
        assert spool.seq == in_flight + 4
        assert spool.bytes <= 4000
        spool.count_refused()
        stats = spool.stats()
        assert stats.full and stats.refused_when_full == 1
        spool.close()

    def test_full_spool_accepts_again_once_segments_are_shipped(
        self, tmp_path: Path, clock: SteppedClock
    ) -> None:
        spool = open_spool(tmp_path, clock, max_bytes=4000, headroom_bytes=1000)
        while not spool.full:
            spool.append(record())
        spool.seal()
        for segment in spool.pending_segments():
            spool.acknowledge(segment, SpendSpool.load(segment))
        assert not spool.full
        assert spool.bytes == 0
        spool.close()

    def test_headroom_defaults_to_an_eighth_of_the_bound_up_to_16_mib(
        self, tmp_path: Path, clock: SteppedClock
    ) -> None:
        small = open_spool(tmp_path / "small", clock, max_bytes=8000)
        while not small.full:
            small.append(record())
        assert 7000 <= small.bytes < 7000 + 200
        small.close()


class TestDropOldestPolicy:
    def test_oldest_sealed_segments_are_dropped_and_counted(
        self, tmp_path: Path, clock: SteppedClock
    ) -> None:
        spool = open_spool(
            tmp_path, clock, max_bytes=2000, policy=FullPolicy.DROP_OLDEST, headroom_bytes=0
        )
        for n in range(30):
            spool.append(record(f"r{n}"))
            if n % 5 == 4:
                spool.seal()
        assert not spool.full  # this policy never refuses
        assert spool.bytes <= 2000
        stats = spool.stats()
        assert stats.dropped_segments >= 1
        assert stats.dropped_records == 5 * stats.dropped_segments
        kept = [rec.seq for _, records in segment_records(spool) for rec in records]
        assert kept == list(range(kept[0], 31))  # what is left has no gap and ends last
        assert kept[0] == stats.dropped_records + 1  # the oldest went first
        spool.close()

    def test_the_segment_being_shipped_is_never_dropped(
        self, tmp_path: Path, clock: SteppedClock
    ) -> None:
        spool = open_spool(
            tmp_path, clock, max_bytes=2000, policy=FullPolicy.DROP_OLDEST, headroom_bytes=0
        )
        for _ in range(5):
            spool.append(record())
        spool.seal()
        [shipping] = spool.pending_segments()
        shipping.in_flight = True
        for n in range(20):
            spool.append(record(f"r{n}"))
            if n % 5 == 4:
                spool.seal()
        assert shipping in spool.pending_segments()
        assert shipping.path.exists()
        assert spool.dropped_segments >= 1
        spool.close()


class TestWriteFailures:
    def test_a_spool_that_cannot_write_is_full_and_loses_no_sequence_number(
        self, tmp_path: Path, clock: SteppedClock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        spool = open_spool(tmp_path, clock, policy=FullPolicy.DROP_OLDEST)
        spool.append(record("before"))

        def disk_full(fd: int, data: bytes) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "write", disk_full)
        with pytest.raises(SpoolError, match="No space left"):
            spool.append(record("lost"))
        assert spool.full and not spool.writable  # whatever the policy
        monkeypatch.undo()
        after = record("after")
        spool.append(after)
        assert after.seq == 2  # no gap where the failed record was
        assert not spool.full and spool.writable
        spool.close()

    def test_a_spool_that_could_not_write_is_tried_again_by_the_drainers_pass(
        self, tmp_path: Path, clock: SteppedClock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        spool = open_spool(tmp_path, clock)
        spool.append(record("before"))
        real_write = os.write
        monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:40])))
        with pytest.raises(SpoolError):
            spool.append(record("torn"))
        monkeypatch.undo()
        assert not spool.writable and spool.full
        assert not spool.at_bound, "not over the bound: the gateway lets an append probe"
        spool.retry_writable()
        assert spool.writable and not spool.full
        after = record("after")
        spool.append(after)
        assert after.seq == 2
        spool.close()

    def test_an_outcome_that_could_not_be_written_waits_in_memory_then_lands_in_order(
        self, tmp_path: Path, clock: SteppedClock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        spool = open_spool(tmp_path, clock)
        spool.append(record("admitted", "admit"))
        monkeypatch.setattr(os, "write", _no_space)
        outcomes = [record(f"r{n}", "confirm") for n in range(3)]
        for outcome in outcomes:
            assert not settled(spool, outcome)
        stamped_at = [outcome.at for outcome in outcomes]
        assert spool.waiting == 3 and [o.seq for o in outcomes] == [0, 0, 0]
        spool.retry_writable()  # the disk is still full: they keep waiting
        assert spool.waiting == 3 and not spool.writable
        monkeypatch.undo()

        spool.retry_writable()  # the drainer's pass, once there is room again
        assert spool.waiting == 0 and spool.writable
        assert [o.seq for o in outcomes] == [2, 3, 4]
        assert [o.at for o in outcomes] == stamped_at, "each keeps the moment it happened"
        assert all(stamped_at) and len({o.id for o in outcomes}) == 3
        assert {o.replica_id for o in outcomes} == {spool.replica_id}
        spool.append(record("next"))
        spool.seal()
        written = [rec.request_id for _, records in segment_records(spool) for rec in records]
        assert written == ["admitted", "r0", "r1", "r2", "next"]
        spool.close()

    def test_an_outcome_refused_while_no_segment_can_open_is_stamped_all_the_same(
        self, tmp_path: Path, clock: SteppedClock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        spool = open_spool(tmp_path, clock)
        real_write = os.write
        monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:10])))
        held = record("torn", "confirm")
        assert not settled(spool, held)  # a short write: the segment is retired, none is open
        monkeypatch.setattr(os, "open", _no_space)
        later = [record(f"r{n}", "confirm") for n in range(2)]
        for outcome in later:
            assert not settled(spool, outcome)  # fails opening a segment, before writing anything
        monkeypatch.undo()
        spool.retry_writable()
        stamped = [held, *later]
        assert all(o.id and o.at and o.replica_id == spool.replica_id for o in stamped)
        assert len({o.id for o in stamped}) == 3
        spool.seal()
        written = [rec.request_id for _, records in segment_records(spool) for rec in records]
        assert written == ["torn", "r0", "r1"]
        spool.close()

    def test_an_outcome_held_after_close_is_logged_as_lost(
        self, tmp_path: Path, clock: SteppedClock, caplog: pytest.LogCaptureFixture
    ) -> None:
        spool = open_spool(tmp_path, clock)
        spool.close()
        spool.hold(record("late", "confirm"))
        assert spool.waiting == 0
        assert any("request_id=late" in r.getMessage() for r in caplog.records)

    def test_waiting_outcomes_go_before_the_next_record(
        self, tmp_path: Path, clock: SteppedClock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        spool = open_spool(tmp_path, clock)
        real_write = os.write
        monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:0])))
        held = record("held", "confirm")
        assert not settled(spool, held)
        monkeypatch.undo()
        spool.append(record("after"))
        spool.seal()
        written = [rec.request_id for _, records in segment_records(spool) for rec in records]
        assert written == ["held", "after"]
        spool.close()

    def test_waiting_outcomes_are_written_at_close(
        self, tmp_path: Path, clock: SteppedClock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        spool = open_spool(tmp_path, clock)
        spool.append(record("before"))
        monkeypatch.setattr(os, "write", lambda fd, data: 0)
        held = record("held", "confirm")
        assert not settled(spool, held)
        monkeypatch.undo()
        spool.close()
        again = open_spool(tmp_path, clock)
        written = [rec.request_id for _, records in segment_records(again) for rec in records]
        assert written == ["before", "held"]
        again.close()

    def test_past_the_memory_bound_a_waiting_outcome_is_lost_and_logged(
        self,
        tmp_path: Path,
        clock: SteppedClock,
        monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        monkeypatch.setattr(spool_module, "HELD_MAX", 2)
        spool = open_spool(tmp_path, clock)
        for n in range(3):
            spool.hold(record(f"r{n}", "confirm"))
        assert spool.waiting == 2
        [lost] = [r.getMessage() for r in caplog.records if "spend record lost" in r.getMessage()]
        assert "request_id=r2" in lost
        spool.close()

    def test_a_short_write_is_never_glued_to_the_next_record(
        self, tmp_path: Path, clock: SteppedClock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        spool = open_spool(tmp_path, clock)
        spool.append(record("before"))
        real_write = os.write

        def short(fd: int, data: bytes) -> int:
            return real_write(fd, bytes(data[:40]))

        monkeypatch.setattr(os, "write", short)
        with pytest.raises(SpoolError, match="short write"):
            spool.append(record("torn"))
        monkeypatch.undo()
        spool.append(record("after"))
        spool.seal()
        shipped = [rec.request_id for _, records in segment_records(spool) for rec in records]
        assert shipped == ["before", "after"]
        assert [rec.seq for _, records in segment_records(spool) for rec in records] == [1, 2]
        spool.close()


def test_stats_report_bytes_segments_and_the_oldest_record_age(
    tmp_path: Path, clock: SteppedClock
) -> None:
    spool = open_spool(tmp_path, clock)
    assert spool.stats().oldest_record_age_s is None
    spool.append(record())
    clock.elapse(3)
    spool.seal()
    spool.append(record())
    clock.elapse(2)
    stats = spool.stats()
    assert stats.oldest_record_age_s == 5.0
    assert stats.segments == 2
    assert stats.bytes == sum(len(x) for x in lines_on_disk(spool))
    assert stats.seq == 2 and stats.writable and not stats.full
    spool.close()


def _no_space(*args: object, **kwargs: object) -> int:
    raise OSError(errno.ENOSPC, "No space left on device")


def settled(spool: SpendSpool, outcome: SpendRecord) -> bool:
    """An outcome recorded as the gateway does: appended, or held when it cannot be written;
    whether it was written."""
    try:
        spool.append(outcome)
    except SpoolError:
        spool.hold(outcome)
        return False
    return True

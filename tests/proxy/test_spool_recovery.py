"""What a spool finds on start-up: a previous process's segments, torn and corrupted lines, the
sequence to continue, orphaned replica directories, and a process killed while it appended."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest

from proxy.spend import _lines
from proxy.spend.spool import LOAD_LINES_PER_STEP, SpendSpool
from tests.proxy.spool_support import (
    SteppedClock,
    line,
    record,
    replica_dir,
    segment_records,
    stamped,
)
from tests.support.processes import stop
from vkgate.spend import SpendRecord

REPLICA = "r0"
T = TypeVar("T")


@pytest.fixture
def clock() -> SteppedClock:
    return SteppedClock()


def shipped(spool: SpendSpool) -> list[SpendRecord]:
    return [rec for _, records in segment_records(spool) for rec in records]


class TestSequence:
    def test_sequence_continues_after_a_restart(self, tmp_path: Path, clock: SteppedClock) -> None:
        first = SpendSpool.open(tmp_path, clock)
        for n in range(3):
            first.append(record(f"r{n}"))
        first.close()
        again = SpendSpool.open(tmp_path, clock)
        rec = record("after")
        again.append(rec)
        assert rec.seq == 4
        again.close()

    def test_sequence_continues_when_every_segment_was_shipped_and_deleted(
        self, tmp_path: Path, clock: SteppedClock
    ) -> None:
        first = SpendSpool.open(tmp_path, clock)
        for n in range(5):
            first.append(record(f"r{n}"))
        first.seal()
        for segment in first.pending_segments():
            first.acknowledge(segment, SpendSpool.load(segment))
        first.close()
        assert not [p for p in first.directory.iterdir() if p.suffix in (".seg", ".open")]
        again = SpendSpool.open(tmp_path, clock)
        rec = record("after")
        again.append(rec)
        assert rec.seq == 6
        again.close()

    def test_sequence_continues_after_records_left_in_an_open_segment(
        self, tmp_path: Path, clock: SteppedClock
    ) -> None:
        directory = replica_dir(tmp_path, REPLICA)
        (directory / "seq").write_text("10\n")
        body = b"".join(line(stamped(REPLICA, seq)) for seq in range(11, 15))
        (directory / f"{11:020d}.open").write_bytes(body)
        spool = SpendSpool.open(tmp_path, clock)
        rec = record()
        spool.append(rec)
        assert (rec.replica_id, rec.seq) == (REPLICA, 15)
        spool.close()

    def test_a_lost_sequence_mark_is_rebuilt_from_the_segments(
        self, tmp_path: Path, clock: SteppedClock
    ) -> None:
        directory = replica_dir(tmp_path, REPLICA)
        body = b"".join(line(stamped(REPLICA, seq)) for seq in range(1, 8))
        (directory / f"{1:020d}.seg").write_bytes(body)
        spool = SpendSpool.open(tmp_path, clock)
        rec = record()
        spool.append(rec)
        assert rec.seq == 8
        assert (directory / "seq").read_text().strip() == "7"
        spool.close()


class TestLeftBehind:
    def test_an_open_segment_left_behind_is_sealed_and_shipped(
        self, tmp_path: Path, clock: SteppedClock
    ) -> None:
        directory = replica_dir(tmp_path, REPLICA)
        left = [stamped(REPLICA, seq) for seq in (1, 2, 3)]
        (directory / f"{1:020d}.open").write_bytes(b"".join(line(r) for r in left))
        spool = SpendSpool.open(tmp_path, clock)
        assert not (directory / f"{1:020d}.open").exists()
        assert (directory / f"{1:020d}.seg").exists()
        assert list(segment_records(spool)) == [(f"{1:020d}", left)]
        assert spool.stats().oldest_record_age_s == 3600.0  # written an hour before "now"
        spool.close()

    def test_an_empty_open_segment_left_behind_is_removed(
        self, tmp_path: Path, clock: SteppedClock
    ) -> None:
        directory = replica_dir(tmp_path, REPLICA)
        (directory / f"{1:020d}.open").write_bytes(b"")
        spool = SpendSpool.open(tmp_path, clock)
        assert spool.pending_segments() == []
        rec = record()
        spool.append(rec)
        assert rec.seq == 1
        spool.close()

    def test_a_torn_last_record_is_cut_off_and_never_shipped(
        self, tmp_path: Path, clock: SteppedClock
    ) -> None:
        directory = replica_dir(tmp_path, REPLICA)
        whole = [stamped(REPLICA, seq) for seq in (1, 2)]
        torn = line(stamped(REPLICA, 3))[:57]  # the write of the third never finished
        good = b"".join(line(r) for r in whole)
        (directory / f"{1:020d}.open").write_bytes(good + torn)
        spool = SpendSpool.open(tmp_path, clock)
        assert shipped(spool) == whole
        assert (directory / f"{1:020d}.seg").read_bytes() == good  # cut off on disk too
        assert spool.stats().torn_bytes == 57
        rec = record()
        spool.append(rec)
        assert rec.seq == 3  # the torn record was never written: its number is reused
        spool.close()

    def test_a_last_line_that_fails_its_checksum_is_cut_off(
        self, tmp_path: Path, clock: SteppedClock
    ) -> None:
        directory = replica_dir(tmp_path, REPLICA)
        whole = [stamped(REPLICA, 1)]
        bad = line(stamped(REPLICA, 2)).replace(b'"seq":2', b'"seq":7')
        (directory / f"{1:020d}.open").write_bytes(line(whole[0]) + bad)
        spool = SpendSpool.open(tmp_path, clock)
        assert shipped(spool) == whole
        assert spool.stats().torn_bytes == len(bad)
        spool.close()

    @pytest.mark.parametrize(
        "damage",
        [
            pytest.param(
                lambda raw: raw.replace(b'"input_tokens":2', b'"input_tokens":9'), id="bit"
            ),
            pytest.param(lambda raw: b"\x00" * (len(raw) - 1) + b"\n", id="zeros"),
            pytest.param(lambda raw: raw[:30] + b"\n", id="cut"),
        ],
    )
    def test_a_corrupted_line_in_the_middle_is_skipped_counted_and_never_shipped(
        self, tmp_path: Path, clock: SteppedClock, damage: object
    ) -> None:
        directory = replica_dir(tmp_path, REPLICA)
        records = [stamped(REPLICA, seq) for seq in (1, 2, 3)]
        lines = [line(r) for r in records]
        lines[1] = damage(lines[1])  # type: ignore[operator]
        (directory / f"{1:020d}.seg").write_bytes(b"".join(lines))
        (directory / "seq").write_text("3\n")
        spool = SpendSpool.open(tmp_path, clock)
        [segment] = spool.pending_segments()
        loaded = SpendSpool.load(segment)
        assert loaded.records == 2 and loaded.corrupt == 1
        assert shipped(spool) == [records[0], records[2]]
        spool.acknowledge(segment, loaded)
        assert spool.stats().corrupt_records == 1
        spool.close()

    def test_the_same_segment_ships_with_the_same_id_and_body_after_a_crash(
        self, tmp_path: Path, clock: SteppedClock
    ) -> None:
        # The ledger acknowledged, then the process died before deleting the segment.
        first = SpendSpool.open(tmp_path, clock)
        for n in range(4):
            first.append(record(f"r{n}"))
        first.seal()
        [segment] = first.pending_segments()
        before = SpendSpool.load(segment).body
        first.close()
        again = SpendSpool.open(tmp_path, clock)
        [same] = again.pending_segments()
        assert same.segment_id == segment.segment_id
        assert SpendSpool.load(same).body == before  # so the ledger sees duplicates only
        again.close()

    def test_a_scan_in_steps_pauses_every_so_many_lines_and_finds_what_scan_finds(self) -> None:
        lines = [line(stamped(REPLICA, seq)) for seq in range(1, 6)]
        lines[2] = lines[2].replace(b'"seq":3', b'"seq":8')  # fails its checksum
        data = b"".join(lines) + lines[4][:20]  # and a torn tail
        stepped = _lines.Scan()
        pauses = len(list(_lines.scan_in_steps(data, stepped, decode=True, lines_per_step=2)))
        assert pauses == 3  # before the 2nd, 4th and 6th (torn) line's step
        assert stepped == _lines.scan(data, decode=True)
        assert (len(stepped.records), stepped.corrupt, stepped.torn) == (4, 1, 20)

    async def test_a_segment_read_for_shipping_lets_requests_run_between_steps(
        self, tmp_path: Path, clock: SteppedClock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # Its lines are checked on the event loop, a step at a time: a task that counts its
        # turns runs between the steps, and the body is the one `load` reads, damage included.
        # The file is read inline (`Inline`), so the turns counted are the scan's, not the
        # read's wait for its thread.
        steps = 8
        count = steps * LOAD_LINES_PER_STEP
        directory = replica_dir(tmp_path, REPLICA)
        lines = [line(stamped(REPLICA, seq)) for seq in range(1, count + 1)]
        lines[5] = lines[5].replace(b'"seq":6', b'"seq":9')
        (directory / f"{1:020d}.seg").write_bytes(b"".join(lines))
        (directory / "seq").write_text(f"{count}\n")
        spool = SpendSpool.open(tmp_path, clock)
        [segment] = spool.pending_segments()
        # Only for this test: the loop is the session's, and every later `to_thread` would run
        # on it, blocking it (a server in the same loop would stop answering).
        monkeypatch.setattr(asyncio.get_running_loop(), "_default_executor", Inline())
        turns = 0

        async def serving() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(serving())
        try:
            loaded = await SpendSpool.load_async(segment)
        finally:
            task.cancel()
        assert loaded == SpendSpool.load(segment)
        assert (loaded.records, loaded.corrupt) == (count - 1, 1)
        assert turns >= steps  # one after each step; without steps, 3 in all
        spool.close()


class Inline(concurrent.futures.ThreadPoolExecutor):
    """An executor that runs each piece of work at once, in the caller's thread (asyncio takes
    only a ThreadPoolExecutor as the loop's default; this one never starts a thread)."""

    def submit(  # type: ignore[override]
        self, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)
        return future


class TestOrphans:
    def test_a_directory_no_process_holds_is_adopted_under_its_own_replica_id(
        self, tmp_path: Path, clock: SteppedClock
    ) -> None:
        gone = replica_dir(tmp_path, "old-worker")
        left = [stamped("old-worker", seq) for seq in (1, 2)]
        (gone / f"{1:020d}.open").write_bytes(b"".join(line(r) for r in left))
        spool = SpendSpool.open(tmp_path, clock, replica_id="new")
        assert spool.pending_segments() == []
        assert spool.adopt_orphans() == 1
        [(segment_id, records)] = list(segment_records(spool))
        assert (segment_id, records) == (f"{1:020d}", left)
        [segment] = spool.pending_segments()
        assert segment.replica_id == "old-worker"
        # Until its segments are shipped, no other process takes the orphan.
        other = SpendSpool.open(tmp_path, clock, replica_id="old-worker")
        assert other.replica_id == "old-worker-1"
        other.close()
        spool.acknowledge(segment, SpendSpool.load(segment))
        assert spool.adopt_orphans() == 0
        back = SpendSpool.open(tmp_path, clock, replica_id="old-worker")
        assert back.replica_id == "old-worker"  # let go once shipped
        rec = record()
        back.append(rec)
        assert rec.seq == 3
        back.close()
        spool.close()

    def test_a_directory_a_live_process_holds_is_left_alone(
        self, tmp_path: Path, clock: SteppedClock
    ) -> None:
        live = SpendSpool.open(tmp_path, clock, replica_id="live")
        live.append(record())
        live.seal()
        other = SpendSpool.open(tmp_path, clock, replica_id="other")
        assert other.adopt_orphans() == 0
        other.close()
        live.close()


CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from proxy.spend.spool import SpendSpool
    from vkgate.clock import SystemClock
    from vkgate.spend import SpendRecord

    spool = SpendSpool.open(Path(sys.argv[1]), SystemClock(), segment_max_bytes=20_000)
    out = sys.stdout
    while True:
        record = SpendRecord(
            id="", kind="admit", replica_id="", seq=0, request_id="r", at="", route="/v1/x"
        )
        spool.append(record)
        out.write(f"{record.seq}\\n")
        out.flush()
        if record.seq % 500 == 0:
            spool.seal()
    """
)


def test_a_killed_process_loses_no_record_it_appended(tmp_path: Path, clock: SteppedClock) -> None:
    """SIGKILL mid-stream: every append that returned is on disk, with no gap and no garbage."""
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path / "spool")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    try:
        assert process.stdout is not None
        last = 0
        while last < 3000:  # several sealed segments, then more in the open one
            reported = process.stdout.readline()
            assert reported, process.stderr.read().decode() if process.stderr else ""
            last = int(reported)
        process.send_signal(signal.SIGKILL)  # only the process this test started
        process.wait(timeout=10)
    finally:
        stop(process)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
    spool = SpendSpool.open(tmp_path / "spool", clock)
    seqs = [rec.seq for rec in shipped(spool)]
    assert seqs == list(range(1, len(seqs) + 1))  # no gap, nothing out of order
    assert len(seqs) >= last  # everything the child saw appended, perhaps a little more
    assert spool.stats().corrupt_records == 0
    rec = record()
    spool.append(rec)
    assert rec.seq == len(seqs) + 1
    spool.close()


def test_a_shipped_body_decodes_as_records_of_this_replica(
    tmp_path: Path, clock: SteppedClock
) -> None:
    spool = SpendSpool.open(tmp_path, clock)
    spool.append(record())
    spool.seal()
    [segment] = spool.pending_segments()
    body = msgspec.json.decode(SpendSpool.load(segment).body)
    assert set(body) == {"replica_id", "segment_id", "records"}
    assert body["records"][0]["replica_id"] == spool.replica_id
    spool.close()

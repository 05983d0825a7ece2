"""The proxy's on-disk spend spool: every spend record is on disk before its response completes.

On disk (`VKGATE_SPOOL_DIR`)::

    .replica-id                    the generated replica id, made once (unless VKGATE_REPLICA_ID)
    <replica id>/                  one directory per writing process; its name is the replica id
        lock                       flock()ed by the process writing here (holds its pid)
        seq                        high-water mark: the highest seq sealed, in decimal
        00000000000000000001.seg   a sealed segment, named by the seq of its first record
        00000000000000000351.open  the segment being written
        rejected/                  segments the control plane refused as malformed, kept aside

A segment is one record per line (see `_lines`: JSON, a space, a CRC-32, `\\n`); its name
without the suffix is the `segment_id` the ledger deduplicates on, so shipping the same file
twice is harmless. Names are zero-padded so they sort oldest first.

Append (the hot path, twice per request) fills `id`, `replica_id`, `seq` and `at`, encodes the
line into one reused buffer and hands it to the OS with a single `os.write()` on an `O_APPEND`
descriptor: a process that is SIGKILLed afterwards loses nothing, the kernel has the bytes. No
fsync there: the drainer seals every `VKGATE_SPEND_FLUSH_INTERVAL_SECONDS` (fsync, record the
high-water mark, rename `.open` to `.seg`, fsync the directory) off the event loop. A segment
that reaches `segment_max_bytes` is closed for writing at once (an `open()` every few thousand
records) so that no shipped body outgrows the control plane's request limit.

Sequence numbers run from 1 per replica without gaps across restarts: the `seq` file is written
(atomically, durably) before any segment is renamed to `.seg`, so it survives even when every
segment was shipped and deleted; at start-up the sequence continues after the highest of it and
of the records left in `.open` files.

Several processes may share one spool directory (a proxy's workers, two proxies started
in the same place): each takes the first replica directory whose lock is free (`<id>`, then
`<id>-1`, `<id>-2`, …), so a restarted worker usually finds its own directory again, with its
sequence. A directory no live process holds (fewer workers than before, or a replica id that
was changed) is an orphan: the drainer adopts it, ships its segments under its own replica id,
and lets it go. `VKGATE_REPLICA_ID` must be unique among the replicas that ship to one ledger.

Start-up recovery of a directory (its own, or an orphan's): each `.open` file is read back; a
torn last line (no `\\n`, or one that fails its checksum or does not decode) is cut off and
never shipped; a bad line in the middle is skipped and counted, and the file is sealed. Segments
of a previous process are fully decoded again when shipped; this process's own are checked by
their CRCs alone.

Bound: `max_bytes` counts every segment of the spool (open, waiting to be sealed, sealed, and
adopted). With `FullPolicy.REFUSE` (the default) `full` turns true once the spool holds
`max_bytes - headroom_bytes`, and the gateway refuses new requests (`503 spend_spool_full`)
rather than lose records; records are never refused by `append` itself, so the outcome records
of requests already admitted (and the records of those refusals) are always written, into the
headroom (16 MiB or an eighth of `max_bytes`, whichever is less: some 25,000 records). With
`FullPolicy.DROP_OLDEST` `append` deletes the oldest sealed segments (never the one being
shipped, never the open one) until the spool fits again, counts what it dropped and logs it;
the bound is then exceeded by at most the open segment and the one in flight. `full` is also
true, under either policy, while the spool cannot write (disk full, directory gone): a request
whose spend cannot be recorded should not be served.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import NoReturn

import msgspec

from proxy.spend import _lines
from proxy.spend._disk import (
    OPEN_SUFFIX,
    REJECTED_DIR,
    REPLICA_ID,
    Recovered,
    Rotated,
    Segment,
    Slot,
    SpoolError,
    count_lines,
    off_loop,
    recover,
    recover_orphans,
    seal_files,
    stored_replica_id,
    take_slot,
)
from vkgate.clock import Clock
from vkgate.spend import SpendRecord

__all__ = [
    "REPLICA_ID",
    "FullPolicy",
    "LoadedSegment",
    "Segment",
    "SpendSpool",
    "SpoolError",
    "SpoolStats",
    "rfc3339_micro",
]

log = logging.getLogger("vkgate.proxy.spend")

GIB = 1024**3
MIB = 1024**2
DEFAULT_MAX_BYTES = GIB
DEFAULT_SEGMENT_MAX_BYTES = 2 * MIB
"""About 4,800 records. The control plane's cost of a segment is mostly per statement, not per
record: a quarter as many segments cut its CPU per request by 45 % (bench/README.md).
Shipped gzipped (about 300 KiB) to a control plane that takes it, a segment stays under the
1 MiB a reverse proxy in front of it allows by default (nginx's `client_max_body_size`); the
control plane itself takes segments up to 128 MiB (`SPEND_SEGMENT_MAX_BYTES`)."""
LOAD_LINES_PER_STEP = 128
"""Lines `load_async` checks between two turns of the event loop: some 0.2-0.5 ms of checksums.
Joining a full segment's lines into its body then takes one C call of about 1 ms, in a thread
or not (it holds the GIL throughout)."""
MAX_HEADROOM_BYTES = 16 * MIB
HELD_MAX = 100_000
"""Outcome records kept in memory while the spool cannot write (some 100 MB at most)."""


class FullPolicy(StrEnum):
    REFUSE = "refuse"
    """Refuse new requests while the spool is full; never lose a record."""
    DROP_OLDEST = "drop_oldest"
    """Keep serving; delete the oldest sealed segments to stay within the bound."""


@dataclass(frozen=True, slots=True)
class LoadedSegment:
    """A segment read back and turned into the body of a `SpendSegment`."""

    body: bytes
    records: int
    corrupt: int
    """Lines skipped because they failed their checksum or did not decode."""


@dataclass(frozen=True, slots=True)
class SpoolStats:
    replica_id: str
    seq: int
    """The last sequence number written."""
    bytes: int
    segments: int
    """Segments not yet shipped, the open one included when it holds records."""
    oldest_record_age_s: float | None
    shipped_segments: int
    shipped_records: int
    dropped_segments: int
    dropped_records: int
    refused_when_full: int
    corrupt_records: int
    torn_bytes: int
    rejected_segments: int
    adopted_segments: int
    full: bool
    writable: bool


class _Ids:
    """Random UUID4s in hex, 256 per `getrandom()`: a third of `uuid.uuid4().hex`'s cost."""

    __slots__ = ("_at", "_pool")

    def __init__(self) -> None:
        self._pool = ""
        self._at = 0

    def next(self) -> str:
        at = self._at
        if at >= len(self._pool):
            raw = bytearray(os.urandom(16 * 256))
            for start in range(0, len(raw), 16):
                raw[start + 6] = (raw[start + 6] & 0x0F) | 0x40  # version 4
                raw[start + 8] = (raw[start + 8] & 0x3F) | 0x80  # RFC 4122 variant
            self._pool = raw.hex()
            at = 0
        self._at = at + 32
        return self._pool[at : at + 32]


_encode_time = msgspec.json.Encoder().encode


def rfc3339_micro(moment: datetime) -> str:
    """RFC 3339 UTC with microseconds and a `Z` (msgspec's encoder: ten times `isoformat`'s speed)."""
    if moment.tzinfo is not UTC:
        moment = moment.astimezone(UTC)
    if moment.microsecond:
        return _encode_time(moment)[1:-1].decode()
    return moment.strftime("%Y-%m-%dT%H:%M:%S.000000Z")  # msgspec leaves out a zero fraction


class SpendSpool:
    """The spool of one proxy process; build it with `SpendSpool.open`.

    All methods but `load` are called on the event loop's thread; `seal_async` and
    `adopt_orphans_async` do their disk work off it.
    """

    on_rotate: Callable[[], None] | None
    on_ledgered: Callable[[int], None] | None
    """Called with a segment's last sequence number once the ledger acknowledged it: every
    record of this process up to there is in the ledger."""
    """Called when a segment was closed for writing because it was full (the drainer's wake)."""

    def __init__(
        self,
        root: Path,
        slot: Slot,
        clock: Clock,
        recovered: Recovered,
        *,
        max_bytes: int,
        policy: FullPolicy,
        headroom_bytes: int,
        segment_max_bytes: int,
    ) -> None:
        self._root = root
        self._slot = slot
        self._replica_id = slot.replica_id
        self._clock = clock
        self._policy = policy
        self._max_bytes = max_bytes
        self._full_at = max_bytes - headroom_bytes
        # One comparison on the hot path serves both policies.
        self._drop_above = max_bytes if policy is FullPolicy.DROP_OLDEST else 1 << 62
        self._segment_max = segment_max_bytes
        self._encode_into = msgspec.json.Encoder().encode_into
        self._buffer = bytearray(1024)
        self._ids = _Ids()
        self.on_rotate = None
        self.on_ledgered = None

        self._seq = recovered.last_seq
        self._sealed: deque[Segment] = deque(recovered.segments)
        self._rotated: list[Rotated] = []
        self._adopted: dict[str, Slot] = {}
        self._bytes = sum(segment.size for segment in self._sealed)
        slot.pending = len(self._sealed)

        self._fd = -1
        self._open_path = slot.path
        self._open_bytes = 0
        self._open_records = 0
        self._open_first_at: datetime | None = None
        self._closed = False
        self._unwritable: str | None = None
        self._waiting: deque[SpendRecord] = deque()

        self.shipped_segments = 0
        self.shipped_records = 0
        self.dropped_segments = 0
        self.dropped_records = 0
        self.refused_when_full = 0
        self.corrupt_records = 0
        self.torn_bytes = recovered.torn_bytes
        self.rejected_segments = 0
        self.adopted_segments = 0

        self._open_segment()

    # -- opening and closing ------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: Path,
        clock: Clock,
        *,
        replica_id: str | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        policy: FullPolicy = FullPolicy.REFUSE,
        headroom_bytes: int | None = None,
        segment_max_bytes: int = DEFAULT_SEGMENT_MAX_BYTES,
    ) -> SpendSpool:
        """Take a replica directory under `directory`, recover what it holds, open a segment.

        Blocking disk I/O: call it before serving, or off the event loop.
        """
        if replica_id is not None and not REPLICA_ID.fullmatch(replica_id):
            raise SpoolError(f"replica id {replica_id!r} is not 1-64 of A-Z a-z 0-9 . _ -")
        if headroom_bytes is None:
            headroom_bytes = min(MAX_HEADROOM_BYTES, max_bytes // 8)
        if not 0 <= headroom_bytes < max_bytes:
            raise SpoolError("the headroom must be smaller than the spool's bound")
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            base = replica_id or stored_replica_id(directory)
            slot = take_slot(directory, base)
        except OSError as exc:
            raise SpoolError(f"cannot use the spool directory {directory}: {exc}") from exc
        try:
            recovered = recover(slot)
            return cls(
                directory,
                slot,
                clock,
                recovered,
                max_bytes=max_bytes,
                policy=policy,
                headroom_bytes=headroom_bytes,
                segment_max_bytes=segment_max_bytes,
            )
        except OSError as exc:
            os.close(slot.lock_fd)
            raise SpoolError(f"cannot recover the spool directory {slot.path}: {exc}") from exc

    def close(self) -> None:
        """Seal what was written and let the directories go; unshipped segments stay on disk."""
        if self._closed:
            return
        if self._waiting:
            try:
                if self._fd < 0:
                    self._reopen()
                self._write_waiting()
            except SpoolError:
                log.error(
                    "spend records lost at shutdown: %d held while the spool could not write",
                    len(self._waiting),
                )
        try:
            self.seal()
        finally:
            self._closed = True
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
                # Nothing was written since the last seal: no empty segment is left behind.
                with contextlib.suppress(OSError):
                    self._open_path.unlink()
            for slot in (*self._adopted.values(), self._slot):
                with contextlib.suppress(OSError):
                    os.close(slot.lock_fd)
            self._adopted.clear()

    # -- the hot path ---------------------------------------------------------------------------

    def append(self, record: SpendRecord) -> None:
        """Stamp `record` (id, replica_id, seq, at) and hand its line to the OS in one write.

        Raises `SpoolError` when the line could not be written (disk full, spool closed); the
        record then has no sequence number of its own: the next one reuses it, leaving no gap.
        Records `hold` kept are written first, in their order.
        """
        # Stamped first: a record that cannot be written now may be held and written later.
        now = self._clock.now()
        record.id = self._ids.next()
        record.replica_id = self._replica_id
        record.at = rfc3339_micro(now)
        if self._fd < 0:
            self._reopen()
        if self._waiting:
            self._write_waiting()
        self._write(record, now)

    def hold(self, record: SpendRecord) -> None:
        """Keep `record`, which `append` could not write, in memory until the spool writes again
        (the next `append`, or the drainer's `retry_writable`). A request is refused while the
        spool cannot write, so only the outcomes of those already in flight land here; past
        `HELD_MAX` a record is lost, and logged as such."""
        if self._closed or len(self._waiting) >= HELD_MAX:
            log.error(
                "spend record lost: request_id=%s route=%s (spool %s, %d records held)",
                record.request_id,
                record.route,
                "closed" if self._closed else "not writable",
                len(self._waiting),
            )
            return
        record.seq = 0
        self._waiting.append(record)

    @property
    def waiting(self) -> int:
        """Records waiting in memory for the spool to write again."""
        return len(self._waiting)

    def _write_waiting(self) -> None:
        held = self._waiting
        while held:
            record = held[0]
            self._write(record, self._clock.now())
            held.popleft()
        log.info("the spend spool wrote the records it held while it could not write")

    def _write(self, record: SpendRecord, now: datetime) -> None:
        seq = self._seq + 1
        record.seq = seq
        buffer = self._buffer
        self._encode_into(record, buffer)
        buffer += _lines.checksum_suffix(buffer)
        try:
            written = os.write(self._fd, buffer)
        except OSError as exc:
            record.seq = 0
            self._write_failed(exc, torn=False)
        if written != len(buffer):
            record.seq = 0
            self._write_failed(OSError(f"short write: {written} of {len(buffer)} bytes"), torn=True)
        self._seq = seq
        if self._unwritable is not None:
            self._unwritable = None
            log.info("the spend spool writes again")
        self._bytes += written
        self._open_bytes += written
        if not self._open_records:
            self._open_first_at = now
        self._open_records += 1
        if self._open_bytes >= self._segment_max:
            self._rotate_full()
        if self._bytes > self._drop_above:
            self._drop_oldest()

    @property
    def full(self) -> bool:
        """New requests should be refused: over the bound (refuse policy), or cannot write."""
        if self._unwritable is not None:
            return True
        return self._policy is FullPolicy.REFUSE and self._bytes >= self._full_at

    @property
    def at_bound(self) -> bool:
        """Over the bound under the refuse policy: new requests are refused."""
        return self._policy is FullPolicy.REFUSE and self._bytes >= self._full_at

    def retry_writable(self) -> None:
        """After a failed write, try again (the drainer does, every pass): a segment is reopened
        if need be and the spool counts as writable, so the next append is the real probe."""
        if self._unwritable is None or self._closed:
            return
        try:
            if self._fd < 0:
                self._open_segment()
        except OSError as exc:
            self._unwritable = str(exc)
            return
        self._unwritable = None
        log.info("the spend spool will try writing again")
        if self._waiting:
            with contextlib.suppress(SpoolError):  # still full: the next pass tries again
                self._write_waiting()

    def count_refused(self) -> None:
        """Count a request the gateway refused because the spool was `full`."""
        self.refused_when_full += 1

    @property
    def writable(self) -> bool:
        return self._unwritable is None and not self._closed

    @property
    def replica_id(self) -> str:
        return self._replica_id

    @property
    def directory(self) -> Path:
        """This process's replica directory."""
        return self._slot.path

    @property
    def seq(self) -> int:
        return self._seq

    @property
    def bytes(self) -> int:
        return self._bytes

    def _write_failed(self, exc: OSError, *, torn: bool) -> NoReturn:
        self._unwritable = str(exc)
        log.error("the spend spool cannot write to %s: %s", self._open_path, exc)
        if torn:
            # A partial line is on disk: the next record must not be glued to it.
            self._retire_open_segment()
        raise SpoolError(f"the spend spool cannot write: {exc}") from exc

    def _reopen(self) -> None:
        if self._closed:
            raise SpoolError("the spend spool is closed")
        try:
            self._open_segment()
        except OSError as exc:
            self._unwritable = str(exc)
            raise SpoolError(f"the spend spool cannot open a segment: {exc}") from exc

    # -- segments -------------------------------------------------------------------------------

    def _open_segment(self) -> None:
        """Start the segment the next record goes to, named after that record's seq."""
        path = self._slot.path / f"{self._seq + 1:020d}{OPEN_SUFFIX}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        self._fd = os.open(path, flags, 0o600)
        self._open_path = path
        self._open_bytes = 0
        self._open_records = 0
        self._open_first_at = None

    def _retire_open_segment(self) -> None:
        """Close the open segment for writing; it is sealed by the next `seal`."""
        fd, self._fd = self._fd, -1
        if not self._open_records:
            # Nothing valid in it (at most a torn line): its name is the next segment's.
            os.close(fd)
            self._bytes -= self._open_bytes
            with contextlib.suppress(OSError):
                self._open_path.unlink()
            return
        self._rotated.append(
            Rotated(
                fd,
                self._open_path,
                self._open_bytes,
                self._open_records,
                self._open_first_at,
                self._seq,
            )
        )
        self._open_bytes = 0
        self._open_records = 0
        self._open_first_at = None

    def _rotate(self) -> None:
        if not self._open_records or self._fd < 0:
            return
        self._retire_open_segment()
        try:
            self._open_segment()
        except OSError as exc:
            # The next append tries again; until one succeeds the gateway refuses requests.
            self._unwritable = str(exc)
            log.error("the spend spool cannot open a new segment: %s", exc)

    def _rotate_full(self) -> None:
        self._rotate()
        if self.on_rotate is not None:
            self.on_rotate()

    @property
    def has_rotated(self) -> bool:
        """Segments closed for writing are waiting to be sealed."""
        return bool(self._rotated)

    def seal(self, *, open_segment: bool = True) -> int:
        """Make what was written durable and shippable; the number of segments sealed.

        Without `open_segment`, only the segments already closed for writing (full ones) are
        sealed, and the one being written goes on filling.
        """
        batch = self._take_batch(open_segment)
        if not batch:
            return 0
        try:
            seal_files(self._slot.path, batch)
        except BaseException:
            # Sealing is idempotent: the next `seal` finishes what this one did not.
            self._rotated[:0] = batch
            raise
        return self._register(batch)

    async def seal_async(self, *, open_segment: bool = True) -> int:
        """`seal`, with the fsyncs and renames off the event loop."""
        batch = self._take_batch(open_segment)
        if not batch:
            return 0
        try:
            await off_loop(lambda: seal_files(self._slot.path, batch))
        except BaseException:
            # Sealing is idempotent: the next `seal` finishes what this one did not.
            self._rotated[:0] = batch
            raise
        return self._register(batch)

    def _take_batch(self, open_segment: bool) -> list[Rotated]:
        if open_segment and not self._closed:
            self._rotate()
        batch, self._rotated = self._rotated, []
        return batch

    def _register(self, batch: list[Rotated]) -> int:
        for item in batch:
            self._sealed.append(
                Segment(
                    item.sealed_path,
                    self._replica_id,
                    item.size,
                    item.records,
                    item.first_at,
                    ours=True,
                    slot=self._slot,
                    last_seq=item.last_seq,
                )
            )
        self._slot.pending += len(batch)
        return len(batch)

    # -- shipping -------------------------------------------------------------------------------

    def next_segment(self) -> Segment | None:
        """The oldest sealed segment not already being shipped."""
        for segment in self._sealed:
            if not segment.in_flight:
                return segment
        return None

    def pending_segments(self) -> list[Segment]:
        return list(self._sealed)

    @staticmethod
    def load(segment: Segment) -> LoadedSegment:
        """Read a sealed segment back as a `SpendSegment` body (thread-safe: touches no state)."""
        return _loaded(segment, _lines.scan(segment.path.read_bytes(), decode=not segment.ours))

    @staticmethod
    async def load_async(segment: Segment) -> LoadedSegment:
        """`load` for the event loop: the file is read in a thread, and its lines are checked
        on the loop, `LOAD_LINES_PER_STEP` at a time between requests.

        Checked in a thread instead, they held the GIL for up to Python's switch interval at a
        time while the loop waited for it: that was much of the c=1 p99 (bench/README.md).
        """
        data = await off_loop(segment.path.read_bytes)
        scan = _lines.Scan()
        steps = _lines.scan_in_steps(
            data, scan, decode=not segment.ours, lines_per_step=LOAD_LINES_PER_STEP
        )
        for _ in steps:
            await asyncio.sleep(0)
        return _loaded(segment, scan)

    def acknowledge(self, segment: Segment, loaded: LoadedSegment) -> None:
        """The ledger has the segment: delete it."""
        with contextlib.suppress(FileNotFoundError):
            segment.path.unlink()
        self._forget(segment)
        self.shipped_segments += 1
        self.shipped_records += loaded.records
        self._count_corrupt(segment, loaded)
        if segment.ours and segment.last_seq is not None and self.on_ledgered is not None:
            self.on_ledgered(segment.last_seq)

    def reject(self, segment: Segment, loaded: LoadedSegment | None, reason: str) -> None:
        """Move a segment the control plane will never take aside, for an operator to look at.

        Moving it back into its replica directory makes the next start-up ship it again.
        """
        rejected = segment.slot.path / REJECTED_DIR
        try:
            rejected.mkdir(exist_ok=True)
            segment.path.rename(rejected / segment.path.name)
        except OSError as exc:
            log.error("cannot set aside rejected segment %s: %s", segment.path, exc)
            with contextlib.suppress(FileNotFoundError):
                segment.path.unlink()
        log.error(
            "spend segment %s/%s rejected (%s); kept in %s",
            segment.replica_id,
            segment.segment_id,
            reason,
            rejected,
        )
        self._forget(segment)
        self.rejected_segments += 1
        if loaded is not None:
            self._count_corrupt(segment, loaded)

    def _count_corrupt(self, segment: Segment, loaded: LoadedSegment) -> None:
        if loaded.corrupt:
            log.error(
                "spend segment %s/%s: %d corrupted line(s) skipped",
                segment.replica_id,
                segment.segment_id,
                loaded.corrupt,
            )
            self.corrupt_records += loaded.corrupt

    def _forget(self, segment: Segment) -> None:
        with contextlib.suppress(ValueError):
            self._sealed.remove(segment)
            self._bytes -= segment.size
            slot = segment.slot
            slot.pending -= 1
            if slot is not self._slot and slot.pending <= 0:
                self._release(slot)

    def _drop_oldest(self) -> None:
        dropped = 0
        while self._bytes > self._max_bytes:
            victim = self.next_segment()
            if victim is None:
                break
            records = victim.records
            if records is None:
                records = count_lines(victim.path)
            with contextlib.suppress(FileNotFoundError):
                victim.path.unlink()
            self._forget(victim)
            self.dropped_segments += 1
            self.dropped_records += records
            dropped += records
        if dropped:
            log.warning(
                "spend spool over %d bytes: dropped the oldest %d record(s) (drop_oldest policy)",
                self._max_bytes,
                dropped,
            )

    # -- orphans ----------------------------------------------------------------------------------

    def adopt_orphans(self) -> int:
        """Take the replica directories no live process holds and queue their segments."""
        return self._take_orphans(recover_orphans(self._root, self._held()))

    async def adopt_orphans_async(self) -> int:
        held = self._held()
        found = await off_loop(lambda: recover_orphans(self._root, held))
        return self._take_orphans(found)

    def _held(self) -> frozenset[str]:
        return frozenset({self._slot.path.name, *self._adopted})

    def _take_orphans(self, found: list[tuple[Slot, Recovered]]) -> int:
        adopted = 0
        for slot, recovered in found:
            if self._closed:
                os.close(slot.lock_fd)
                continue
            self._adopted[slot.path.name] = slot
            slot.pending = len(recovered.segments)
            # From a process that is gone: older than anything written here, so shipped first.
            self._sealed.extendleft(reversed(recovered.segments))
            self._bytes += sum(segment.size for segment in recovered.segments)
            self.torn_bytes += recovered.torn_bytes
            adopted += len(recovered.segments)
            log.info(
                "adopted %d spend segment(s) of replica %s, which no process holds",
                len(recovered.segments),
                slot.replica_id,
            )
        self.adopted_segments += adopted
        return adopted

    def _release(self, slot: Slot) -> None:
        self._adopted.pop(slot.path.name, None)
        with contextlib.suppress(OSError):
            os.close(slot.lock_fd)

    # -- metrics ------------------------------------------------------------------------------------

    def stats(self) -> SpoolStats:
        firsts = [s.first_at for s in self._sealed if s.first_at is not None]
        firsts += [r.first_at for r in self._rotated if r.first_at is not None]
        if self._open_records and self._open_first_at is not None:
            firsts.append(self._open_first_at)
        oldest = (self._clock.now() - min(firsts)).total_seconds() if firsts else None
        return SpoolStats(
            replica_id=self._replica_id,
            seq=self._seq,
            bytes=self._bytes,
            segments=len(self._sealed) + len(self._rotated) + (1 if self._open_records else 0),
            oldest_record_age_s=oldest,
            shipped_segments=self.shipped_segments,
            shipped_records=self.shipped_records,
            dropped_segments=self.dropped_segments,
            dropped_records=self.dropped_records,
            refused_when_full=self.refused_when_full,
            corrupt_records=self.corrupt_records,
            torn_bytes=self.torn_bytes,
            rejected_segments=self.rejected_segments,
            adopted_segments=self.adopted_segments,
            full=self.full,
            writable=self.writable,
        )


def _loaded(segment: Segment, scan: _lines.Scan) -> LoadedSegment:
    body = _lines.segment_body(segment.replica_id, segment.segment_id, scan.records)
    bad_tail = 1 if scan.torn else 0
    return LoadedSegment(body, len(scan.records), scan.corrupt + bad_tail)

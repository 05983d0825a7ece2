"""The spool directory on disk: replica directories and their locks, the sequence mark,
sealing, and reading back what a previous process left. The layout is described in `spool`."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import re
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TypeVar

import msgspec

from proxy.spend import _lines

log = logging.getLogger("vkgate.proxy.spend")

T = TypeVar("T")

MAX_SLOTS = 256
REPLICA_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A replica id names a directory and travels in every record: short, and safe as a path."""

OPEN_SUFFIX = ".open"
SEALED_SUFFIX = ".seg"
LOCK_FILE = "lock"
SEQ_FILE = "seq"
REPLICA_ID_FILE = ".replica-id"
REJECTED_DIR = "rejected"
_SEGMENT_NAME = re.compile(r"[0-9]{20}")


class SpoolError(Exception):
    """The spool cannot be opened or cannot write a record."""


@dataclass(eq=False)
class Segment:
    """A sealed segment waiting to be shipped."""

    path: Path
    replica_id: str
    size: int
    records: int | None
    """None until counted (a segment a previous process sealed)."""
    first_at: datetime | None
    ours: bool
    """Written by this process: its lines are trusted once their checksums hold."""
    slot: Slot
    in_flight: bool = False
    last_seq: int | None = None
    """The sequence number of its last record, for a segment this process wrote."""

    @property
    def segment_id(self) -> str:
        return self.path.name.removesuffix(SEALED_SUFFIX)


@dataclass(eq=False)
class Slot:
    """One replica's directory, held by this process through its lock."""

    replica_id: str
    path: Path
    lock_fd: int
    pending: int = 0
    """Segments of this directory not yet shipped (for an adopted one: when to let it go)."""


@dataclass(eq=False)
class Rotated:
    """A segment closed for writing, not yet durable: sealed by the next `seal`."""

    fd: int
    path: Path
    size: int
    records: int
    first_at: datetime | None
    last_seq: int
    renamed: bool = False

    @property
    def sealed_path(self) -> Path:
        return self.path.with_suffix(SEALED_SUFFIX)


@dataclass
class Recovered:
    """What reading back a replica directory found."""

    segments: list[Segment] = field(default_factory=list)
    last_seq: int = 0
    torn_bytes: int = 0
    """Cut off torn tails. (Bad lines in the middle are counted when the segment is shipped.)"""


async def off_loop(work: Callable[[], T]) -> T:
    """Run blocking disk work in a thread; a cancelled caller still waits for it to finish.

    What the work did (fsynced, renamed, locked) cannot be taken back, so the caller must learn
    its result before it stops: otherwise a descriptor could be closed twice.
    """
    future = asyncio.get_running_loop().run_in_executor(None, work)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await future
        raise


def seal_files(directory: Path, batch: list[Rotated]) -> None:
    """fsync each segment, then the high-water mark, then rename; idempotent if retried."""
    for item in batch:
        if item.fd >= 0:
            os.fsync(item.fd)
            os.close(item.fd)
            item.fd = -1
    # The mark is durable before any `.seg` exists: a spool whose segments were all shipped
    # and deleted still knows where its sequence got to.
    _write_seq(directory, max(item.last_seq for item in batch))
    for item in batch:
        if not item.renamed:
            os.rename(item.path, item.sealed_path)
            item.renamed = True
    _fsync_directory(directory)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_seq(directory: Path, seq: int) -> None:
    if seq <= _read_seq(directory, quiet=True):
        return
    temporary = directory / f"{SEQ_FILE}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, b"%d\n" % seq)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(temporary, directory / SEQ_FILE)
    _fsync_directory(directory)


def _read_seq(directory: Path, *, quiet: bool = False) -> int:
    """The high-water mark; -1 when the file is unreadable (then every segment is read)."""
    try:
        text = (directory / SEQ_FILE).read_text()
    except FileNotFoundError:
        return 0
    try:
        return int(text.strip())
    except ValueError:
        if not quiet:
            log.error("spool file %s is unreadable; reading every segment", directory / SEQ_FILE)
        return -1


def stored_replica_id(directory: Path) -> str:
    """The replica id made on the first start in `directory`, made now if there is none."""
    path = directory / REPLICA_ID_FILE
    with contextlib.suppress(FileNotFoundError):
        stored = path.read_text().strip()
        if REPLICA_ID.fullmatch(stored):
            return stored
        raise SpoolError(f"{path} does not hold a replica id; delete it to make a new one")
    # Written aside and linked in: two workers starting together end up with the same id.
    temporary = directory / f"{REPLICA_ID_FILE}.{os.getpid()}.tmp"
    temporary.write_text(secrets.token_hex(8) + "\n")
    try:
        os.link(temporary, path)
    except FileExistsError:
        pass
    finally:
        temporary.unlink()
    _fsync_directory(directory)
    return path.read_text().strip()


def _try_lock(directory: Path) -> int | None:
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.pwrite(fd, b"%d\n" % os.getpid(), 0)
    return fd


def take_slot(root: Path, base: str) -> Slot:
    for n in range(MAX_SLOTS):
        replica_id = base if n == 0 else f"{base}-{n}"
        path = root / replica_id
        path.mkdir(exist_ok=True, mode=0o700)
        fd = _try_lock(path)
        if fd is not None:
            return Slot(replica_id, path, fd)
    raise SpoolError(f"{MAX_SLOTS} processes already write to the spool directory {root}")


def recover_orphans(root: Path, held: frozenset[str]) -> list[tuple[Slot, Recovered]]:
    found: list[tuple[Slot, Recovered]] = []
    for path in sorted(root.iterdir()):
        name = path.name
        if name in held or not REPLICA_ID.fullmatch(name) or not path.is_dir():
            continue
        try:
            if not any(_segment_files(path)):
                continue
            fd = _try_lock(path)
            if fd is None:
                continue  # a live process writes there
            slot = Slot(name, path, fd)
            try:
                recovered = recover(slot)
            except BaseException:
                os.close(fd)
                raise
        except OSError as exc:
            log.error("cannot adopt the spool directory %s: %s", path, exc)
            continue
        if recovered.segments:
            found.append((slot, recovered))
        else:
            os.close(fd)
    return found


def _segment_files(directory: Path) -> Iterator[Path]:
    for path in directory.iterdir():
        if path.suffix in (OPEN_SUFFIX, SEALED_SUFFIX) and _SEGMENT_NAME.fullmatch(path.stem):
            yield path


def recover(slot: Slot) -> Recovered:
    """Read back a replica directory: cut torn tails, seal what was open, find the sequence."""
    directory = slot.path
    result = Recovered()
    with contextlib.suppress(FileNotFoundError):
        (directory / f"{SEQ_FILE}.tmp").unlink()
    mark = _read_seq(directory)
    files = sorted(_segment_files(directory))
    sealed = [path for path in files if path.suffix == SEALED_SUFFIX]
    if mark == 0 and sealed:
        log.error(
            "spool %s has segments but no %s file; reading every segment", directory, SEQ_FILE
        )
        mark = -1
    opened: list[tuple[Path, _lines.Scan]] = []
    for path in files:
        if path.suffix != OPEN_SUFFIX:
            continue
        scan = _recover_open_file(path)
        result.torn_bytes += scan.torn
        if scan.records:
            opened.append((path, scan))
    last_seq = max([mark, *(int(path.stem) for path in sealed)])
    last_seq = max([last_seq, *(scan.last_seq for _, scan in opened)])
    if mark < 0:
        for path in sealed:
            last_seq = max(last_seq, _lines.scan(path.read_bytes(), decode=True).last_seq)
        last_seq = max(last_seq, 0)
    if opened or mark < 0:
        _write_seq(directory, last_seq)
    for path, _scan in opened:
        path.rename(path.with_suffix(SEALED_SUFFIX))
    if opened:
        _fsync_directory(directory)
    first_ats = {path.with_suffix(SEALED_SUFFIX): scan.first_at for path, scan in opened}
    counts = {path.with_suffix(SEALED_SUFFIX): len(scan.records) for path, scan in opened}
    for path in sorted([*sealed, *first_ats]):
        at = first_ats[path] if path in first_ats else _first_at(path)
        result.segments.append(
            Segment(
                path,
                slot.replica_id,
                path.stat().st_size,
                counts.get(path),
                _parse_time(at),
                ours=False,
                slot=slot,
            )
        )
    result.last_seq = last_seq
    if result.segments or result.torn_bytes:
        log.info(
            "spool %s recovered: %d segment(s) to ship, sequence at %d",
            directory,
            len(result.segments),
            last_seq,
        )
    return result


def _recover_open_file(path: Path) -> _lines.Scan:
    data = path.read_bytes()
    scan = _lines.scan(data, decode=True)
    if scan.torn:
        log.warning(
            "spool segment %s: cut off %d byte(s) of a torn last record (never shipped)",
            path,
            scan.torn,
        )
    if scan.corrupt:
        log.error("spool segment %s: %d corrupted line(s), skipped", path, scan.corrupt)
    if not scan.records:
        path.unlink()
        return scan
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        if scan.torn:
            os.ftruncate(fd, scan.good_end)
        os.fsync(fd)
    finally:
        os.close(fd)
    return scan


def _first_at(path: Path) -> str | None:
    """The time of the first good record of a sealed segment (read for the oldest-age metric)."""
    with path.open("rb") as handle:
        for _ in range(64):
            line = handle.readline()
            if not line.endswith(b"\n"):
                return None
            json = _lines.json_of(line[:-1])
            if json is not None:
                with contextlib.suppress(msgspec.DecodeError):
                    return msgspec.json.decode(json, type=_At).at
    return None


class _At(msgspec.Struct):
    at: str


def _parse_time(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0

"""The doctor's checks of the proxy's spend spool: its directory, disk space and backlog."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from vkgate.cli.doctor._result import Result, Status

BACKLOG_SEGMENTS = 100
BACKLOG_AGE_S = 300.0


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.absolute().parents):
        if candidate.exists():
            return candidate
    return Path("/")


def _cannot_look(check: str, root: Path, exc: OSError) -> Result:
    """The FAIL for a spool this user cannot even look at: `exists()` and `is_dir()` raise
    rather than answer False when a parent directory refuses a search (EACCES)."""
    at = f" at {exc.filename}" if exc.filename and str(exc.filename) != str(root) else ""
    return Result(
        check,
        Status.FAIL,
        f"cannot look at {root}: {exc.strerror or exc}{at}",
        f"let the proxy's user (and the user running doctor) search every directory above "
        f"{root}, or point VKGATE_SPOOL_DIR at a directory it can reach",
    )


def check_spool_directory(root: Path) -> Result:
    """The spool exists and takes a file, or its nearest existing parent lets it be created."""
    try:
        return _spool_directory(root)
    except OSError as exc:
        return _cannot_look("spool directory", root, exc)


def _spool_directory(root: Path) -> Result:
    if root.is_dir():
        try:
            with tempfile.NamedTemporaryFile(dir=root, prefix=".vkgate-doctor-"):
                pass
        except OSError as exc:
            return Result(
                "spool directory",
                Status.FAIL,
                f"{root} is not writable ({exc.strerror or exc})",
                f"let the proxy's user write to {root} (chown or chmod), or point "
                "VKGATE_SPOOL_DIR at a directory it can write",
            )
        return Result("spool directory", Status.OK, f"{root} is writable")
    parent = _nearest_existing(root)
    if not parent.is_dir():
        where = "" if parent == root else f"cannot be created: {parent} "
        return Result(
            "spool directory",
            Status.FAIL,
            f"{root} {where}is not a directory",
            "point VKGATE_SPOOL_DIR at a directory the proxy can create or write",
        )
    # Not created here: doctor only looks. The proxy creates it at start-up.
    if not os.access(parent, os.W_OK | os.X_OK):
        return Result(
            "spool directory",
            Status.FAIL,
            f"{root} does not exist and {parent} is not writable",
            f"create {root} for the proxy's user, or point VKGATE_SPOOL_DIR elsewhere",
        )
    return Result(
        "spool directory", Status.OK, f"{root} does not exist yet; the proxy will create it"
    )


@dataclass(frozen=True, slots=True)
class Backlog:
    """Sealed segments waiting to ship (read-only: the spool is never opened or locked)."""

    segments: int = 0
    bytes: int = 0
    oldest_age_s: float | None = None
    rejected: int = 0
    unreadable: str | None = None
    """What could not be read, so the counts above may be short."""


def survey_spool(root: Path, now: float) -> Backlog:
    from proxy.spend._disk import REJECTED_DIR, REPLICA_ID, SEALED_SUFFIX

    segments = size = rejected = 0
    oldest: float | None = None
    unreadable: str | None = None
    try:
        replicas = [p for p in root.iterdir() if REPLICA_ID.fullmatch(p.name) and p.is_dir()]
    except (FileNotFoundError, NotADirectoryError):
        # Nothing can wait there: the spool directory check says what is wrong with it.
        return Backlog()
    except OSError as exc:
        return Backlog(unreadable=_unreadable(root, exc))
    for replica in replicas:
        try:
            files = list(replica.iterdir())
            rejected_dir = replica / REJECTED_DIR
            rejected += len(list(rejected_dir.iterdir())) if rejected_dir.is_dir() else 0
        except OSError as exc:
            unreadable = unreadable or _unreadable(replica, exc)
            continue
        for path in files:
            if path.suffix != SEALED_SUFFIX or not path.stem.isdigit():
                continue
            try:
                info = path.stat()
            except FileNotFoundError:  # shipped and deleted by a running proxy meanwhile
                continue
            except OSError as exc:
                unreadable = unreadable or _unreadable(path, exc)
                continue
            segments += 1
            size += info.st_size
            # Sealed within a flush interval of its last record: its age, near enough.
            oldest = info.st_mtime if oldest is None else min(oldest, info.st_mtime)
    age = None if oldest is None else max(0.0, now - oldest)
    return Backlog(segments, size, age, rejected, unreadable)


def _unreadable(path: Path, exc: OSError) -> str:
    return f"cannot read {path} ({exc.strerror or exc})"


def check_spool_space(root: Path, max_bytes: int, backlog: Backlog) -> Result:
    try:
        free = shutil.disk_usage(_nearest_existing(root)).free
    except OSError as exc:
        return _cannot_look("spool disk space", root, exc)
    room = max(0, max_bytes - backlog.bytes)
    found = f"{_size(free)} free; the spool may grow by {_size(room)} (bound {_size(max_bytes)})"
    if free < room:
        return Result(
            "spool disk space",
            Status.WARN,
            found,
            "free disk space, or lower VKGATE_SPEND_SPOOL_MAX_BYTES to what the disk holds: a "
            "spool that cannot write refuses requests (503 spend_spool_full)",
        )
    return Result("spool disk space", Status.OK, found)


def check_spool_backlog(backlog: Backlog) -> Result:
    if backlog.unreadable:
        # Unknown rather than wrong: the spool directory check fails for a spool out of reach.
        return Result(
            "spool backlog",
            Status.WARN,
            f"{backlog.unreadable}; {backlog.segments} sealed segment(s) seen",
            "let the proxy's user (and the user running doctor) read the spool, or point "
            "VKGATE_SPOOL_DIR at a directory it can reach",
        )
    if not backlog.segments and not backlog.rejected:
        return Result("spool backlog", Status.OK, "no sealed segments waiting to ship")
    age = "" if backlog.oldest_age_s is None else f", oldest {backlog.oldest_age_s:.0f} s"
    found = f"{backlog.segments} sealed segment(s) ({_size(backlog.bytes)}) waiting to ship{age}"
    if backlog.rejected:
        found += f"; {backlog.rejected} refused by the control plane, kept in rejected/"
    late = (backlog.oldest_age_s or 0.0) > BACKLOG_AGE_S
    if backlog.segments > BACKLOG_SEGMENTS or late:
        return Result(
            "spool backlog",
            Status.WARN,
            found,
            "is the control plane reachable from the proxy? see the proxy's `cannot ship spend "
            "segment` log lines and its vkgate_spool_* metrics",
        )
    if backlog.rejected:
        return Result(
            "spool backlog",
            Status.WARN,
            found,
            "see the proxy's log for why they were refused; they are never shipped again",
        )
    return Result("spool backlog", Status.OK, found)


def _size(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"

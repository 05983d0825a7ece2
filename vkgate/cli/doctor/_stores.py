"""The doctor's checks of the stores: the database, the ledger and Redis."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from vkgate.cli.doctor._result import Result, Status, skipped

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from controlplane.settings import LedgerLocation


def check_database(database_url: str, *, timeout_s: float = 5.0) -> Result:
    """Connect, and compare the schema's revision with the newest migration."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError
    from sqlalchemy.pool import NullPool

    from controlplane.db import sync_url
    from controlplane.migrate import schema_state

    try:
        url = make_url(database_url)
    except (ArgumentError, ValueError):
        # Not the parser's message: it may quote the URL, password and all.
        return Result(
            "database",
            Status.FAIL,
            "VKGATE_DATABASE_URL is not a URL this can read",
            "write it as postgresql+psycopg://user:password@host:port/database (percent-encode "
            "any @ : / in the password) or sqlite:///path/to/file.db",
        )
    where = _database_where(url)
    sqlite = url.get_backend_name() == "sqlite"
    file = Path(url.database) if sqlite and url.database and url.database != ":memory:" else None
    try:
        missing = file is not None and not file.exists()
    except OSError as exc:  # EACCES on a parent: `exists()` raises rather than answer
        return Result(
            "database",
            Status.FAIL,
            f"{where}: cannot look at it ({exc.strerror or exc})",
            "let this user reach the file, or run doctor as the control plane's user",
        )
    if missing:
        # Connecting would create an empty file, and then the schema check would blame that.
        return Result(
            "database",
            Status.FAIL,
            f"{where}: no such file",
            "create it with `vkgate migrate` (or start `vkgate up` here)",
        )
    connect_args = {"timeout": timeout_s} if sqlite else {"connect_timeout": max(1, int(timeout_s))}
    try:
        engine = create_engine(
            sync_url(database_url), poolclass=NullPool, connect_args=connect_args
        )
    except (SQLAlchemyError, ImportError, ValueError) as exc:
        # A database driver not installed, or a query option the driver refuses.
        return Result(
            "database",
            Status.FAIL,
            f"{where}: cannot open ({_reason(f'{type(exc).__name__}: {exc}', url.password)})",
            "install vkgate with its database driver (psycopg for PostgreSQL), and check the "
            "options in VKGATE_DATABASE_URL",
        )
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        state = schema_state(database_url)
    except SQLAlchemyError as exc:
        reason = _reason(str(getattr(exc, "orig", None) or exc), url.password)
        return Result(
            "database",
            Status.FAIL,
            f"{where}: cannot connect ({reason})",
            "check that the database is running and reachable from here, and the user, "
            "password and database name in VKGATE_DATABASE_URL",
        )
    finally:
        engine.dispose()
    if state.behind:
        return Result(
            "database",
            Status.FAIL,
            f"{where}: {state.describe()}",
            "run `vkgate migrate` (or start the control plane with --migrate)",
        )
    if not state.usable:
        return Result(
            "database",
            Status.FAIL,
            f"{where}: {state.describe()}",
            "run the release that made this schema, or downgrade the schema with it first",
        )
    if state.newer:
        return Result(
            "database",
            Status.WARN,
            f"{where}: reachable, {state.describe()}",
            "this is expected right after a rollback; upgrade this control plane again (its "
            "`vkgate migrate` has nothing to do) when the newer release is wanted back",
        )
    return Result("database", Status.OK, f"{where}: reachable, {state.describe()}")


def _reason(message: str, password: str | None) -> str:
    """A driver's message, its first line, without the database password in it."""
    line = (message.strip().splitlines() or [""])[0]
    return line.replace(password, "***") if password else line


def _database_where(url: URL) -> str:
    """The dialect and host, never the URL: it may hold a password."""
    backend = url.get_backend_name()
    if backend == "sqlite":
        return f"sqlite file {url.database}" if url.database else "sqlite in memory"
    port = f":{url.port}" if url.port else ""
    return f"{backend} at {url.host or 'the local socket'}{port}"


def check_ledger(location: LedgerLocation, *, controlplane_up: bool) -> Result:
    """Open the ledger and look for migrations not yet applied."""
    from controlplane.ledger.client import LedgerError, require_engine

    try:
        require_engine(location)
    except LedgerError as exc:
        # No chDB to open or migrate it with: the message names both ways out.
        return Result("ledger", Status.FAIL, str(exc))
    if location.kind == "chdb" and controlplane_up:
        # chDB is embedded: the running control plane holds its directory, and opening it
        # here as well could fail or disturb it.
        return skipped(
            "ledger",
            f"checked through the control plane's /readyz (embedded chDB at {location.display} "
            "opens in one process at a time)",
        )
    try:
        present = location.kind == "chdb" and location.path is not None and location.path.is_dir()
    except OSError as exc:  # EACCES on a parent: `is_dir()` raises rather than answer
        return Result(
            "ledger",
            Status.FAIL,
            f"cannot look at {location.display} ({exc.strerror or exc})",
            f"let this user reach {location.display}, or run doctor as the control plane's user",
        )
    if location.kind == "chdb" and not present:
        return Result(
            "ledger",
            Status.FAIL,
            f"no embedded ledger at {location.display}",
            "create it with `vkgate migrate` (or start `vkgate up` here)",
        )
    holder = _chdb_holder(location.path) if location.kind == "chdb" else None
    if holder is not None:
        return skipped(
            "ledger",
            f"process {holder} has the embedded ledger at {location.display} open (a control "
            "plane this check could not reach?); chDB opens in one process at a time",
        )
    from clickhouse_connect.driver.exceptions import Error

    from controlplane.ledger.client import LedgerError, connect
    from controlplane.ledger.migrate import pending

    reachable = (
        "stop the process that has this chDB directory open, or point VKGATE_LEDGER_URL elsewhere"
        if location.kind == "chdb"
        else "check that the ClickHouse server is running and reachable from here, and the "
        "user and password in VKGATE_LEDGER_URL"
    )
    try:
        client = connect(location)
    except LedgerError as exc:
        return Result("ledger", Status.FAIL, str(exc), reachable)
    try:
        client.command("SELECT 1")
        waiting = pending(client)
    except (Error, LedgerError) as exc:
        line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return Result("ledger", Status.FAIL, f"{location.display}: {line}", reachable)
    finally:
        client.close()
    if waiting:
        names = ", ".join(m.name for m in waiting)
        return Result(
            "ledger",
            Status.FAIL,
            f"{location.display}: {len(waiting)} migration(s) not applied ({names})",
            "run `vkgate migrate` (or start the control plane with --migrate)",
        )
    return Result("ledger", Status.OK, f"{location.display}: reachable, schema current")


def _chdb_holder(directory: Path | None) -> int | None:
    """The live process that has this chDB directory open, from the pid chDB writes into its
    `status` file (opening the directory here would only fail, noisily, on chDB's lock)."""
    if directory is None:
        return None
    try:
        text = (directory / "status").read_text()
    except (OSError, UnicodeDecodeError):
        return None
    found = re.search(r"^PID: (\d+)$", text, re.MULTILINE)
    if found is None or int(found.group(1)) == os.getpid():
        return None
    pid = int(found.group(1))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None  # left behind by a process that has gone
    except PermissionError:
        return pid  # alive, another user's
    return pid


def check_redis(url: str | None, *, timeout_s: float = 1.0) -> Result:
    if url is None:
        return skipped(
            "redis", "VKGATE_REDIS_URL is not set (each proxy process keeps its own counters)"
        )
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    parts = urlsplit(url)
    where = (
        f"redis at unix socket {parts.path}"
        if parts.scheme == "unix"
        else f"redis{' (TLS)' if parts.scheme == 'rediss' else ''} at "
        f"{parts.hostname}:{parts.port or 6379}"
    )
    # No retries: one unanswered PING within the timeout is the answer.
    client = redis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        client.ping()
    except (redis.RedisError, OSError, ValueError) as exc:
        reason = str(exc) or type(exc).__name__
        if parts.password:
            reason = reason.replace(parts.password, "***")
        return Result(
            "redis",
            Status.FAIL,
            f"{where}: no answer to PING ({reason})",
            "check that Redis is running and reachable from here, and the password in "
            "VKGATE_REDIS_URL; meanwhile each proxy falls back to its own counters",
        )
    finally:
        client.close()
    return Result("redis", Status.OK, f"{where} answered PING")

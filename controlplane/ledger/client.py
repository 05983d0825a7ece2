"""Opening a clickhouse-connect client on the ledger, and the one place its errors are mapped.

chDB is an embedded engine with process-wide state: every client of a process shares the one
engine, which can be open on one directory at a time. Its clients are therefore serialised by a
single process-wide lock, and opening a second directory is refused with a message naming
VKGATE_LEDGER_URL instead of chDB's own.

chDB itself is optional (the `embedded` extra): a production install talks to a ClickHouse
server and leaves it out, so a `chdb://` ledger without it is refused by name before anything
tries to load it.
"""

from __future__ import annotations

import importlib.util
import threading
from typing import Any

from controlplane.settings import LedgerLocation

CHDB_LOCK = threading.Lock()
"""Held around every call into embedded chDB, by every ledger of the process."""


class LedgerError(Exception):
    """The ledger could not be reached or refused a statement; the message says which.

    `cause` is a short name for logs, metrics and readiness answers (the exception class of the
    client, or `closed`): unlike the message it names no host.
    """

    def __init__(self, message: str, *, cause: str = "error") -> None:
        super().__init__(message)
        self.cause = cause


EMBEDDED_EXTRA = "vkgate[embedded]"


def require_engine(location: LedgerLocation) -> None:
    """Refuse an embedded ledger when chDB is not installed, naming the setting and the fix."""
    if location.kind != "chdb" or _chdb_installed():
        return
    raise LedgerError(
        f"{location.display} is an embedded chDB ledger, but chDB is not installed: point "
        "VKGATE_LEDGER_URL at a ClickHouse server (http(s)://host:8123/database), or "
        f"install chDB with `pip install '{EMBEDDED_EXTRA}'` (without VKGATE_LEDGER_URL the "
        "ledger is chdb://$VKGATE_HOME/ledger)",
        cause="chdb_missing",
    )


def _chdb_installed() -> bool:
    # find_spec, not import: loading chDB maps a large native library into the process.
    try:
        return importlib.util.find_spec("chdb") is not None
    except (ImportError, ValueError):
        return False


def connect(
    location: LedgerLocation, *, create_database: bool = False, timeout_s: float | None = None
) -> Any:
    """A client whose default database is the ledger's (created first when asked to).

    `timeout_s` bounds each connection attempt and answer of a server ledger, with no retries:
    for checks that must not hold a start-up for minutes (the client's defaults allow 10 s to
    connect, 300 s to answer, and two retries)."""
    import clickhouse_connect
    from clickhouse_connect.driver.exceptions import Error

    require_engine(location)
    bounded: dict[str, Any] = {}
    if timeout_s is not None:
        bounded = {
            "connect_timeout": timeout_s,
            "send_receive_timeout": timeout_s,
            "query_retries": 0,
        }
    try:
        if location.kind == "chdb":
            client = clickhouse_connect.get_client(
                interface="chdb", path=str(location.path), tz_mode="aware"
            )
        else:
            client = clickhouse_connect.get_client(
                interface="https" if location.secure else "http",
                host=location.host,
                port=location.port,
                username=location.username or "default",
                password=location.password or "",
                tz_mode="aware",
                # The insert of a segment is one statement; one block keeps it all-or-nothing.
                settings={"max_insert_block_size": 2_000_000},
                **bounded,
            )
    except Error as exc:
        raise LedgerError(_opening_message(location, exc), cause=type(exc).__name__) from None
    try:
        if create_database:
            client.command(f"CREATE DATABASE IF NOT EXISTS {location.database}")
        exists = str(client.command(f"EXISTS DATABASE {location.database}")) == "1"
    except Error as exc:
        client.close()
        raise LedgerError(
            f"the ledger at {location.display} cannot be used: {_first_line(exc)}",
            cause=type(exc).__name__,
        ) from None
    if not exists:
        client.close()
        raise LedgerError(
            f"the ledger at {location.display} has no database {location.database!r}; "
            "create it with `vkgate migrate`",
            cause="no_database",
        )
    client.database = location.database
    return client


def _opening_message(location: LedgerLocation, exc: Exception) -> str:
    text = _first_line(exc)
    if location.kind == "chdb" and "already initialized with path" in text:
        return (
            f"cannot open the ledger at {location.display}: chDB is embedded, one ledger "
            f"directory per process, and this process already has another open ({text})"
        )
    return f"cannot open the ledger named by VKGATE_LEDGER_URL ({location.display}): {text}"


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

"""`Ledger`: the spend ledger as the control plane's handlers use it, from the event loop.

clickhouse-connect is synchronous, so every call runs on this ledger's one worker thread (never
on the event loop) and holds a lock while it talks to the store: the process-wide chDB lock
for embedded chDB (see client.py), a lock of its own for a ClickHouse server. The client is
opened on first use, so an app that never touches spend never opens the ledger.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import msgspec

from controlplane.ledger import queries, spend_sums
from controlplane.ledger.client import CHDB_LOCK, LedgerError, connect, require_engine
from controlplane.ledger.rows import (
    ADMIT_COLUMNS,
    LEDGER_COLUMNS,
    Entry,
    PricedEntry,
    admit_row,
    ledger_row,
)
from controlplane.settings import LedgerLocation

T = TypeVar("T")
SINCE_TTL_S = 60.0
"""How long a reading of when the daily sums began is used before it is read again."""
LEDGER_TABLE = "ledger_rows"
ADMIT_TABLE = "ledger_admits"


@dataclass(frozen=True, slots=True)
class SpendReading:
    nanos: tuple[int, ...]
    """Nano-USD spent under each filter, in order (one tuple for every caller of a shared
    read, so none can change another's)."""
    as_of: datetime
    """No later than the read began: what the ledger held by then is counted."""


@dataclass(frozen=True, slots=True)
class Written:
    """What one write added, and what the ledger already held."""

    rows: list[PricedEntry]
    duplicate_rows: list[PricedEntry]
    admits: int
    duplicate_admits: int


class Ledger:
    def __init__(
        self, location: LedgerLocation, *, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        # At construction, so an app built on an embedded ledger without chDB fails at start-up
        # rather than on its first readiness probe.
        require_engine(location)
        self.location = location
        self._client: Any = None
        self._lock = CHDB_LOCK if location.kind == "chdb" else threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vkgate-ledger")
        self._closed = False
        self._ping: asyncio.Future[None] | None = None
        self._spend_reads: dict[tuple[str, tuple[queries.SpendFilter, ...]], _SharedRead] = {}
        self._writes: list[_Write] = []
        """Writes waiting for the one under way (`_writer`) to end."""
        self._writer: asyncio.Future[None] | None = None
        self._monotonic = monotonic
        self._since_read: tuple[datetime, float] | None = None
        """When the daily sums began, and when that was read (on the ledger's thread only)."""

    async def _run(self, work: Callable[[Any], T]) -> T:
        if self._closed:
            raise LedgerError("the ledger is closed", cause="closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._locked, work)

    def _locked(self, work: Callable[[Any], T]) -> T:
        from clickhouse_connect.driver.exceptions import Error

        with self._lock:
            if self._client is None:
                self._client = connect(self.location)
            try:
                return work(self._client)
            except Error as exc:
                raise LedgerError(
                    f"the ledger at {self.location.display} failed: {_first_line(exc)}",
                    cause=type(exc).__name__,
                ) from None

    async def close(self) -> None:
        """Close the client, if it was ever opened, on the thread that used it."""
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._disconnect)
        finally:
            self._executor.shutdown(wait=True)

    def _disconnect(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    async def ping(self) -> None:
        """Return once the ledger answers a trivial query; LedgerError when it cannot.

        Readiness probes call this every few seconds: one ping at a time is in the worker's
        queue, later callers wait on it, so a hung ledger does not pile probes up behind it.
        """
        if self._ping is None or self._ping.done():
            self._ping = asyncio.ensure_future(self._run(_select_one))
            # Retrieved here too, for a ping whose callers all gave up waiting.
            self._ping.add_done_callback(_consume)
        await asyncio.shield(self._ping)

    async def write(
        self, priced: Sequence[PricedEntry], admits: Sequence[Entry], ingested_at: datetime
    ) -> Written:
        """Insert the rows and admits whose ids the ledger does not hold yet.

        Writes asked for while another is under way wait for it, then go together as one:
        one lookup and one insert per table however many segments they carry, since each
        statement costs chDB 3-15 ms however few its rows, and every worker of every replica
        ships a segment a second. Each caller still learns what its own write added. A record
        in two of them is added for the first and found held by the second, as if the second
        had come one write later; a failure fails them all, so each is shipped again.
        """
        waiting = _Write(priced, admits, ingested_at, asyncio.get_running_loop().create_future())
        # Retrieved here too, for a write whose caller gave up waiting.
        waiting.written.add_done_callback(_consume)
        self._writes.append(waiting)
        if self._writer is None:
            self._writer = asyncio.ensure_future(self._write_waiting())
        return await asyncio.shield(waiting.written)

    async def _write_waiting(self) -> None:
        try:
            while self._writes:
                batch, self._writes = self._writes, []
                try:
                    results = await self._run(functools.partial(_write_together, batch=batch))
                except Exception as exc:
                    for waiting in batch:
                        waiting.written.set_exception(exc)
                except BaseException:
                    for waiting in batch:
                        waiting.written.cancel()
                    raise
                else:
                    for waiting, written in zip(batch, results, strict=True):
                        waiting.written.set_result(written)
        finally:
            self._writer = None

    async def spend(
        self, organization_id: str, filters: Sequence[queries.SpendFilter], as_of: datetime
    ) -> SpendReading:
        """Nano-USD spent under each filter, read no earlier than `as_of`.

        A read asked while the same one is under way shares it: a spend announcement has every
        proxy fetch its bundle at once, and each fetch would otherwise queue a read of its own
        behind the others on the ledger's one thread. The shared reading's `as_of` is the
        earlier of the two moments, so it never claims spend it may not hold.
        """
        if not filters:
            return SpendReading((), as_of)
        key = (organization_id, tuple(filters))
        shared = self._spend_reads.get(key)
        if shared is None:
            shared = self._spend_reads[key] = _SharedRead(
                asyncio.ensure_future(self._read_spend(organization_id, filters)), as_of
            )
            shared.future.add_done_callback(lambda _: self._spend_reads.pop(key, None))
            # Retrieved here too, for a read whose callers all gave up waiting.
            shared.future.add_done_callback(_consume)
        nanos = await asyncio.shield(shared.future)
        return SpendReading(nanos, min(as_of, shared.as_of))

    async def _read_spend(
        self, organization_id: str, filters: Sequence[queries.SpendFilter]
    ) -> tuple[int, ...]:
        def work(client: Any) -> tuple[int, ...]:
            query = queries.spend(organization_id, filters, self._since(client))
            result = client.query(query.sql, parameters=query.parameters)
            return tuple(int(v or 0) for v in result.result_rows[0])

        return await self._run(work)

    async def spend_across(
        self, filters: Sequence[tuple[str, queries.SpendFilter]]
    ) -> tuple[int, ...]:
        """Nano-USD spent under each (organization, filter), in one read: the console's lists
        of budgets of many organizations, grouped so that hundreds cost about what a few do."""
        if not filters:
            return ()

        def work(client: Any) -> tuple[int, ...]:
            grouped = spend_sums.spend_grouped(filters, self._since(client))
            result = client.query(grouped.query.sql, parameters=grouped.query.parameters)
            return grouped.nanos(result.result_rows)

        return await self._run(work)

    def _since(self, client: Any) -> datetime:
        """When the daily sums began (see `queries.spend`), read again every `SINCE_TTL_S`.

        Written once, by the migration that made the sums, so it does not move; it is read
        again all the same, for a ledger made anew under a running control plane."""
        now = self._monotonic()
        if self._since_read is None or now - self._since_read[1] >= SINCE_TTL_S:
            since = client.query(f"SELECT {queries.SINCE}").result_rows[0][0]
            self._since_read = (since, now)
        return self._since_read[0]

    async def report(
        self,
        period: queries.Period,
        group_by: Sequence[str],
        measures: Sequence[str] | None = None,
    ) -> list[dict[str, Any]]:
        named = await self._named(queries.report(period, group_by, measures))
        prefix = queries.MEASURE_PREFIX
        return [{k.removeprefix(prefix): v for k, v in row.items()} for row in named]

    async def rows(
        self, period: queries.Period, after: tuple[datetime, str] | None, limit: int
    ) -> list[dict[str, Any]]:
        return await self._named(queries.rows(period, after, limit))

    async def overview(
        self,
        organizations: Sequence[str] | None,
        month_start: datetime,
        day_start: datetime,
        top_keys: int,
    ) -> list[dict[str, Any]]:
        """The web console's overview sums (see `queries.overview`)."""
        return await self._named(queries.overview(organizations, month_start, day_start, top_keys))

    async def unfinished(self, start: datetime, end: datetime) -> list[dict[str, Any]]:
        """Admits in [start, end) with no outcome: requests a proxy never finished."""
        return await self._named(queries.unfinished(start, end))

    async def _named(self, query: queries.Query) -> list[dict[str, Any]]:
        def work(client: Any) -> list[dict[str, Any]]:
            result = client.query(query.sql, parameters=query.parameters)
            return list(result.named_results())

        return await self._run(work)


@dataclass(frozen=True, slots=True)
class _Write:
    priced: Sequence[PricedEntry]
    admits: Sequence[Entry]
    ingested_at: datetime
    written: asyncio.Future[Written]


_INSERT_FORMAT = "JSONCompactEachRow"
_INSERT_SETTINGS = {
    # `at` and `ingested_at` go as msgspec writes a datetime: RFC 3339 in UTC, `Z` and all.
    "date_time_input_format": "best_effort",
    # Parsed in one piece, so an insert is one block: all of it is written, or none.
    "input_format_parallel_parsing": 0,
}
_encode_row = msgspec.json.Encoder().encode


def _insert(client: Any, table: str, columns: Sequence[str], rows: list[list[Any]]) -> None:
    """The rows as JSON, one array a line, encoded in C by msgspec and parsed by the ledger.

    clickhouse-connect's own insert turns the rows into ClickHouse's Native format in Python,
    and asks the ledger for the table's column types first: an insert of 6,000 ledger rows took
    31-34 ms of CPU on embedded chDB that way, 25-26 ms this way, and nothing is kept between
    inserts that a table changed under a running control plane could make stale.
    """
    block = b"\n".join(map(_encode_row, rows))
    client.raw_insert(
        table, list(columns), insert_block=block, fmt=_INSERT_FORMAT, settings=_INSERT_SETTINGS
    )


def _write_together(client: Any, batch: Sequence[_Write]) -> list[Written]:
    """One lookup and one insert per table for every write of `batch`; what each added."""
    present = _present(
        client, LEDGER_TABLE, [p.entry for w in batch for p in w.priced], by_organization=True
    )
    seen = _present(
        client, ADMIT_TABLE, [a for w in batch for a in w.admits], by_organization=False
    )
    rows: list[list[Any]] = []
    admit_rows: list[list[Any]] = []
    results: list[Written] = []
    for w in batch:
        new: list[PricedEntry] = []
        held: list[PricedEntry] = []
        for p in w.priced:
            (held if p.entry.record.id in present else new).append(p)
        fresh = [a for a in w.admits if a.record.id not in seen]
        # A later write of the batch finds these held, as it would one write later.
        present.update(p.entry.record.id for p in new)
        seen.update(a.record.id for a in fresh)
        ingested_at = w.ingested_at.astimezone(UTC)
        rows += [ledger_row(p, ingested_at) for p in new]
        admit_rows += [admit_row(a, ingested_at) for a in fresh]
        results.append(Written(new, held, len(fresh), len(w.admits) - len(fresh)))
    if rows:
        _insert(client, LEDGER_TABLE, LEDGER_COLUMNS, rows)
    if admit_rows:
        _insert(client, ADMIT_TABLE, ADMIT_COLUMNS, admit_rows)
    return results


@dataclass(frozen=True, slots=True)
class _SharedRead:
    future: asyncio.Future[tuple[int, ...]]
    as_of: datetime
    """The moment its first caller took before asking."""


def _present(
    client: Any, table: str, entries: Sequence[Entry], *, by_organization: bool
) -> set[str]:
    """Ids of `entries` that `table` holds already (and perhaps ids of other records, which
    the callers never ask about), in one query."""
    if not entries:
        return set()
    by_replica: dict[str, list[Entry]] = defaultdict(list)
    for e in entries:
        by_replica[e.record.replica_id].append(e)
    ranges = [
        queries.ReplicaRange(
            replica_id,
            (min(e.record.seq for e in group), max(e.record.seq for e in group)),
            (min(e.at for e in group), max(e.at for e in group)),
        )
        for replica_id, group in by_replica.items()
    ]
    organizations = [e.organization_id for e in entries] if by_organization else None
    query = queries.stored_ids(table, ranges, organizations)
    rows = client.query(query.sql, parameters=query.parameters).result_rows
    return {str(row[0]) for row in rows}


def _select_one(client: Any) -> None:
    client.command("SELECT 1")


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

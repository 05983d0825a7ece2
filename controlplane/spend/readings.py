"""The last spend the ledger gave for each budget, kept in the database: while the ledger
cannot be read, a key's bundle carries these figures and says how old they are, so a key with
budgets still resolves on a proxy that never cached it.

A reading is written when a budget is first read by this process, when its window has moved
on, and otherwise at most once a `SAVE_EVERY_S`: the figures a bundle falls back on are then at
most that much older than the last read, and the reads that every resolution and refresh make
cost no write each.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import msgspec
from cachetools import LRUCache
from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as postgres_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from controlplane.db import Database
from controlplane.models import BudgetSpendReading
from vkgate.clock import rfc3339
from vkgate.money import nanos_to_usd, usd_to_nanos
from vkgate.wire import BudgetState, ConfigBundle

SAVE_EVERY_S = 60.0
MEMORY = 100_000
"""Budgets whose last save this process remembers (an evicted one is saved at its next read)."""
LAST_READING = "last_reading"
"""`BudgetState.spent_from` of a figure from here rather than from the ledger."""


def _counted(state: BudgetState) -> bool:
    # A per-end-user budget's figure is per end user, read apart (`budget-bucket-spend`).
    return not (state.scope_kind == "end_user" and state.scope_id is None)


class SpendReadings:
    """Saves what the ledger said of each budget, and gives it back when the ledger is away."""

    def __init__(self, db: Database, monotonic: Callable[[], float]) -> None:
        self._db = db
        self._monotonic = monotonic
        self._saved: LRUCache[str, tuple[str | None, float]] = LRUCache(MEMORY)
        """budget id -> (the window saved, when)."""

    async def remember(self, counted: ConfigBundle, as_of: datetime) -> None:
        """Save the readings of `counted` (a bundle whose spend the ledger just gave) that are
        new, of a new window, or last saved over `SAVE_EVERY_S` ago."""
        now = self._monotonic()
        due = [state for state in counted.budgets if _counted(state) and self._due(state, now)]
        if not due:
            return
        postgres = self._db.engine.dialect.name == "postgresql"
        insert = postgres_insert if postgres else sqlite_insert
        async with self._db.transaction() as session:
            for state in due:
                values = {
                    "budget_id": state.budget_id,
                    "window_start": _moment(state.window_start),
                    "spent_nano_usd": usd_to_nanos(state.spent_usd),
                    "read_at": as_of,
                }
                statement = insert(BudgetSpendReading).values(values)
                await session.execute(
                    statement.on_conflict_do_update(
                        index_elements=[BudgetSpendReading.budget_id],
                        set_={k: v for k, v in values.items() if k != "budget_id"},
                    )
                )
        for state in due:
            self._saved[state.budget_id] = (state.window_start, now)

    def _due(self, state: BudgetState, now: float) -> bool:
        saved = self._saved.get(state.budget_id)
        return saved is None or saved[0] != state.window_start or now - saved[1] >= SAVE_EVERY_S

    async def last(self, bundle: ConfigBundle) -> ConfigBundle | None:
        """`bundle` with each budget's last saved figure and its age (`spent_as_of`), or None
        when a budget has none (never read since it was made)."""
        counted = [state for state in bundle.budgets if _counted(state)]
        if not counted:
            return bundle
        async with self._db.transaction() as session:
            rows = await session.scalars(
                select(BudgetSpendReading).where(
                    BudgetSpendReading.budget_id.in_([s.budget_id for s in counted])
                )
            )
            stored = {row.budget_id: row for row in rows}
        states: list[BudgetState] = []
        for state in bundle.budgets:
            if not _counted(state):
                states.append(state)
                continue
            reading = stored.get(state.budget_id)
            if reading is None:
                return None
            states.append(_from_reading(state, reading))
        return msgspec.structs.replace(bundle, budgets=states)


def _from_reading(state: BudgetState, reading: BudgetSpendReading) -> BudgetState:
    if reading.window_start != _moment(state.window_start):
        # The window moved on since: nothing is known of its spend but that it started at 0
        # then (the proxies count what they settled since).
        return msgspec.structs.replace(
            state, spent_usd="0", spent_as_of=state.window_start, spent_from=LAST_READING
        )
    return msgspec.structs.replace(
        state,
        spent_usd=nanos_to_usd(reading.spent_nano_usd),
        spent_as_of=rfc3339(reading.read_at),
        spent_from=LAST_READING,
    )


def _moment(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None

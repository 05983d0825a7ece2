"""Spend: a segment into the ledger (priced, idempotent, budgets announced); spend read back."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.db import Database
from controlplane.errors import invalid, not_found
from controlplane.feed.service import FeedNotifier
from controlplane.ledger.client import LedgerError
from controlplane.ledger.rows import Entry, PricedEntry
from controlplane.ledger.store import Ledger
from controlplane.metrics import Metrics
from controlplane.models import Budget, Provider
from controlplane.spend import budgets
from controlplane.spend.pricing import Pricer, ProviderPricing
from controlplane.spend.segments import CheckedSegment
from controlplane.state import Tx
from vkgate.clock import Clock, rfc3339
from vkgate.logs import event
from vkgate.money import nanos_to_usd
from vkgate.spend import BudgetBucketSpend, SpendAck
from vkgate.wire import SPEND_MOVED, BudgetState, ConfigBundle, EventKind

log = logging.getLogger("vkgate.controlplane.spend")


async def ingest(
    checked: CheckedSegment,
    *,
    db: Database,
    ledger: Ledger,
    pricer: Pricer,
    clock: Clock,
    notifier: FeedNotifier,
    metrics: Metrics | None = None,
) -> SpendAck:
    """Price the segment's outcomes, write what the ledger lacks, announce budgets it moved.

    Written before announced: a proxy that refetches a budget on its event must find the new
    spend there. A crash between the two leaves rows whose events were never sent, so a
    segment shipped again re-announces the budgets of its records already in the ledger.
    The ledger write is timed into `metrics` when given (benchmarks run without).
    """
    # Durations for logs and metrics, not for logic: real time, whatever the clock says.
    began = time.perf_counter()
    async with db.transaction() as session:
        providers = await _pricing_of(session, {e.record.provider_id for e in checked.outcomes})
    priced = await asyncio.to_thread(_price, pricer, checked.outcomes, providers)
    writing = time.perf_counter()
    try:
        written = await ledger.write(priced, checked.admits, clock.now())
    except LedgerError as exc:
        event(
            log,
            "ledger_write_failed",
            level=logging.ERROR,
            segment=checked.segment_id,
            records=len(priced) + len(checked.admits),
            cause=exc.cause,
        )
        raise
    finally:
        if metrics is not None:
            metrics.ledger_write.observe(time.perf_counter() - writing)
    moved = [p for p in (*written.rows, *written.duplicate_rows) if p.price.cost_nano_usd > 0]
    if moved:
        async with db.transaction() as session:
            announced = await _announce(Tx(session, clock, ""), moved)
        if announced:
            notifier.notify()
    ack = SpendAck(
        segment_id=checked.segment_id,
        accepted=len(written.rows) + written.admits,
        duplicates=len(written.duplicate_rows) + written.duplicate_admits + checked.repeated,
    )
    event(
        log,
        "spend_ingested",
        segment=ack.segment_id,
        records=len(checked.outcomes) + len(checked.admits) + checked.repeated,
        ingested=ack.accepted,
        duplicates=ack.duplicates,
        duration_ms=round((time.perf_counter() - began) * 1000, 3),
    )
    return ack


async def _pricing_of(session: AsyncSession, ids: set[str | None]) -> dict[str, ProviderPricing]:
    wanted = sorted(i for i in ids if i)
    if not wanted:
        return {}
    rows = await session.scalars(select(Provider).where(Provider.id.in_(wanted)))
    return {
        row.id: ProviderPricing(
            kind=row.kind, overrides=row.price_overrides, version=rfc3339(row.updated_at)
        )
        for row in rows
    }


def _price(
    pricer: Pricer, outcomes: Sequence[Entry], providers: dict[str, ProviderPricing]
) -> list[PricedEntry]:
    return [
        PricedEntry(e, pricer.price(e.record, e.at, providers.get(e.record.provider_id or "")))
        for e in outcomes
    ]


async def _announce(tx: Tx, moved: Sequence[PricedEntry]) -> int:
    """One BUDGET_UPDATED per budget that counts any of the rows; how many were appended."""
    by_org: dict[str, list[PricedEntry]] = defaultdict(list)
    for p in moved:
        if p.entry.organization_id:
            by_org[p.entry.organization_id].append(p)
    if not by_org:
        return 0
    rows = await tx.session.scalars(
        select(Budget).where(Budget.organization_id.in_(sorted(by_org))).order_by(Budget.id)
    )
    appended = 0
    for budget in rows:
        if any(
            budgets.touches(
                scope_kind=budget.scope_kind,
                scope_id=budget.scope_id,
                provider_id=budget.provider_id,
                record=p.entry.record,
            )
            for p in by_org[budget.organization_id]
        ):
            await tx.event(
                EventKind.BUDGET_UPDATED,
                organization_id=budget.organization_id,
                entity_kind=SPEND_MOVED,
                entity_id=budget.id,
            )
            appended += 1
    return appended


async def with_spend(
    ledger: Ledger, bundle: ConfigBundle, now: datetime
) -> tuple[ConfigBundle, datetime]:
    """The bundle with each budget's spend in its current window, read in one ledger query,
    and the moment that spend was read as of (`now`, or earlier for a read shared with an
    earlier caller: see `Ledger.spend`).

    A per-end-user budget (end_user scope without an id) has one bucket per end user: its
    `spent_usd` stays 0 here, and the proxy asks `budget-bucket-spend` for the bucket it needs.
    """
    counted = [
        (i, state)
        for i, state in enumerate(bundle.budgets)
        if not (state.scope_kind == "end_user" and state.scope_id is None)
    ]
    if not counted:
        return bundle, now
    filters = [
        budgets.spend_filter(
            scope_kind=state.scope_kind,
            scope_id=state.scope_id,
            provider_id=state.provider_id,
            window=state.window,
            now=now,
        )
        for _, state in counted
    ]
    reading = await ledger.spend(bundle.organization_id, filters, now)
    states: list[BudgetState] = list(bundle.budgets)
    for (i, state), nanos in zip(counted, reading.nanos, strict=True):
        states[i] = msgspec.structs.replace(state, spent_usd=nanos_to_usd(nanos))
    return msgspec.structs.replace(bundle, budgets=states), reading.as_of


def read_at(bundle: ConfigBundle, moment: datetime) -> ConfigBundle:
    """The bundle with each budget's `spent_as_of`: its spend was read from the ledger no
    earlier than `moment` (taken before the read), so spend the ledger acknowledged before
    then is in it."""
    stamp = rfc3339(moment)
    states = [msgspec.structs.replace(s, spent_as_of=stamp) for s in bundle.budgets]
    return msgspec.structs.replace(bundle, budgets=states)


async def bucket_spend(
    *, db: Database, ledger: Ledger, clock: Clock, budget_id: str, end_user: str
) -> BudgetBucketSpend:
    """One end user's spend in the current window of a per-end-user budget."""
    if not end_user:
        raise invalid("end_user must not be empty", param="end_user")
    async with db.transaction() as session:
        budget = await session.get(Budget, budget_id)
    if budget is None:
        raise not_found("budget", budget_id, param="budget_id")
    if budget.scope_kind != "end_user":
        raise invalid(
            f"budget {budget_id!r} is a {budget.scope_kind} budget; buckets are per end user",
            param="budget_id",
        )
    if budget.scope_id is not None and budget.scope_id != end_user:
        raise invalid(
            f"budget {budget_id!r} is the budget of end user {budget.scope_id!r} alone",
            param="end_user",
        )
    # Taken before the ledger is read: what the ledger acknowledged before then is counted.
    now = clock.now()
    wanted = budgets.spend_filter(
        scope_kind=budget.scope_kind,
        scope_id=budget.scope_id,
        provider_id=budget.provider_id,
        window=budget.window,
        now=now,
        end_user=end_user,
    )
    reading = await ledger.spend(budget.organization_id, [wanted], now)
    (nanos,) = reading.nanos
    return BudgetBucketSpend(
        budget_id=budget.id,
        end_user=end_user,
        spent_usd=nanos_to_usd(nanos),
        window_start=rfc3339(wanted.start) if wanted.start else None,
        as_of=rfc3339(reading.as_of),
        window_end=rfc3339(wanted.end) if wanted.end else None,
    )

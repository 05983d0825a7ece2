"""Budgets as the console shows them: spent and left in the current window, the day-by-day
burn-down, and when the limit is reached at the current pace.

Spend comes from the same ledger reads a key's bundle gets (`Ledger.spend` with the budget's
own filter), so the page and the proxies agree on what a budget has spent."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from controlplane.ledger.queries import SpendFilter
from controlplane.ledger.store import Ledger
from controlplane.models import Budget
from controlplane.spend.budgets import spend_filter
from vkgate.money import nanos_to_usd

MAX_DAYS = 62
"""A `total` budget's chart shows at most this many days; what came before is its start."""


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    budget: Budget
    window_start: datetime | None
    window_end: datetime | None
    spent_nano_usd: int | None
    """None for a per-end-user budget: each end user has a bucket of their own."""

    @property
    def limit_usd(self) -> str:
        return nanos_to_usd(self.budget.limit_nano_usd)

    @property
    def spent_usd(self) -> str:
        return nanos_to_usd(self.spent_nano_usd or 0)

    @property
    def left_usd(self) -> str:
        return nanos_to_usd(max(0, self.budget.limit_nano_usd - (self.spent_nano_usd or 0)))

    @property
    def fraction(self) -> float:
        """For drawing only; the figures shown are the exact strings above."""
        if not self.budget.limit_nano_usd:
            return 1.0
        return (self.spent_nano_usd or 0) / self.budget.limit_nano_usd

    @property
    def per_end_user(self) -> bool:
        return self.budget.scope_kind == "end_user" and self.budget.scope_id is None


def _filter(budget: Budget, now: datetime) -> SpendFilter:
    return spend_filter(
        scope_kind=budget.scope_kind,
        scope_id=budget.scope_id,
        provider_id=budget.provider_id,
        window=budget.window,
        now=now,
    )


async def statuses(ledger: Ledger, budgets: Sequence[Budget], now: datetime) -> list[BudgetStatus]:
    """Each budget's current window and spend, in one ledger read."""
    counted = [b for b in budgets if not (b.scope_kind == "end_user" and b.scope_id is None)]
    nanos = await ledger.spend_across([(b.organization_id, _filter(b, now)) for b in counted])
    spent = {b.id: n for b, n in zip(counted, nanos, strict=True)}
    result = []
    for budget in budgets:
        window = _filter(budget, now)
        result.append(BudgetStatus(budget, window.start, window.end, spent.get(budget.id)))
    return result


@dataclass(frozen=True, slots=True)
class BurnDown:
    days: list[datetime]
    """The chart's days: the window's, or a `total` budget's last MAX_DAYS."""
    cumulative: list[int]
    """Nano-USD spent by the end of each day up to today."""
    reach_at: datetime | None
    """When the limit is reached at the pace so far; None: not within the window."""
    reached: bool
    pace_nano_per_day: int


async def burn_down(ledger: Ledger, status: BudgetStatus, now: datetime) -> BurnDown:
    budget = status.budget
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    start = status.window_start or budget.created_at.replace(
        hour=0, minute=0, second=0, microsecond=0
    )
    first = max(start, today - timedelta(days=MAX_DAYS - 1))
    end = status.window_end or today + timedelta(days=1)
    days = [first + timedelta(days=i) for i in range((end - first).days)]
    shown = [d for d in days if d <= today]
    base = _filter(budget, now)
    filters = [replace(base, start=d, end=d + timedelta(days=1)) for d in shown]
    if first > start or status.window_start is None:
        filters.insert(0, replace(base, start=None, end=first))
    reading = await ledger.spend(budget.organization_id, filters, now)
    nanos = list(reading.nanos)
    carried = nanos.pop(0) if len(filters) > len(shown) else 0
    cumulative = []
    running = carried
    for n in nanos:
        running += n
        cumulative.append(running)
    spent = running
    elapsed = max((now - start).total_seconds(), 60.0)
    pace = spent / elapsed  # nano-USD a second: a forecast, not a figure of the ledger
    left = budget.limit_nano_usd - spent
    reached = left <= 0
    reach_at: datetime | None = None
    if reached:
        reach_at = now
    elif pace > 0:
        moment = now + timedelta(seconds=left / pace)
        if status.window_end is None or moment < status.window_end:
            reach_at = moment
    return BurnDown(days, cumulative, reach_at, reached, int(pace * 86400))

"""What a replica's tick does to each lease it looks at: report, renew, give back or forget.

The tick (every `TICK_S`) looks at the leases its `Schedule` says are due, not at every one the
replica holds; the shutdown looks at every one and gives each slice back.
"""

from __future__ import annotations

from collections.abc import Awaitable

from proxy.limits._lease_state import (
    BudgetLease,
    Lease,
    Schedule,
    SlotsLease,
    TokensLease,
    lapse_reservations,
    lapse_slots,
)
from proxy.limits._lease_syncs import Syncs
from proxy.limits.lease_store import Grant

TICK_S = 0.25
"""How often spend is reported and slices renewed or given back: a replica that dies leaves at
most this long of its spending unreported (it comes back into the counts with its spool)."""


class Ticks:
    """Decides, lease by lease, what a tick syncs (and starts those syncs)."""

    def __init__(
        self,
        tokens: dict[str, TokensLease],
        slots: dict[str, SlotsLease],
        budgets: dict[str, BudgetLease],
        syncs: Syncs,
        schedule: Schedule,
        ttl_s: float,
    ) -> None:
        self._tokens = tokens
        self._slots = slots
        self._budgets = budgets
        self._syncs = syncs
        self._schedule = schedule
        self._ttl = ttl_s
        self._idle_s = ttl_s / 2

    def give_back(self, now: float, *, force: bool) -> list[Awaitable[Grant]]:
        """The syncs a tick (or, with `force`, the shutdown) makes, each started (its lease
        marked as syncing) before anything else runs. A tick looks only at the leases the
        schedule says are due; the shutdown at every one."""
        calls: list[Awaitable[Grant]] = []
        schedule = self._schedule
        leases: list[Lease]
        if force:
            leases = [*self._tokens.values(), *self._slots.values(), *self._budgets.values()]
        else:
            leases = schedule.due(now)
        for lease in leases:
            if lease.sync is not None:
                continue  # looked at again once it answers
            if isinstance(lease, TokensLease):
                later = self._visit_tokens(lease, now, force, calls)
            elif isinstance(lease, SlotsLease):
                later = self._visit_slots(lease, now, force, calls)
            else:
                assert isinstance(lease, BudgetLease)
                later = self._visit_budget(lease, now, force, calls)
            if later is not None and not force:
                schedule.at(lease, later)
        return calls

    def _visit_tokens(
        self, lease: TokensLease, now: float, force: bool, calls: list[Awaitable[Grant]]
    ) -> float | None:
        """Sync, forget or leave the lease; when left, the time to look at it again."""
        assert lease.bucket is not None
        key = lease.bucket.key
        if self._tokens.get(key) is not lease:
            return None  # forgotten, or another made since
        idle_at = lease.used_at + self._idle_s
        idle = force or idle_at < now
        amount, spent = lease.amount, lease.spent
        if idle and amount == 0 and spent == 0 and lease.paid == 0:
            del self._tokens[key]
        elif idle:
            calls.append(self._syncs.tokens(lease, now, 0.0, 0.0, returned=True))
        elif (
            spent
            or lease.paid
            or (
                amount
                and now - lease.synced_at >= self._ttl / 2
                and not self._idle_by_next_tick(lease, idle_at, now)
            )
        ):
            # Spent is reported every tick, not only at renewal: a replica that dies has its
            # unused slice given back when it lapses, and use it had not reported counts as
            # unused. A slice too small for one more request is given back with the report.
            small = lease.free() < lease.asked
            keep = 0.0 if small else None
            calls.append(self._syncs.tokens(lease, now, keep, 0.0, returned=small))
        else:
            return min(idle_at, lease.synced_at + self._ttl / 2) if amount else idle_at
        return None

    def _idle_by_next_tick(self, lease: Lease, idle_at: float, now: float) -> bool:
        """A slice due for renewal that goes idle before the next tick, and that the store
        keeps until after it, is given back then rather than renewed now (a call saved for
        each key used once in a while)."""
        return idle_at < now + TICK_S and lease.synced_at + self._ttl > idle_at + TICK_S

    def _visit_slots(
        self, lease: SlotsLease, now: float, force: bool, calls: list[Awaitable[Grant]]
    ) -> float | None:
        assert lease.slots is not None
        key = lease.slots.key
        if self._slots.get(key) is not lease:
            return None
        if now >= lease.lapse_at:
            lapse_slots(lease, now)
        idle_at = lease.used_at + self._idle_s
        idle = force or idle_at < now
        renew_at = lease.synced_at + self._ttl / 2
        if idle and lease.amount == 0 and not lease.held:
            del self._slots[key]
        elif idle and lease.amount > len(lease.held):
            calls.append(self._syncs.slots(lease, now, 0, 0, returned=True))
        elif (
            now >= renew_at
            and (lease.amount or lease.held)
            and (lease.held or not self._idle_by_next_tick(lease, idle_at, now))
        ):
            calls.append(self._syncs.slots(lease, now, None, 0))
        else:
            later = lease.lapse_at if idle else min(idle_at, lease.lapse_at)
            return min(later, renew_at) if lease.amount or lease.held else later
        return None

    def _visit_budget(
        self, lease: BudgetLease, now: float, force: bool, calls: list[Awaitable[Grant]]
    ) -> float | None:
        assert lease.bucket is not None
        key = lease.bucket.key
        if self._budgets.get(key) is not lease:
            return None
        if now >= lease.lapse_at:
            lapse_reservations(lease, now)
        idle_at = lease.used_at + self._idle_s
        idle = force or idle_at < now
        renew_at = lease.synced_at + self._ttl / 2
        held = lease.amount or lease.reserved
        if idle and lease.amount == 0 and not lease.reserved and not lease.unreported:
            del self._budgets[key]
        elif idle and lease.free() > 0:
            calls.append(self._syncs.budget(lease, now, 0, 0, returned=True))
        elif lease.unreported or (
            now >= renew_at
            and held
            and (lease.reserved or not self._idle_by_next_tick(lease, idle_at, now))
        ):
            # A slice too small for one more request is given back with the report: a key
            # used now and then owes one call after its request, not two.
            small = lease.free() < lease.asked
            calls.append(self._syncs.budget(lease, now, 0 if small else None, 0, returned=small))
        else:
            later = lease.lapse_at if idle else min(idle_at, lease.lapse_at)
            return min(later, renew_at) if held else later
        return None

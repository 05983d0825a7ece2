"""What a replica keeps of its leases: one per bucket it uses, and what each holds."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from proxy.limits.store import Bucket, BudgetBucket, Slots

if TYPE_CHECKING:
    from proxy.limits.lease_store import Grant


@dataclass(slots=True)
class LeaseStats:
    """What the metrics read."""

    taken: int = 0
    """Syncs that took a slice, or more of one."""
    returned: int = 0
    """Slices given back unused (idle, or at shutdown)."""
    expired: int = 0
    """Slices the store had lapsed before the replica synced them (it did not in time)."""
    revoked: int = 0
    """Slices given back because their limit or budget changed."""
    local: int = 0
    """Admissions served from slices alone, without a call to the store."""
    synced: int = 0
    """Admissions that waited for a sync."""


@dataclass(slots=True, eq=False)
class Lease:
    """What every kind of lease keeps: when it was synced, used, and is usable until."""

    name: str
    synced_at: float = -math.inf
    deadline: float = -math.inf
    """Spent from until then; synced first after."""
    used_at: float = -math.inf
    taken: float = 0.0
    """Units taken since the last sync: how fast it is spent, for the next slice's size."""
    asked: float = 0.0
    """What the last request took of it: a slice left smaller than that is of no use to the
    next, which would have to sync anyway, so a report gives it back."""
    sync: asyncio.Future[Grant] | None = None
    """The sync in flight, if any: one at a time per lease."""
    closing: bool = False
    """The sync in flight gives back some of the slice: nothing is taken from it meanwhile.
    (While any other sync is in flight requests go on taking from the slice: the sync kept
    all of it, and what it brings is added when it comes.)"""
    lapse_at: float = math.inf
    """The earliest deadline of what it holds (a request that never ended)."""
    touched: bool = False
    """Changed since the last tick: the next one looks at it."""
    visit_at: float = math.inf
    """When a tick is to look at it again unless it is touched before (`Schedule`)."""


@dataclass(slots=True, eq=False)
class TokensLease(Lease):
    bucket: Bucket | None = None
    amount: float = 0.0
    """The unused slice as of the last sync."""
    spent: float = 0.0
    """Spent since the last sync (a correction may be negative)."""
    level: float = math.nan
    """The bucket's level outside every lease at the last sync (nan: never synced)."""
    paid: float = 0.0
    """Tokens a sync took and spent in the store at once for the request that asked, not yet
    taken by it (or by another request of this replica meanwhile, which is as good)."""

    def free(self) -> float:
        """What may be taken locally: tokens given back (a count corrected downwards) are
        spendable only once the store has them, within the capacity."""
        spent = self.spent
        return (self.amount - spent if spent > 0 else self.amount) + self.paid


@dataclass(slots=True, eq=False)
class SlotsLease(Lease):
    slots: Slots | None = None
    amount: int = 0
    held: dict[str, float] = field(default_factory=dict)
    """Request id → when its slot lapses (its replica's request never ended)."""


@dataclass(slots=True, eq=False)
class Entry:
    """Settled spend reported to the store as one entry; acknowledged once the ledger has
    every request in it."""

    name: str
    count: int = 0
    reported: bool = False


@dataclass(slots=True, eq=False)
class BudgetLease(Lease):
    bucket: BudgetBucket | None = None
    amount: int = 0
    """The slice as of the last sync, reservations in flight included."""
    reserved: dict[str, tuple[int, float]] = field(default_factory=dict)
    """Request id → (amount, deadline) of its reservation."""
    reserved_sum: int = 0
    unreported: int = 0
    """Settled since the last sync, in `entry`."""
    entry: Entry | None = None
    entries: int = 0
    level: int = 0
    """The bucket's level at the last sync, this whole slice included."""
    hold_until: float = -math.inf
    """When the unreported spend stops counting (its `hold_s` from when it was settled)."""

    def free(self) -> int:
        return self.amount - self.reserved_sum - self.unreported


class Schedule:
    """The leases the next tick looks at: those touched since the last one (a request took,
    gave back or settled; a sync answered), and those whose time to be looked at again has
    come (to be renewed, to go idle, a request's hold to lapse). A tick costs what changed,
    not every lease a replica holds."""

    def __init__(self) -> None:
        self.touched: list[Lease] = []
        self._later: list[tuple[float, int, Lease]] = []
        self._order = itertools.count()

    def touch(self, lease: Lease) -> None:
        if not lease.touched:
            lease.touched = True
            self.touched.append(lease)

    def at(self, lease: Lease, when: float) -> None:
        """Look at `lease` again at `when` (or at the earlier time already set)."""
        if when < lease.visit_at:
            lease.visit_at = when
            heapq.heappush(self._later, (when, next(self._order), lease))

    def due(self, now: float) -> list[Lease]:
        """The leases to look at now, each once; they are untouched from then on."""
        leases, self.touched = self.touched, []
        later = self._later
        while later and later[0][0] <= now:
            when, _, lease = heapq.heappop(later)
            if when != lease.visit_at:
                continue  # set again, earlier: that entry came first
            lease.visit_at = math.inf
            if not lease.touched:
                lease.touched = True
                leases.append(lease)
        for lease in leases:
            lease.touched = False
        return leases

    def __len__(self) -> int:
        return len(self._later)


def fail(future: asyncio.Future[Grant], exc: BaseException) -> None:
    if isinstance(exc, asyncio.CancelledError):
        future.cancel()
    else:
        future.set_exception(exc)
        # Waiters see it; nobody else needs to.
        future.exception()


def merge(entries: dict[tuple[str, str], Entry], into: Entry, other: Entry) -> None:
    """Requests of `other` now count in `into` (an entry that could not be reported)."""
    for key, entry in entries.items():
        if entry is other:
            entries[key] = into
    into.count += other.count


def lapse_slots(lease: SlotsLease, now: float) -> None:
    held = lease.held
    for request_id in [r for r, deadline in held.items() if deadline <= now]:
        del held[request_id]
    lease.lapse_at = min(held.values(), default=math.inf)


def lapse_reservations(lease: BudgetLease, now: float) -> None:
    reserved = lease.reserved
    for request_id in [r for r, (_, deadline) in reserved.items() if deadline <= now]:
        lease.reserved_sum -= reserved.pop(request_id)[0]
    lease.lapse_at = min((deadline for _, deadline in reserved.values()), default=math.inf)

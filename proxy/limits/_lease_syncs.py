"""Syncs of a replica's leases with the store: what each kind reports, and what it keeps.

A sync reads what it reports from the lease when it starts and marks the lease as syncing then
(so no second sync of it starts, and, when it gives part of the slice back, nothing is taken
from the slice meanwhile); its answer is applied when it comes, on top of what requests did
meanwhile.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Awaitable, Callable

from proxy.limits._lease_state import (
    BudgetLease,
    Entry,
    Lease,
    LeaseStats,
    SlotsLease,
    TokensLease,
    fail,
    merge,
)
from proxy.limits.lease_store import Grant, LeaseStore

log = logging.getLogger("vkgate.proxy.limits")

USABLE = 0.75
"""A slice is spent from for this share of its time to live, then synced first: the store
lapses it only later, even with the replicas' clocks a little apart."""
CALLS_AT_ONCE = 32
"""Store calls of one replica in flight at once; more wait their turn. The Redis client's pool
refuses a call beyond its 100 connections, and would put the replica on its own counters."""
MIN_PACE_S = 0.0625
"""The shortest time a lease's pace is measured over (a sync right after another)."""


class Syncs:
    """Starts the syncs of one replica's leases and applies their answers."""

    def __init__(
        self,
        store: LeaseStore,
        ttl_s: float,
        stats: LeaseStats,
        entries: dict[tuple[str, str], Entry],
    ) -> None:
        self._store = store
        self._ttl = ttl_s
        self._stats = stats
        self._entries = entries
        self._calls = asyncio.Semaphore(CALLS_AT_ONCE)

    def tokens(
        self,
        lease: TokensLease,
        now: float,
        keep: float | None,
        need: float,
        *,
        returned: bool = False,
    ) -> Awaitable[Grant]:
        """Start a sync of `lease`: what it reports is read now, and the lease is marked as
        syncing now (requests wait for it rather than sync it twice)."""
        bucket = lease.bucket
        assert bucket is not None
        spent = lease.spent
        free = lease.free()
        keeping = max(0.0, free) if keep is None else keep
        want = need + self._more(lease, now) if need > 0 else 0.0
        call = functools.partial(
            self._store.tokens,
            bucket,
            lease.name,
            now,
            used=spent,
            keep=keeping,
            need=need,
            want=want,
            ttl=self._ttl,
        )

        def done(grant: Grant) -> None:
            lease.spent -= spent
            lease.amount = grant.amount
            lease.level = grant.level
            self._synced(lease, grant, now, need, returned and free > keeping)

        return self._syncing(lease, call, done, None, keeping < free)

    def slots(
        self, lease: SlotsLease, now: float, keep: int | None, need: int, *, returned: bool = False
    ) -> Awaitable[Grant]:
        slots = lease.slots
        assert slots is not None
        held = len(lease.held)
        free = max(0, lease.amount - held)
        keeping = free if keep is None else keep
        want = need + int(self._more(lease, now)) if need > 0 else 0
        call = functools.partial(
            self._store.slots,
            slots,
            lease.name,
            now,
            must=held,
            keep=keeping,
            need=need,
            want=want,
            ttl=self._ttl,
        )

        def done(grant: Grant) -> None:
            lease.amount = int(grant.amount)
            self._synced(lease, grant, now, need, returned and free > keeping)

        return self._syncing(lease, call, done, None, keeping < free)

    def budget(
        self, lease: BudgetLease, now: float, keep: int | None, need: int, *, returned: bool = False
    ) -> Awaitable[Grant]:
        bucket = lease.bucket
        assert bucket is not None
        reserved, settled, entry = lease.reserved_sum, lease.unreported, lease.entry
        free = lease.amount - reserved - settled
        keeping = max(0, free) if keep is None else keep
        want = need + int(self._more(lease, now)) if need > 0 else 0
        hold_s = lease.hold_until - now
        call = functools.partial(
            self._store.budget,
            bucket,
            lease.name,
            now,
            had=lease.amount > 0,
            must=reserved,
            keep=keeping,
            need=need,
            want=want,
            ttl=self._ttl,
            entry=entry.name if entry is not None else "",
            # Past its hold it would have lapsed by now: nothing to count.
            settled=settled if hold_s > 0 else 0,
            hold_s=hold_s,
            # Closed by this sync: no request joins it after, so a count of none now is final.
            acked=entry is not None and entry.count == 0,
        )
        # Settled from now on goes into the next entry; what was settled leaves the slice (it
        # becomes the entry's), so the slice's room meanwhile is what it was, not that plus it.
        lease.unreported, lease.entry = 0, None
        lease.amount -= settled

        def done(grant: Grant) -> None:
            if entry is not None:
                entry.reported = True
            lease.amount = int(grant.amount)
            lease.level = int(grant.level)
            self._synced(lease, grant, now, need, returned and free > keeping)

        def undo() -> None:
            # Not reported: counted again at the next sync, in the entry of then.
            lease.unreported += settled
            lease.amount += settled
            if entry is not None:
                if lease.entry is None:
                    lease.entry = entry
                else:
                    merge(self._entries, lease.entry, entry)

        return self._syncing(lease, call, done, undo, keeping < free)

    def _syncing(
        self,
        lease: Lease,
        call: Callable[[], Awaitable[Grant]],
        done: Callable[[Grant], None],
        undo: Callable[[], None] | None,
        closing: bool,
    ) -> Awaitable[Grant]:
        future = lease.sync = asyncio.get_running_loop().create_future()
        lease.closing = closing
        return self._synced_when(lease, future, call, done, undo)

    async def _synced_when(
        self,
        lease: Lease,
        future: asyncio.Future[Grant],
        call: Callable[[], Awaitable[Grant]],
        done: Callable[[Grant], None],
        undo: Callable[[], None] | None,
    ) -> Grant:
        try:
            async with self._calls:
                grant = await call()
        except BaseException as exc:
            if undo is not None:
                undo()
            fail(future, exc)
            raise
        finally:
            lease.sync = None
            lease.closing = False
        done(grant)
        future.set_result(grant)
        return grant

    def _more(self, lease: Lease, now: float) -> float:
        """How much more than it needs a lease asks for: what it took since its last sync,
        at that pace, for the part of a time to live it is spent from."""
        elapsed = max(now - lease.synced_at, MIN_PACE_S)
        return math.ceil(lease.taken / elapsed * self._ttl * USABLE)

    def _synced(self, lease: Lease, grant: Grant, now: float, need: float, returned: bool) -> None:
        stats = self._stats
        if grant.granted > 0:
            stats.taken += 1
        if grant.lapsed:
            stats.expired += 1
            # A live replica's slice lapsed: it was not renewed in time (its event loop was
            # held up longer than half a time to live, or the replicas' clocks disagree).
            log.warning(
                "limit_lease_expired: a slice was not renewed within its %g s (%.2f s since "
                "its last sync)",
                self._ttl,
                now - lease.synced_at,
            )
        if returned:
            stats.returned += 1
        lease.synced_at = now
        lease.deadline = now + self._ttl * USABLE
        lease.taken = 0.0
        if need > 0:
            lease.used_at = now

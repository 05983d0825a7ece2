"""Syncs of a replica's leases with the store: what each kind reports, and what it keeps.

A sync reads what it reports from the lease when it starts and marks the lease as syncing then
(so no second sync of it starts, and, when it gives part of the slice back, nothing is taken
from the slice meanwhile); its answer is applied when it comes, on top of what requests did
meanwhile, whether or not anyone still waits for it.

Syncs started in one turn of the event loop go out together, at the end of that turn, in one
`LeaseStore.run`: one round trip to each Redis node for a request whose every bucket is new,
and for a tick however many slices it reports.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from proxy.limits._lease_state import (
    BudgetLease,
    Entry,
    Lease,
    LeaseStats,
    Schedule,
    SlotsLease,
    TokensLease,
    fail,
    merge,
)
from proxy.limits.lease_store import Call, Grant, LeaseStore

log = logging.getLogger("vkgate.proxy.limits")

USABLE = 0.75
"""A slice is spent from for this share of its time to live, then synced first: the store
lapses it only later, even with the replicas' clocks a little apart."""
BATCH = 64
"""Syncs sent in one `LeaseStore.run` at most (a tick's many slices go in several): Redis runs
nothing else while a script runs, and a call of hundreds of syncs held it up long enough to
show in other replicas' waits (bench/README.md)."""
BATCHES_AT_ONCE = 16
"""Runs of one replica in flight at once; more wait their turn. Each holds a connection (one
per node on Cluster); the Redis client's pool refuses a call beyond its 100 connections, and
would put the replica on its own counters."""
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
        schedule: Schedule,
    ) -> None:
        self._store = store
        self._schedule = schedule
        self._ttl = ttl_s
        self._stats = stats
        self._entries = entries
        self._batches = asyncio.Semaphore(BATCHES_AT_ONCE)
        self._queued: list[_Pending] = []
        self._sending: set[asyncio.Task[None]] = set()

    def tokens(
        self,
        lease: TokensLease,
        now: float,
        keep: float | None,
        need: float,
        *,
        pay: float = 0.0,
        returned: bool = False,
    ) -> Awaitable[Grant]:
        """Start a sync of `lease`: what it reports is read now, and the lease is marked as
        syncing now (requests wait for it rather than sync it twice). Of `need`, `pay` is the
        asking request's cost, spent in the store at once: it comes back as credit (`paid`)
        for that request to take, so its use needs no report."""
        bucket = lease.bucket
        assert bucket is not None
        free = lease.free()
        if lease.paid:
            # Credit nobody took (its request was refused by another bucket) goes back.
            lease.spent -= lease.paid
            lease.paid = 0.0
        spent = lease.spent
        keeping = max(0.0, free) if keep is None else keep
        want = need + self._more(lease, now) if need > 0 else 0.0
        call = self._store.tokens(
            bucket,
            lease.name,
            now,
            used=spent,
            keep=keeping,
            need=need,
            want=want,
            ttl=self._ttl,
            pay=pay if need > 0 else 0.0,
        )

        def done(grant: Grant) -> None:
            lease.spent -= spent
            lease.amount = grant.amount
            lease.level = grant.level
            if grant.granted > 0:
                lease.paid += pay
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
        call = self._store.slots(
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
        call = self._store.budget(
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
        call: Call,
        done: Callable[[Grant], None],
        undo: Callable[[], None] | None,
        closing: bool,
    ) -> Awaitable[Grant]:
        loop = asyncio.get_running_loop()
        future = lease.sync = loop.create_future()
        lease.closing = closing
        if not self._queued:
            loop.call_soon(self._send_queued)
        self._queued.append(_Pending(call, lease, future, done, undo))
        # A waiter that gives up (its request was cancelled) leaves the sync to finish.
        return asyncio.shield(future)

    def _send_queued(self) -> None:
        queued, self._queued = self._queued, []
        loop = asyncio.get_running_loop()
        for start in range(0, len(queued), BATCH):
            task = loop.create_task(self._send(queued[start : start + BATCH]))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[_Pending]) -> None:
        try:
            async with self._batches:
                answers = await self._store.run([pending.call for pending in batch])
        except BaseException as exc:
            for pending in batch:
                _failed(pending, exc)
                self._schedule.touch(pending.lease)
            if not isinstance(exc, Exception):
                raise
            return
        for pending, answer in zip(batch, answers, strict=True):
            # Looked at by the next tick, answered or not (what failed is sent again then).
            self._schedule.touch(pending.lease)
            if isinstance(answer, Exception):
                _failed(pending, answer)
                continue
            lease = pending.lease
            lease.sync = None
            lease.closing = False
            pending.done(answer)
            pending.future.set_result(answer)

    async def drain(self) -> None:
        """Wait for every sync sent (their answers applied, or their failures undone)."""
        while self._queued or self._sending:
            if self._queued:
                self._send_queued()
            await asyncio.gather(*self._sending, return_exceptions=True)

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


@dataclass(slots=True, eq=False)
class _Pending:
    call: Call
    lease: Lease
    future: asyncio.Future[Grant]
    done: Callable[[Grant], None]
    undo: Callable[[], None] | None


def _failed(pending: _Pending, exc: BaseException) -> None:
    if pending.undo is not None:
        pending.undo()
    lease = pending.lease
    lease.sync = None
    lease.closing = False
    fail(pending.future, exc)

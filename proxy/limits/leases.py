"""`LeasedCounters`: counters shared by every replica, spent locally from leased slices.

A replica takes a slice of each bucket it uses (rate-limit tokens, concurrency slots, budget
nanos) from the store and admits requests from it with no network call. It syncs with the store
only when a slice runs short (and then asks for more), when its limit or budget changed (the
slice is given back first: revoked), when the ledger brought a newer figure, to report what it
spent (every `tick`), to renew a slice still in use before its time to live runs out, and to give
back a slice nobody used for a while. The store sizes each slice to what is left (see
`proxy.limits.lease_store`): near the limit a slice is one request's worth, and every request
syncs, so the fleet is as exact as one shared counter there.

What the requests of one replica do to its slices happens on its event loop between two awaits,
so each admission is atomic locally; a request that had to sync checks everything again after.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from proxy.limits._lease_state import (
    BudgetLease,
    Entry,
    LeaseStats,
    Schedule,
    SlotsLease,
    TokensLease,
    lapse_reservations,
    lapse_slots,
)
from proxy.limits._lease_syncs import Syncs
from proxy.limits._lease_ticks import TICK_S, Ticks
from proxy.limits.counters import _decide, levels_of
from proxy.limits.store import (
    Admission,
    Bucket,
    BudgetBucket,
    Levels,
    Reservation,
    Slots,
)
from vkgate.clock import Clock, Sleep

if TYPE_CHECKING:
    from proxy.limits.lease_store import Grant, LeaseStore

__all__ = ["TICK_S", "LeaseStats", "LeasedCounters"]

log = logging.getLogger("vkgate.proxy.limits")

ATTEMPTS = 32
"""Syncs one admission may wait for before it is refused (others on this replica kept taking
what each sync brought): far more than a request needs but a bound all the same."""

_TOKENS_STEP, _SLOTS_STEP, _BUDGETS_STEP = 0, 1, 2
T = TypeVar("T")


class LeasedCounters:
    """`Counters` whose state is the store's, spent through leases. `start` runs the tick in
    the background (tests call `tick` themselves, at the times they choose)."""

    def __init__(
        self,
        store: LeaseStore,
        clock: Clock,
        *,
        ttl_s: float = 2.0,
        replica: str = "",
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._store = store
        self._clock = clock
        self._sleep = sleep
        self._id = replica or _random_id()
        self._tokens: dict[str, TokensLease] = {}
        self._slots: dict[str, SlotsLease] = {}
        self._budgets: dict[str, BudgetLease] = {}
        self._entries: dict[tuple[str, str], Entry] = {}
        """(bucket key, request id) → the entry its settled cost was reported in."""
        self._leases = 0
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self.stats = LeaseStats()
        self.on_failure: Callable[[BaseException], None] | None = None
        """Told when a tick's syncs fail: requests served from slices meet no Redis call, so
        the tick is often the first to find Redis gone."""
        self._schedule = Schedule()
        self._syncs = Syncs(store, ttl_s, self.stats, self._entries, self._schedule)
        self._ticks = Ticks(
            self._tokens, self._slots, self._budgets, self._syncs, self._schedule, ttl_s
        )

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="limit-leases")

    # The Counters protocol

    async def admit(
        self,
        request_id: str,
        buckets: Sequence[Bucket],
        slots: Sequence[Slots],
        budgets: Sequence[BudgetBucket],
        amounts: Sequence[int],
        lease_s: float,
        now: float,
    ) -> Admission:
        if len(amounts) != len(budgets):
            raise ValueError("one amount per budget bucket")
        refusing: list[bool] | None = None
        step = _TOKENS_STEP
        synced = False
        self.stats.local += 1  # until it has to sync
        time = self._clock.time
        for _ in range(ATTEMPTS):
            # A request may have waited since the caller read the clock (for other syncs, or a
            # busy loop): slices are checked against, and synced at, the time now. A slice
            # synced at a stale time would be past its deadline in the store already.
            fresh = time()
            if fresh > now:
                now = fresh
            # Everything is checked, then taken, with no await in between; what is short is
            # synced at once (one round trip, however many buckets), and checked again after.
            short_tokens = self._short_tokens(buckets, now) if buckets else None
            short_slots = self._short_slots(slots, request_id, now) if slots else None
            repeat = short_budgets = None
            if budgets:
                if refusing is None:
                    refusing = [False] * len(budgets)
                repeat = self._repeat(request_id, budgets, now)
                if repeat is None:
                    short_budgets = self._short_budgets(budgets, amounts, refusing, now)
            if short_tokens or short_slots or short_budgets:
                synced = synced or self._count_synced()
                step = (
                    _TOKENS_STEP if short_tokens else _SLOTS_STEP if short_slots else _BUDGETS_STEP
                )
                tops: list[Awaitable[int | None]] = []
                if short_tokens:
                    tops.append(self._top_up_tokens(short_tokens, buckets, now))
                if short_slots:
                    tops.append(self._top_up_slots(short_slots, slots, request_id, now))
                if short_budgets:
                    assert refusing is not None
                    tops.append(
                        self._top_up_budgets(short_budgets, budgets, amounts, refusing, now)
                    )
                answers = iter(await _all(tops))
                refused = next(answers) if short_tokens else None
                if refused is not None:
                    return Admission(self._levels(buckets, now, refused))
                refused = next(answers) if short_slots else None
                if refused is not None:
                    levels = self._levels(buckets, now, None) if buckets else None
                    return Admission(levels, refused)
                continue
            if repeat is not None:
                admission = self._commit(request_id, buckets, slots, (), (), lease_s, now, repeat)
                admission.reservation = Reservation(True, repeat, self._budget_levels(budgets))
                return admission
            survivors: frozenset[int] = frozenset()
            if refusing is not None:
                refused_at, survivors = _decide(budgets, refusing)
                if refused_at is not None:
                    reservation = Reservation(
                        False, frozenset(), self._budget_levels(budgets), refused_at
                    )
                    return Admission(
                        self._levels(buckets, now, None) if buckets else None, None, reservation
                    )
            return self._commit(
                request_id, buckets, slots, budgets, amounts, lease_s, now, survivors
            )
        return self._exhausted(step, buckets, budgets, now)

    async def finish(
        self,
        request_id: str,
        adjust: Sequence[Bucket],
        slots: Sequence[Slots],
        budgets: Sequence[BudgetBucket],
        costs: Sequence[int],
        hold_s: float,
        now: float,
    ) -> None:
        touch = self._schedule.touch
        for b in adjust:
            lease = self._tokens.get(b.key)
            if lease is None:
                lease = self._tokens[b.key] = TokensLease(self._name(), bucket=b)
            lease.spent += b.cost
            touch(lease)
        for s in slots:
            held = self._slots.get(s.key)
            if held is not None:
                held.held.pop(request_id, None)
                touch(held)
        if budgets or costs:
            self._settle(request_id, budgets, costs, hold_s, now)

    async def take(self, buckets: Sequence[Bucket], now: float) -> Levels:
        admission = await self.admit("", buckets, (), (), (), 0.0, now)
        assert admission.levels is not None
        return admission.levels

    async def adjust(self, buckets: Sequence[Bucket], now: float) -> None:
        await self.finish("", buckets, (), (), (), 0.0, now)

    async def acquire(self, slots: Slots, request_id: str, now: float) -> bool:
        return (await self.admit(request_id, (), (slots,), (), (), 0.0, now)).admitted

    async def release(self, slots: Slots, request_id: str) -> None:
        await self.finish(request_id, (), (slots,), (), (), 0.0, 0.0)

    async def reserve(
        self,
        request_id: str,
        buckets: Sequence[BudgetBucket],
        amounts: Sequence[int],
        lease_s: float,
        now: float,
    ) -> Reservation:
        admission = await self.admit(request_id, (), (), buckets, amounts, lease_s, now)
        assert admission.reservation is not None
        return admission.reservation

    async def settle(
        self,
        request_id: str,
        buckets: Sequence[BudgetBucket],
        costs: Sequence[int],
        hold_s: float,
        now: float,
    ) -> None:
        await self.finish(request_id, (), (), buckets, costs, hold_s, now)

    async def ledgered(self, entries: Sequence[tuple[str, str]], now: float) -> None:
        done: dict[str, list[str]] = {}
        unreported: dict[str, BudgetLease] = {}
        for key, request_id in entries:
            lease = self._budgets.get(key)
            if lease is not None and now >= lease.lapse_at:
                lapse_reservations(lease, now)
            entry = self._entries.pop((key, request_id), None)
            if entry is None:
                continue
            entry.count -= 1
            if entry.count == 0:
                if entry.reported:
                    done.setdefault(key, []).append(entry.name)
                elif lease is not None:
                    unreported[key] = lease
        # The ledger was faster than the tick: the entry is still open, and its report says it
        # is acknowledged if no request joined it meanwhile (after the sync in flight, if any:
        # one sync of a lease at a time).
        for lease in unreported.values():
            while lease.sync is not None:
                await asyncio.shield(lease.sync)
            if lease.unreported:
                await self._syncs.budget(lease, self._clock_time(now), keep=None, need=0)
        for key, names in done.items():
            await self._store.ledgered(key, names, now)

    def _clock_time(self, now: float) -> float:
        fresh = self._clock.time()
        return fresh if fresh > now else now

    async def close(self) -> None:
        """Give back every slice (what requests still hold stays held until it lapses)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            now = self._clock.time()
            await self._each(self._ticks.give_back(now, force=True))
        except Exception as exc:
            log.warning("could not give back limit leases at shutdown: %s", type(exc).__name__)
        finally:
            await self._syncs.drain()
            await self._store.close()

    # The tick

    async def tick(self, now: float) -> None:
        """Report spend, renew slices in use, give back idle ones, forget what is empty. A
        failure is told to `on_failure`, then raised."""
        try:
            await self._each(self._ticks.give_back(now, force=False))
        except Exception as exc:
            if self.on_failure is not None:
                self.on_failure(exc)
            raise

    async def _run(self) -> None:
        while True:
            await self._sleep(TICK_S)
            try:
                await self.tick(self._clock.time())
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not self._failing:
                    log.warning(
                        "limit leases could not be synced: %s: %s; retried every %g s",
                        type(exc).__name__,
                        exc,
                        TICK_S,
                    )
                self._failing = True
            else:
                self._failing = False

    async def check(self) -> None:
        """A round trip to the store; raises what it raises."""
        await self._store.ping()

    async def _each(self, calls: list[Awaitable[Grant]]) -> None:
        """Wait for the syncs (sent together: `Syncs`); raise the first failure."""
        for result in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(result, BaseException):
                raise result

    # Token buckets

    def _short_tokens(
        self, buckets: Sequence[Bucket], now: float
    ) -> list[tuple[TokensLease, Bucket]] | None:
        short = None
        for b in buckets:
            lease = self._tokens.get(b.key)
            if (
                lease is None
                or lease.closing
                or now >= lease.deadline
                or lease.free() < b.cost
                or lease.bucket is None
                or lease.bucket.capacity != b.capacity
                or lease.bucket.per_second != b.per_second
            ):
                if short is None:
                    short = []
                if lease is None:
                    lease = self._tokens[b.key] = TokensLease(self._name(), bucket=b, used_at=now)
                short.append((lease, b))
        return short

    def _top_up_tokens(
        self, short: list[tuple[TokensLease, Bucket]], buckets: Sequence[Bucket], now: float
    ) -> Awaitable[int | None]:
        """Start syncing the short leases (each marked as syncing before anything else runs);
        the awaitable gives the index (among `buckets`) of a refusal, if any."""
        waits: list[Awaitable[Grant]] = []
        started: list[Bucket | None] = []
        for lease, b in short:
            if lease.sync is not None:
                waits.append(asyncio.shield(lease.sync))
                started.append(None)
                continue
            keep: float | None = None
            if lease.bucket is not None and (
                lease.bucket.capacity != b.capacity or lease.bucket.per_second != b.per_second
            ):
                # The limit changed: what was taken under the old one goes back first.
                keep = 0.0
                if lease.amount - lease.spent > 0:
                    self.stats.revoked += 1
            lease.bucket = b
            free = max(0.0, lease.free()) if keep is None else 0.0
            need = b.cost - free if b.cost > free else 0.0
            # The request pays what the slice lacks at once: its use owes no report.
            waits.append(self._syncs.tokens(lease, now, keep, need, pay=need))
            started.append(b)
        return _first_refused(waits, started, lambda sent: _index_of(buckets, sent))

    def _remaining(self, lease: TokensLease | None, b: Bucket, now: float) -> float:
        """The bucket's level as this replica sees it: the level outside every lease at the
        last sync, refilled since, plus this replica's unused slice."""
        if lease is None or math.isnan(lease.level):
            return b.capacity if lease is None else min(b.capacity, b.capacity - lease.spent)
        free = lease.free()
        outside = lease.level + max(0.0, now - lease.synced_at) * b.per_second
        if lease.spent < 0:
            # Given back (a count corrected downwards of a cost paid at once): the level's
            # once reported, though not this replica's to spend before then.
            outside -= lease.spent
        outside = min(outside, b.capacity - lease.amount)
        return min(b.capacity, outside + free)

    def _levels(self, buckets: Sequence[Bucket], now: float, refused: int | None) -> Levels:
        found = [self._remaining(self._tokens.get(b.key), b, now) for b in buckets]
        if refused is not None:
            return levels_of(buckets, found, refused)
        return levels_of(buckets, found, None)

    # Concurrency slots

    def _short_slots(
        self, slots: Sequence[Slots], request_id: str, now: float
    ) -> list[tuple[SlotsLease, Slots]] | None:
        short = None
        for s in slots:
            lease = self._slots.get(s.key)
            if lease is not None and now >= lease.lapse_at:
                lapse_slots(lease, now)
            if (
                lease is None
                or lease.closing
                or now >= lease.deadline
                or lease.slots != s
                or (request_id not in lease.held and len(lease.held) >= lease.amount)
            ):
                if short is None:
                    short = []
                if lease is None:
                    lease = self._slots[s.key] = SlotsLease(self._name(), slots=s, used_at=now)
                short.append((lease, s))
        return short

    def _top_up_slots(
        self,
        short: list[tuple[SlotsLease, Slots]],
        slots: Sequence[Slots],
        request_id: str,
        now: float,
    ) -> Awaitable[int | None]:
        waits: list[Awaitable[Grant]] = []
        started: list[Slots | None] = []
        for lease, s in short:
            if lease.sync is not None:
                waits.append(asyncio.shield(lease.sync))
                started.append(None)
                continue
            keep: int | None = None
            if lease.slots is not None and lease.slots.limit != s.limit:
                keep = 0
                if lease.amount > len(lease.held):
                    self.stats.revoked += 1
            lease.slots = s
            free = lease.amount - len(lease.held) if keep is None else 0
            need = 0 if request_id in lease.held or free >= 1 else 1
            waits.append(self._syncs.slots(lease, now, keep, need))
            started.append(s)
        return _first_refused(
            waits, started, lambda sent: next(i for i, x in enumerate(slots) if x.key == sent.key)
        )

    # Budgets

    def _repeat(
        self, request_id: str, budgets: Sequence[BudgetBucket], now: float
    ) -> frozenset[int] | None:
        """The groups a request reserved in before (a repeat: nothing is reserved again)."""
        held = None
        for b in budgets:
            lease = self._lease_of(b, now)
            if (lease is not None and request_id in lease.reserved) or (
                b.key,
                request_id,
            ) in self._entries:
                if held is None:
                    held = set()
                if b.group > 0:
                    held.add(b.group)
        return None if held is None else frozenset(held)

    def _lease_of(self, b: BudgetBucket, now: float) -> BudgetLease | None:
        """The bucket's lease, lapsed of what lapsed; a lease of a window that ended is
        forgotten (the store forgets the window too)."""
        lease = self._budgets.get(b.key)
        if lease is None:
            return None
        expires_at = b.expires_at
        if expires_at is not None and now >= expires_at:
            del self._budgets[b.key]
            return None
        if now >= lease.lapse_at:
            lapse_reservations(lease, now)
        return lease

    def _short_budgets(
        self,
        budgets: Sequence[BudgetBucket],
        amounts: Sequence[int],
        refusing: list[bool],
        now: float,
    ) -> list[int] | None:
        short = None
        for i, b in enumerate(budgets):
            if refusing[i]:
                continue
            lease = self._lease_of(b, now)
            if (
                lease is None
                or lease.closing
                or now >= lease.deadline
                or lease.free() < amounts[i]
                or lease.bucket is None
                or lease.bucket.limit_nanos != b.limit_nanos
                or lease.bucket.blocking != b.blocking
                or lease.bucket.ledger_as_of < b.ledger_as_of
            ):
                if short is None:
                    short = []
                if lease is None:
                    self._budgets[b.key] = BudgetLease(self._name(), bucket=b, used_at=now)
                short.append(i)
        return short

    def _top_up_budgets(
        self,
        short: list[int],
        budgets: Sequence[BudgetBucket],
        amounts: Sequence[int],
        refusing: list[bool],
        now: float,
    ) -> Awaitable[None]:
        waits: list[Awaitable[Grant]] = []
        started: list[int] = []
        for i in short:
            b = budgets[i]
            lease = self._budgets[b.key]
            if lease.sync is not None:
                waits.append(asyncio.shield(lease.sync))
                started.append(-1)
                continue
            keep: int | None = None
            old = lease.bucket
            if old is not None and (old.limit_nanos != b.limit_nanos or old.blocking != b.blocking):
                keep = 0
                if lease.free() > 0:
                    self.stats.revoked += 1
            if old is None or old.ledger_as_of <= b.ledger_as_of:
                lease.bucket = b
            free = max(0, lease.free()) if keep is None else 0
            need = amounts[i] - free if amounts[i] > free else 0
            waits.append(self._syncs.budget(lease, now, keep, need))
            started.append(i)
        return _mark_refusing(waits, started, refusing)

    def _budget_levels(self, budgets: Sequence[BudgetBucket]) -> tuple[int, ...]:
        levels = []
        for b in budgets:
            lease = self._budgets.get(b.key)
            levels.append(b.ledger_nanos if lease is None else lease.level - lease.free())
        return tuple(levels)

    def _settle(
        self,
        request_id: str,
        budgets: Sequence[BudgetBucket],
        costs: Sequence[int],
        hold_s: float,
        now: float,
    ) -> None:
        if len(costs) != len(budgets):
            raise ValueError("one cost per budget bucket")
        entries = self._entries
        for i, b in enumerate(budgets):
            key = (b.key, request_id)
            if key in entries:
                continue  # settled before, not yet acknowledged
            lease = self._budgets.get(b.key)
            if lease is None:
                lease = self._budgets[b.key] = BudgetLease(self._name(), bucket=b)
            reserved = lease.reserved.pop(request_id, None)
            if reserved is not None:
                lease.reserved_sum -= reserved[0]
            cost = costs[i]
            if cost:
                entry = lease.entry
                if entry is None:
                    lease.entries += 1
                    entry = lease.entry = Entry(f"{lease.name}.{lease.entries}")
                entry.count += 1
                entries[key] = entry
                lease.unreported += cost
                if now + hold_s > lease.hold_until:
                    lease.hold_until = now + hold_s
                lease.used_at = now
            if not lease.touched:
                self._schedule.touch(lease)

    # Shared

    def _commit(
        self,
        request_id: str,
        buckets: Sequence[Bucket],
        slots: Sequence[Slots],
        budgets: Sequence[BudgetBucket],
        amounts: Sequence[int],
        lease_s: float,
        now: float,
        groups: frozenset[int],
    ) -> Admission:
        levels = None
        touch = self._schedule.touch
        if buckets:
            tokens = self._tokens
            for b in buckets:
                lease = tokens[b.key]
                cost = b.cost
                paid = lease.paid
                if paid:
                    # Paid in the store by the sync that brought it: spent, not to report.
                    from_paid = paid if paid < cost else cost
                    lease.paid = paid - from_paid
                    lease.spent += cost - from_paid
                else:
                    lease.spent += cost
                lease.taken += cost
                lease.asked = cost
                lease.used_at = now
                if not lease.touched:
                    touch(lease)
            levels = self._levels(buckets, now, None)
        for s in slots:
            held = self._slots[s.key]
            if request_id not in held.held:
                deadline = now + s.lease_s
                held.held[request_id] = deadline
                held.taken += 1
                held.used_at = now
                if not held.touched:
                    touch(held)
                if deadline < held.lapse_at:
                    held.lapse_at = deadline
        reservation = None
        if budgets:
            deadline = now + lease_s
            for i, budget in enumerate(budgets):
                group = budget.group
                if group == 0 or group in groups:
                    reserved = self._budgets[budget.key]
                    amount = amounts[i]
                    reserved.reserved[request_id] = (amount, deadline)
                    reserved.reserved_sum += amount
                    reserved.taken += amount
                    reserved.asked = amount
                    reserved.used_at = now
                    if not reserved.touched:
                        touch(reserved)
                    if deadline < reserved.lapse_at:
                        reserved.lapse_at = deadline
            reservation = Reservation(True, groups, self._budget_levels(budgets))
        return Admission(levels, None, reservation)

    def _exhausted(
        self,
        step: int,
        buckets: Sequence[Bucket],
        budgets: Sequence[BudgetBucket],
        now: float,
    ) -> Admission:
        """Refused at `step` (the one still short after every attempt), for contention: other
        requests of this replica took each slice as it came. Asked again in a second."""
        levels = self._levels(buckets, now, None) if buckets else None
        if step == _TOKENS_STEP:
            assert levels is not None
            return Admission(Levels(False, levels.remaining, levels.reset_s, 1.0, 0))
        if step == _SLOTS_STEP:
            return Admission(levels, 0)
        refused = Reservation(False, frozenset(), self._budget_levels(budgets), 0)
        return Admission(levels, None, refused)

    def _count_synced(self) -> bool:
        """An admission counted as served locally had to sync after all."""
        self.stats.local -= 1
        self.stats.synced += 1
        return True

    def _name(self) -> str:
        self._leases += 1
        return f"{self._id}.{self._leases}"


async def _first_refused(
    waits: list[Awaitable[Grant]], started: list[T | None], index: Callable[[T], int]
) -> int | None:
    """The lowest index of a started sync that was refused, once every sync has answered."""
    refused = None
    for sent, grant in zip(started, await _all(waits), strict=True):
        if sent is not None and grant.granted < 0:
            at = index(sent)
            if refused is None or at < refused:
                refused = at
    return refused


async def _mark_refusing(
    waits: list[Awaitable[Grant]], started: list[int], refusing: list[bool]
) -> None:
    for i, grant in zip(started, await _all(waits), strict=True):
        if i >= 0 and grant.granted < 0:
            refusing[i] = True


async def _all(waits: Sequence[Awaitable[T]]) -> list[T]:
    """Every answer, in order: one awaited as it is, more at once."""
    if len(waits) == 1:
        return [await waits[0]]
    return list(await asyncio.gather(*waits))


def _index_of(buckets: Sequence[Bucket], bucket: Bucket) -> int:
    return next(i for i, b in enumerate(buckets) if b.key == bucket.key)


def _random_id() -> str:
    import os

    return os.urandom(6).hex()

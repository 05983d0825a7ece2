"""`LocalCounters`: the counters of one replica, kept in plain dicts on its event loop."""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from proxy.limits.store import (
    ACKED_KEEP_S,
    LEDGER_SKEW_S,
    Admission,
    Bucket,
    BudgetBucket,
    Levels,
    Reservation,
    Slots,
)

_TOKENS, _SLOTS, _BUDGETS = 0, 1, 2
"""What a forgetting schedule entry is about (its kind)."""
SWEEP_EVERY_S = 1.0
"""How often a request's `admit` or `finish` forgets what has come to equal "never seen".

Not at every request: a bucket whose limit is far from reached is full again a moment after
each take, so forgetting it at once meant forgetting and storing it again on every request.
Kept a second longer, a full bucket reads as one never seen (its level is capped at capacity),
and so do lapsed slots and an ended window: only memory waits for the sweep."""


_Tokens = tuple[float, float, float]
"""A bucket's state: (level, at, full_at). `level` was measured at `at` (the latest `now` seen,
so a clock behind refills nothing); from `full_at` on the bucket equals one never seen, so its
state can go. A tuple, not a dataclass: a request may make one per bucket, and a tuple is built
in a fraction of the instructions."""


@dataclass(slots=True)
class _Budget:
    expires_at: float | None
    base: int = 0
    as_of: float | None = None
    """When the ledger figure in `base` was read; None until a figure is given."""
    open: dict[str, tuple[int, float]] = field(default_factory=dict)
    """Request id → (amount, deadline) of the reservations in flight."""
    open_sum: int = 0
    unacked: dict[str, tuple[int, float]] = field(default_factory=dict)
    """Request id → (amount, deadline) of settled spend the ledger has not acknowledged. An
    entry `ledgered` moves into `acked` is removed at once: request ids are unique and each is
    settled once, so nothing is kept to recognise a repeat (the hold may last a day)."""
    unacked_sum: int = 0
    acked: dict[int, int] = field(default_factory=dict)
    """Whole second of acknowledgement → spend acknowledged then; only the seconds a figure may
    not cover (see `acked_from`) are kept."""
    acked_sum: int = 0
    acked_seconds: list[int] = field(default_factory=list)
    """A heap of the seconds in `acked`, so forgetting the oldest costs O(log n)."""
    deadlines: list[tuple[float, bool, str]] = field(default_factory=list)
    """A heap of (deadline, settled?, request id), so lapsing costs O(log n), not a scan. An
    entry removed before its deadline (settled, acknowledged) leaves its heap entry behind,
    skipped when it surfaces; `compact` drops them all once they outnumber the live ones."""

    def level(self) -> int:
        return self.base + self.unacked_sum + self.acked_sum + self.open_sum

    def holds(self, request_id: str) -> bool:
        return request_id in self.open or request_id in self.unacked

    def take_figure(self, ledger_nanos: int, as_of: float) -> None:
        """A figure read after the one in `base` replaces it, even when smaller."""
        if self.as_of is None or as_of > self.as_of:
            self.base = ledger_nanos
            self.as_of = as_of

    def acked_from(self, now: float) -> int:
        """The first second of acknowledged spend still counted: the figure may not cover it
        (within `LEDGER_SKEW_S` of its `as_of`, or later), and it is within `ACKED_KEEP_S`."""
        first = math.floor(now - ACKED_KEEP_S)
        if self.as_of is not None:
            first = max(first, math.floor(self.as_of - LEDGER_SKEW_S))
        return first

    def purge(self, now: float) -> None:
        deadlines = self.deadlines
        while deadlines and deadlines[0][0] <= now:
            deadline, settled, request_id = heapq.heappop(deadlines)
            entries = self.unacked if settled else self.open
            entry = entries.get(request_id)
            if entry is None or entry[1] != deadline:
                continue
            del entries[request_id]
            if settled:
                self.unacked_sum -= entry[0]
            else:
                self.open_sum -= entry[0]
        if not self.acked_seconds:
            return
        first = self.acked_from(now)
        while self.acked_seconds and self.acked_seconds[0] < first:
            self.acked_sum -= self.acked.pop(heapq.heappop(self.acked_seconds))

    def compact(self) -> None:
        """Rebuild `deadlines` from the live entries once it holds more left-behind entries
        than live ones: O(live) per rebuild, less than the left-behind entries it drops, so
        amortised O(1) per removal."""
        live = len(self.open) + len(self.unacked)
        if len(self.deadlines) <= 2 * live:
            return
        self.deadlines = [(deadline, False, r) for r, (_, deadline) in self.open.items()]
        self.deadlines += [(deadline, True, r) for r, (_, deadline) in self.unacked.items()]
        heapq.heapify(self.deadlines)

    def reserve(self, request_id: str, amount: int, deadline: float) -> None:
        self.open[request_id] = (amount, deadline)
        self.open_sum += amount
        heapq.heappush(self.deadlines, (deadline, False, request_id))

    def settle(self, request_id: str, cost: int, deadline: float) -> None:
        if request_id in self.unacked:
            return
        reserved = self.open.pop(request_id, None)
        if reserved is not None:
            self.open_sum -= reserved[0]
        if cost:
            self.unacked[request_id] = (cost, deadline)
            self.unacked_sum += cost
            heapq.heappush(self.deadlines, (deadline, True, request_id))
        if reserved is not None:
            self.compact()

    def ledgered(self, request_id: str, now: float) -> None:
        entry = self.unacked.pop(request_id, None)
        if entry is None:
            return
        self.unacked_sum -= entry[0]
        self.compact()
        second = math.floor(now)
        if second not in self.acked:
            self.acked[second] = 0
            heapq.heappush(self.acked_seconds, second)
        self.acked[second] += entry[0]
        self.acked_sum += entry[0]


class LocalCounters:
    """`Counters` for a single replica (or while Redis is unreachable).

    Not thread-safe: the event loop owns it, and no method awaits between its check and its
    commit, so each call is atomic. State that equals "never seen" (a full token bucket, a
    window past `expires_at`, slots all released or lapsed) is forgotten within a second
    (`SWEEP_EVERY_S`), so memory follows the keys in use rather than every key ever seen.

    Every request passes through `admit` and `finish`: their loops are written out (no
    comprehensions, no `zip`), which measured a good part of a governed request's cost.
    """

    def __init__(self) -> None:
        self._tokens: dict[str, _Tokens] = {}
        self._slots: dict[str, dict[str, float]] = {}
        self._budgets: dict[str, _Budget] = {}
        # At most one entry per (kind, key): a popped entry whose state lives on is pushed again
        # with its new time, so the heap never grows with the number of calls.
        self._forget: list[tuple[float, int, str]] = []
        self._scheduled: tuple[set[str], set[str], set[str]] = (set(), set(), set())
        """The keys with an entry in `_forget`, by kind."""
        self._sweep_at = -math.inf
        """When `admit` and `finish` sweep next."""

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
        if now >= self._sweep_at:
            self._sweep(now)
        # Every step is checked before anything is written (the reservation, last, writes
        # only when it admits), so a refusal has nothing to give back.
        levels = None
        if buckets:
            levels = self._take(buckets, now)
            if not levels.admitted:
                return Admission(levels)
        for i, s in enumerate(slots):
            if not self._slot_free(s, request_id, now):
                return Admission(levels, i)
        reservation = None
        if budgets:
            reservation = self._reserve(request_id, budgets, amounts, lease_s, now)
            if not reservation.admitted:
                return Admission(levels, None, reservation)
        if levels is not None:
            self._keep(buckets, levels.remaining, levels.reset_s, now)
        for s in slots:
            self._hold(s, request_id, now)
        return Admission(levels, None, reservation)

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
        if now >= self._sweep_at:
            self._sweep(now)
        if adjust:
            self._adjust(adjust, now)
        for s in slots:
            self._release(s, request_id)
        if budgets or costs:
            self._settle(request_id, budgets, costs, hold_s, now)

    async def take(self, buckets: Sequence[Bucket], now: float) -> Levels:
        self._sweep(now)
        levels = self._take(buckets, now)
        if levels.admitted:
            self._keep(buckets, levels.remaining, levels.reset_s, now)
        return levels

    async def adjust(self, buckets: Sequence[Bucket], now: float) -> None:
        self._sweep(now)
        self._adjust(buckets, now)

    async def acquire(self, slots: Slots, request_id: str, now: float) -> bool:
        self._sweep(now)
        if not self._slot_free(slots, request_id, now):
            return False
        self._hold(slots, request_id, now)
        return True

    async def release(self, slots: Slots, request_id: str) -> None:
        self._release(slots, request_id)

    async def reserve(
        self,
        request_id: str,
        buckets: Sequence[BudgetBucket],
        amounts: Sequence[int],
        lease_s: float,
        now: float,
    ) -> Reservation:
        self._sweep(now)
        return self._reserve(request_id, buckets, amounts, lease_s, now)

    async def settle(
        self,
        request_id: str,
        buckets: Sequence[BudgetBucket],
        costs: Sequence[int],
        hold_s: float,
        now: float,
    ) -> None:
        self._sweep(now)
        self._settle(request_id, buckets, costs, hold_s, now)

    async def ledgered(self, entries: Sequence[tuple[str, str]], now: float) -> None:
        self._sweep(now)
        for key, request_id in entries:
            state = self._budgets.get(key)
            if state is None or (state.expires_at is not None and state.expires_at <= now):
                continue
            state.purge(now)
            state.ledgered(request_id, now)

    async def close(self) -> None:
        pass

    def _take(self, buckets: Sequence[Bucket], now: float) -> Levels:
        """`take`'s check: the levels after it when it admits (nothing is stored yet), the
        levels as they are when it refuses."""
        tokens = self._tokens
        after: list[float] = []
        reset: list[float] = []
        refused = None
        for i, b in enumerate(buckets):
            capacity, per_second, cost = b.capacity, b.per_second, b.cost
            # `_refilled`, written out.
            state = tokens.get(b.key)
            if state is None:
                level = capacity
            else:
                level, at, _ = state
                elapsed = now - at
                level += (elapsed if elapsed > 0.0 else 0.0) * per_second
                if not level < capacity:
                    level = capacity
            if refused is None and level < cost:
                refused = i
            left = level - cost
            after.append(left)
            # `until_full(b, left)`, for `levels_of` when it admits.
            if left >= capacity:
                reset.append(0.0)
            else:
                reset.append((capacity - left) / per_second if per_second > 0 else math.inf)
        if refused is not None:
            found = [self._refilled(b, now) for b in buckets]
            return levels_of(buckets, found, refused)
        return Levels(True, tuple(after), tuple(reset), 0.0, None)

    def _adjust(self, buckets: Sequence[Bucket], now: float) -> None:
        levels: list[float] = []
        to_full: list[float] = []
        for b in buckets:
            level = self._refilled(b, now) - b.cost
            levels.append(level)
            to_full.append(until_full(b, level))
        self._keep(buckets, levels, to_full, now)

    def _slot_free(self, slots: Slots, request_id: str, now: float) -> bool:
        """Whether `request_id` holds a slot, or may take one."""
        held = self._slots.get(slots.key)
        if held is None:
            return slots.limit > 0
        if len(held) < slots.limit or held.get(request_id, -math.inf) > now:
            # Fewer held than the limit, lapsed ones included: no need to count the live ones.
            return True
        return sum(1 for deadline in held.values() if deadline > now) < slots.limit

    def _hold(self, slots: Slots, request_id: str, now: float) -> None:
        """Hold a slot for `request_id` (one held already keeps its lease); lapsed ones go."""
        held = self._slots.get(slots.key)
        if held is None:
            held = self._slots[slots.key] = {}
        elif lapsed := [r for r, deadline in held.items() if deadline <= now]:
            for r in lapsed:
                del held[r]
        if request_id in held:
            return
        deadline = now + slots.lease_s
        held[request_id] = deadline
        self._schedule(_SLOTS, slots.key, deadline)

    def _release(self, slots: Slots, request_id: str) -> None:
        held = self._slots.get(slots.key)
        if held is None:
            return
        held.pop(request_id, None)
        if not held:
            del self._slots[slots.key]

    def _reserve(
        self,
        request_id: str,
        buckets: Sequence[BudgetBucket],
        amounts: Sequence[int],
        lease_s: float,
        now: float,
    ) -> Reservation:
        states: list[_Budget] = []
        levels: list[int] = []
        repeat = grouped = False
        for b in buckets:
            state = self._budget(b, now)
            states.append(state)
            levels.append(state.base + state.unacked_sum + state.acked_sum + state.open_sum)
            if request_id in state.open or request_id in state.unacked:
                repeat = True
            if b.group != 0:
                grouped = True
        if repeat:
            # A repeat (say, a retry after a timeout): report what the first call did.
            return Reservation(
                admitted=True,
                groups=frozenset(
                    b.group
                    for b, s in zip(buckets, states, strict=True)
                    if b.group > 0 and s.holds(request_id)
                ),
                levels=tuple(levels),
            )
        if len(amounts) != len(buckets):
            raise ValueError("one amount per budget bucket")
        refused: int | None = None
        survivors = _NO_GROUPS
        if grouped:
            refusing = [
                b.blocking and level + amount > b.limit_nanos
                for b, level, amount in zip(buckets, levels, amounts, strict=True)
            ]
            refused, survivors = _decide(buckets, refusing)
        else:
            # Every bucket applies whichever provider serves: the first blocking one without
            # room refuses (`_decide` without groups).
            for i, b in enumerate(buckets):
                if b.blocking and levels[i] + amounts[i] > b.limit_nanos:
                    refused = i
                    break
        if refused is not None:
            return Reservation(False, _NO_GROUPS, tuple(levels), refused)
        deadline = now + lease_s
        for i, b in enumerate(buckets):
            if b.group == 0 or b.group in survivors:
                amount = amounts[i]
                states[i].reserve(request_id, amount, deadline)
                levels[i] += amount
        return Reservation(True, survivors, tuple(levels))

    def _settle(
        self,
        request_id: str,
        buckets: Sequence[BudgetBucket],
        costs: Sequence[int],
        hold_s: float,
        now: float,
    ) -> None:
        if len(costs) != len(buckets):
            raise ValueError("one cost per budget bucket")
        deadline = now + hold_s
        for i, b in enumerate(buckets):
            self._budget(b, now).settle(request_id, costs[i], deadline)

    def _refilled(self, bucket: Bucket, now: float) -> float:
        state = self._tokens.get(bucket.key)
        if state is None:
            return bucket.capacity
        level, at, _ = state
        elapsed = now - at
        level += (elapsed if elapsed > 0.0 else 0.0) * bucket.per_second
        return level if level < bucket.capacity else bucket.capacity

    def _keep(
        self,
        buckets: Sequence[Bucket],
        levels: Sequence[float],
        to_full: Sequence[float],
        now: float,
    ) -> None:
        """Store each bucket's level with the seconds until it is full again (`until_full`,
        which `_take` has worked out already for the levels it admits at); a full bucket is
        forgotten."""
        tokens = self._tokens
        scheduled = self._scheduled[_TOKENS]
        for i, b in enumerate(buckets):
            key, level = b.key, levels[i]
            if level >= b.capacity:
                tokens.pop(key, None)
                continue
            old = tokens.get(key)
            at = now if old is None or now > old[1] else old[1]
            full_at = at + to_full[i]
            tokens[key] = (level, at, full_at)
            if key not in scheduled:
                scheduled.add(key)
                heapq.heappush(self._forget, (full_at, _TOKENS, key))

    def _budget(self, bucket: BudgetBucket, now: float) -> _Budget:
        """The bucket's state, with a newer ledger figure as its base, purged of what lapsed."""
        key, expires_at = bucket.key, bucket.expires_at
        state = self._budgets.get(key)
        if state is None or (state.expires_at is not None and state.expires_at <= now):
            state = _Budget(expires_at=expires_at)
            self._budgets[key] = state
        as_of = bucket.ledger_as_of
        if state.as_of is None or as_of > state.as_of:
            # `take_figure`
            state.base = bucket.ledger_nanos
            state.as_of = as_of
        state.expires_at = expires_at
        if expires_at is not None:
            self._schedule(_BUDGETS, key, expires_at)
        state.purge(now)
        return state

    def _schedule(self, kind: int, key: str, when: float) -> None:
        scheduled = self._scheduled[kind]
        if key not in scheduled:
            scheduled.add(key)
            heapq.heappush(self._forget, (when, kind, key))

    def _sweep(self, now: float) -> None:
        """Forget what has come to equal "never seen" by `now`."""
        self._sweep_at = now + SWEEP_EVERY_S
        forget = self._forget
        while forget and forget[0][0] <= now:
            _, kind, key = heapq.heappop(forget)
            self._scheduled[kind].discard(key)
            if kind == _TOKENS:
                tokens = self._tokens.get(key)
                when = None if tokens is None else tokens[2]
            else:
                when = self._forget_at(kind, key)
            if when is None:
                continue
            if when > now:
                self._schedule(kind, key, when)
            elif kind == _TOKENS:
                del self._tokens[key]
            elif kind == _SLOTS:
                del self._slots[key]
            else:
                del self._budgets[key]

    def _forget_at(self, kind: int, key: str) -> float | None:
        if kind == _TOKENS:
            tokens = self._tokens.get(key)
            return None if tokens is None else tokens[2]
        if kind == _SLOTS:
            held = self._slots.get(key)
            return None if held is None else max(held.values(), default=-math.inf)
        budget = self._budgets.get(key)
        return None if budget is None else budget.expires_at


_NO_GROUPS: frozenset[int] = frozenset()


def _decide(
    buckets: Sequence[BudgetBucket], refusing: Sequence[bool]
) -> tuple[int | None, frozenset[int]]:
    """`reserve`'s rule: (the refusing bucket's index, or None when admitted; the groups > 0
    that can still pay)."""
    for i, b in enumerate(buckets):
        if b.group == 0 and refusing[i]:
            return i, frozenset()
    given = {b.group for b in buckets if b.group > 0}
    dropped = {b.group for b, no in zip(buckets, refusing, strict=True) if b.group > 0 and no}
    if given and given <= dropped:
        last = max(given)
        return next(
            i for i, b in enumerate(buckets) if b.group == last and refusing[i]
        ), frozenset()
    return None, frozenset(given - dropped)


def levels_of(buckets: Sequence[Bucket], levels: Sequence[float], refused: int | None) -> Levels:
    """What a take reports, from the levels it left (found, when refused): shared with
    `LeasedCounters`, which knows just the levels."""
    if len(levels) != len(buckets):
        raise ValueError("one level per bucket")
    reset: list[float] = []
    retry_after: float | None = None
    for i, b in enumerate(buckets):
        level = levels[i]
        capacity, per_second = b.capacity, b.per_second
        # `until_full`
        if level >= capacity:
            reset.append(0.0)
        else:
            reset.append((capacity - level) / per_second if per_second > 0 else math.inf)
        if refused is not None and level < b.cost:
            wait = until_holds(b, level)
            if retry_after is None or wait > retry_after:
                retry_after = wait
    if refused is None:
        retry_after = 0.0
    elif retry_after is None:
        raise ValueError("a refused take names no bucket short of its cost")
    return Levels(refused is None, tuple(levels), tuple(reset), retry_after, refused)


def until_full(bucket: Bucket, level: float) -> float:
    if level >= bucket.capacity:
        return 0.0
    return (bucket.capacity - level) / bucket.per_second if bucket.per_second > 0 else math.inf


def until_holds(bucket: Bucket, level: float) -> float:
    return (bucket.cost - level) / bucket.per_second if bucket.per_second > 0 else math.inf

"""The counters rate limits and budgets are kept in: the Protocol, and what it trades in.

Two implementations keep the same semantics: `LocalCounters` (in-process, one replica) and
`LeasedCounters` (shared by every replica through Redis, spent from leased slices). Every call
takes `now` from the caller's clock (unix seconds), so tests drive time and replicas agree on it
within their clocks' skew.

What the calls take and give are built for every request, several times over: they are plain
slotted dataclasses, never changed once built, rather than frozen ones (a frozen dataclass sets
each field through `object.__setattr__`, about 1,200 more CPU instructions a field; measured
with callgrind, 38,000 instructions of a governed request). `Slots`, built once per bundle,
stays frozen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

LEDGER_SKEW_S = 2.0
"""Clocks of replicas and control plane may disagree by this much: spend acknowledged this
close to a ledger figure's `as_of` is counted on top of it (twice, at worst, briefly)."""
ACKED_KEEP_S = 900.0
"""Acknowledged spend is counted on top of a ledger figure older than itself for this long at
most; a key's bundle (and with it the figure) is refreshed well within it."""


@dataclass(slots=True)
class Bucket:
    """One token bucket to take from: rpm, rpd or tpm of a key or a team."""

    key: str
    """Names the bucket, e.g. `rl:vk:<id>:rpm`; the same on every replica."""
    capacity: float
    """The limit: a full bucket admits this much at once."""
    per_second: float
    """Refill rate: capacity over the window (rpm: capacity / 60)."""
    cost: float
    """What this request takes: 1 for requests, the token estimate for tpm."""


@dataclass(slots=True)
class Levels:
    """What `take` found: whether everything was taken, and each bucket's state after."""

    admitted: bool
    remaining: tuple[float, ...]
    """Per bucket, in the order given: its level after the take (before it, when refused)."""
    reset_s: tuple[float, ...]
    """Per bucket: seconds until it is full again."""
    retry_after_s: float
    """When refused: seconds until every refusing bucket holds its cost again; else 0."""
    refused: int | None = None
    """When refused: the index of the first bucket that could not give its cost."""


@dataclass(frozen=True, slots=True)
class Slots:
    """A concurrency limit: at most `limit` requests hold a slot at once."""

    key: str
    limit: int
    lease_s: float
    """A slot not released after this long is freed (its replica died)."""


@dataclass(slots=True)
class BudgetBucket:
    """One budget's current window (and, for a per-end-user budget, one end user's share)."""

    key: str
    """`bg:<budget id>:<window start>[:<end user>]`: a new window is a new bucket."""
    limit_nanos: int
    ledger_nanos: int
    """The window's spend the ledger reported (in the key's bundle, or for one end user)."""
    ledger_as_of: float
    """When the control plane read `ledger_nanos` from the ledger (unix seconds; 0 when not
    known). A bucket keeps the newest figure it was given as its base, and its `as_of`: spend
    acknowledged by the ledger before `as_of - LEDGER_SKEW_S` is in that figure; spend
    acknowledged later may not be, and is counted on top until a newer figure covers it."""
    blocking: bool
    """`on_breach: block`. A `warn` budget is reserved against (so its level counts the
    requests in flight) but never refuses."""
    group: int
    """0: applies whichever provider serves. i > 0: a provider-filtered budget of the i-th
    provider group (see `reserve`)."""
    expires_at: float | None
    """Unix seconds after which the bucket's state may be forgotten (window end plus a margin);
    None for a `total` budget."""


@dataclass(slots=True)
class Reservation:
    """What `reserve` did."""

    admitted: bool
    groups: frozenset[int]
    """The provider groups that can still pay (every group > 0 given whose blocking buckets all
    had room); the caller removes the other groups' providers from the chain."""
    levels: tuple[int, ...]
    """Per bucket, in the order given: its level (see `Counters.reserve`), in nano-USD,
    after this reservation (before it, when refused)."""
    refused: int | None = None
    """When not admitted: the index of the blocking bucket that refused (the first in the order
    given, among group 0, or among the last provider group when every group was out)."""


@dataclass(slots=True)
class Admission:
    """What `admit` did: refused at the first step that refused, or everything taken."""

    levels: Levels | None
    """The token buckets' take as computed (their levels after it), also when a later step
    refused and the take was given back; None when no bucket was given."""
    slots_refused: int | None = None
    """The index of the first concurrency limit that was full (the take was given back)."""
    reservation: Reservation | None = None
    """The budgets' reservation; None when no budget was given or an earlier step refused."""

    @property
    def admitted(self) -> bool:
        return (
            (self.levels is None or self.levels.admitted)
            and self.slots_refused is None
            and (self.reservation is None or self.reservation.admitted)
        )


class Counters(Protocol):
    """Shared counters; every method is atomic across everything it touches.

    A request makes two calls: `admit` before its provider is called and `finish` after; the
    single-purpose methods are what those two are made of.
    """

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
        """`take(buckets)`, then `acquire` each of `slots`, then `reserve(budgets, amounts)`,
        as one atomic step, all or nothing: the first step that refuses ends it, and what the
        steps before it took is given back (the state is as if nothing was asked). Steps with
        nothing given are skipped. Asked again with the same request id, the take is made
        again; slots and reservations are not."""

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
        """`adjust(adjust)`, `release` each of `slots` and `settle(budgets, costs)` as one
        atomic step (each part skipped when given nothing)."""

    async def take(self, buckets: Sequence[Bucket], now: float) -> Levels:
        """Take each bucket's cost from it, all or none: refill each to
        `min(capacity, level + elapsed * per_second)` first; refuse when any holds less than
        its cost. A full bucket of a key never seen is at capacity."""

    async def adjust(self, buckets: Sequence[Bucket], now: float) -> None:
        """Take each `cost` (negative gives back) without a check, after refilling: a level may
        go below zero (spent more than estimated) and never above capacity."""

    async def acquire(self, slots: Slots, request_id: str, now: float) -> bool:
        """Hold a slot for `request_id` unless `limit` are held; idempotent per request id."""

    async def release(self, slots: Slots, request_id: str) -> None:
        """Free `request_id`'s slot, if it holds one."""

    async def reserve(
        self,
        request_id: str,
        buckets: Sequence[BudgetBucket],
        amounts: Sequence[int],
        lease_s: float,
        now: float,
    ) -> Reservation:
        """Reserve `amounts[i]` nano-USD in `buckets[i]` for `request_id`, atomically.

        First, a bucket given a `ledger_as_of` newer than its own takes `ledger_nanos` as its
        base and that `as_of` (an older or equal figure changes nothing). A bucket's level is
        base + unacknowledged settled spend + spend acknowledged at or after
        `as_of - LEDGER_SKEW_S` (and within `ACKED_KEEP_S` of now) + open reservations.
        A blocking bucket refuses when `level + amount > limit_nanos`. If a blocking bucket of
        group 0 refuses, nothing is reserved. Otherwise every provider group (> 0) with a
        refusing blocking bucket is dropped; if groups > 0 were given and all were dropped,
        nothing is reserved and the result is refused. Else the amounts of group 0 and the
        surviving groups are reserved (none of the dropped ones). An open reservation not
        settled within `lease_s` lapses. Idempotent per request id: reserving again changes
        nothing.
        """

    async def settle(
        self,
        request_id: str,
        buckets: Sequence[BudgetBucket],
        costs: Sequence[int],
        hold_s: float,
        now: float,
    ) -> None:
        """End `request_id`'s reservations in `buckets`: each becomes `costs[i]` of
        unacknowledged spend (nothing when 0), counted until `ledgered` names it or `hold_s`
        passes. Settling twice before `ledgered` names it adds nothing twice; once it has been
        acknowledged nothing of it is kept, so settling it again would add it again (request
        ids are unique and a request is settled once, so this does not happen). A request that
        reserved nothing is settled too: its cost counts, once."""

    async def ledgered(self, entries: Sequence[tuple[str, str]], now: float) -> None:
        """(bucket key, request id) pairs whose spend the ledger acknowledged at `now`: each
        moves, once, from unacknowledged to acknowledged-at-`now` (still counted, until a
        ledger figure read after `now + LEDGER_SKEW_S` replaces the base), and the request's
        entry in the bucket is removed. A pair naming nothing unacknowledged (never settled,
        lapsed, acknowledged already, or named twice) does nothing."""

    async def close(self) -> None: ...

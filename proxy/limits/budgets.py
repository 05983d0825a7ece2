"""Budgets that hold under concurrency: reserve the worst case before paying, settle the actual.

A budget's level is what the ledger counted in its window (from the key's bundle, with the time
it was read), plus spend settled but not yet in that figure, plus the reservations of requests
in flight, on this replica or, with Redis, on every replica. A request is admitted only if its
worst-case cost fits under every blocking budget it falls under, so concurrent requests cannot
overspend, and the check never waits for the ledger. When the spool segment holding a request's
outcome is acknowledged, its spend is marked acknowledged (`ledgered_through`); a ledger figure
read after that covers it, and replaces it (see `Counters.reserve`).
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import itertools
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from cachetools import LRUCache

from proxy.errors import ProxyError
from proxy.limits.cost import Units
from proxy.limits.store import BudgetBucket, Counters, Reservation
from proxy.providers import Upstream
from vkgate.clock import Clock, unix_seconds
from vkgate.errors import ErrorCode
from vkgate.money import nanos_to_usd, usd_to_nanos
from vkgate.spend import BudgetBucketSpend, SpendRecord
from vkgate.windows import WINDOWS, window_bounds
from vkgate.wire import BudgetState

log = logging.getLogger("vkgate.proxy.limits")

WARN_AT = 0.8
"""A `warn` budget adds `X-Vkgate-Budget-Warning` from this share of its limit."""
HOLD_S = 86_400.0
"""Settled spend not acknowledged by the ledger within this long stops being counted: longer than
a control plane may be away while cached keys are still served (`hard_grace_s`, 6 h by default),
so spend keeps counting through an outage."""
WINDOW_MARGIN_S = 2 * 86_400.0
"""How long a closed window's counters are kept (a request that started in it may still settle)."""
END_USER_SPEND_TTL_S = 60.0
KEPT_BUCKETS = 100_000
"""Budget buckets kept for reuse (one per rule and window) before they are all dropped."""
UNWRITTEN_MAX = 100_000
"""Settlements remembered for outcomes the spool holds in memory (as many as it holds)."""
LEDGERED_CHUNK = 256
"""Settled amounts handed to the counters per call once the ledger has them, the event loop
free between calls: a full segment's 2,400 in one call held it for 5-12 ms (a Redis script, the
Redis server likewise)."""


@dataclass(frozen=True, slots=True)
class BudgetRule:
    """A budget as the proxy enforces it, compiled once per bundle."""

    budget_id: str
    name: str | None
    scope_kind: str
    scope_id: str | None
    window: str
    limit_usd: str
    limit_nanos: int
    ledger_nanos: int
    """The ledger's spend in the window the bundle was built in (`ledger_window`)."""
    ledger_window: float | None
    """That window's start, unix seconds; None for `total`."""
    ledger_as_of: float
    """When the control plane read `ledger_nanos` (unix seconds; 0 when it did not say)."""
    blocking: bool
    provider_id: str | None
    per_end_user: bool
    """An `end_user` budget without an id: each end user has an allowance of their own."""

    @property
    def label(self) -> str:
        name = f" {self.name!r}" if self.name else ""
        scope = self.scope_kind if self.scope_id is None else f"{self.scope_kind} {self.scope_id}"
        return f"budget {self.budget_id}{name} ({scope}, {self.window})"


def rules_of(states: Sequence[BudgetState]) -> tuple[BudgetRule, ...]:
    rules = []
    for state in states:
        rules.append(
            BudgetRule(
                budget_id=state.budget_id,
                name=state.name,
                scope_kind=state.scope_kind,
                scope_id=state.scope_id,
                window=state.window,
                limit_usd=state.limit_usd,
                limit_nanos=usd_to_nanos(state.limit_usd),
                ledger_nanos=usd_to_nanos(state.spent_usd),
                ledger_window=unix_seconds(state.window_start),
                ledger_as_of=unix_seconds(state.spent_as_of) or 0.0,
                blocking=state.on_breach != "warn",
                provider_id=state.provider_id,
                per_end_user=state.scope_kind == "end_user" and state.scope_id is None,
            )
        )
    return tuple(rules)


class BucketSpendSource(Protocol):
    """Where a per-end-user bucket's ledger spend comes from (the control plane)."""

    async def bucket_spend(self, budget_id: str, end_user: str) -> BudgetBucketSpend: ...


@dataclass(slots=True)
class Worst:
    """What a request asks for, to price its worst case on each credential (built per request:
    not frozen, see `proxy.limits.store`)."""

    input_tokens: int
    output_tokens: int | None
    """`max_tokens` times `n`, when the request bounds its output."""
    units: Units | None = None
    """An audio or image request's most characters, seconds and images."""

    def cost(self, upstream: Upstream, default_output: int) -> int:
        if upstream.rates is None:
            return 0
        output = self.output_tokens
        if output is None:
            output = upstream.max_output_tokens or default_output
        return upstream.rates.worst(self.input_tokens, output, self.units)


@dataclass(slots=True)
class BudgetAsk:
    """What one request asks of the budgets it falls under: a bucket and an amount each."""

    buckets: list[BudgetBucket]
    amounts: list[int]
    rules: list[BudgetRule]
    groups: dict[str, int]
    """Provider → its group, for providers of the chain with filtered budgets."""
    worst: dict[str, int]
    """Provider → the most a request may cost through it (its costliest model in the chain)."""

    def without_groups(self) -> BudgetAsk:
        """The ask without the provider-filtered budgets and their providers: what is left is
        reserved at the most the remaining providers may cost."""
        kept = [i for i, b in enumerate(self.buckets) if b.group == 0]
        worst = {p: c for p, c in self.worst.items() if p not in self.groups}
        amount = max(worst.values(), default=0)
        return BudgetAsk(
            [self.buckets[i] for i in kept],
            [amount] * len(kept),
            [self.rules[i] for i in kept],
            {},
            worst,
        )

    def costs(self, provider_id: str | None, cost: int) -> list[int]:
        """What each bucket is charged when `provider_id` served for `cost` (none served: 0)."""
        if provider_id is None:
            return [0] * len(self.buckets)
        if not self.groups:
            charged: list[int] = []
            for b in self.buckets:
                charged.append(cost if b.group == 0 else 0)
            return charged
        providers = {g: p for p, g in self.groups.items()}
        return [
            cost if b.group == 0 or providers.get(b.group) == provider_id else 0
            for b in self.buckets
        ]


class BudgetGuard:
    """Works out what a request asks of its budgets, and what their answer means."""

    def __init__(
        self,
        counters: Counters,
        clock: Clock,
        *,
        spend_source: BucketSpendSource | None,
        default_output_tokens: int,
    ) -> None:
        self._counters = counters
        self._clock = clock
        self._source = spend_source
        self._default_output = default_output_tokens
        self._pending: list[tuple[int, int, list[tuple[str, str]]]] = []
        self._unwritten: deque[tuple[SpendRecord, list[tuple[str, str]]]] = deque(
            maxlen=UNWRITTEN_MAX
        )
        """A heap of (record seq, tiebreak, charged buckets): settlements finish out of order."""
        self._tiebreak = itertools.count()
        self._end_users: LRUCache[tuple[str, float | None, str], tuple[int, float, float]] = (
            LRUCache(100_000)
        )
        """(budget, window, end user) → (ledger nanos, as of, fetched at monotonic)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._windows: dict[str, tuple[float | None, float | None]] = {}
        self._kept: dict[int, tuple[BudgetRule, float | None, int, BudgetBucket, int]] = {}
        """id(rule) → (rule, window start, group, its bucket, `_learnt` when last checked): see
        `_bucket_of`."""
        self._windows_until = 0.0
        self._figures: dict[tuple[str, float | None], tuple[int, float]] = {}
        """(budget, window start) → the newest ledger figure any bundle brought: (nanos, as of).
        (Dropped at KEPT_BUCKETS entries: the counters keep the newest figure they were given.)"""
        self._learnt = 0
        """Counts the figures `learn` took: a kept bucket checked since the last is current."""

    def learn(self, rules: Sequence[BudgetRule]) -> None:
        """Keep the newest ledger figure of each budget among `rules` (a bundle just fetched):
        every key under a budget counts from it, whichever key's bundle brought it. (When only
        a budget's spend moved, one key's bundle is fetched again, not every key's.)"""
        figures = self._figures
        for rule in rules:
            if rule.per_end_user or not rule.ledger_as_of:
                continue
            key = (rule.budget_id, rule.ledger_window)
            known = figures.get(key)
            if known is None or rule.ledger_as_of > known[1]:
                if len(figures) >= KEPT_BUCKETS:
                    figures.clear()
                figures[key] = (rule.ledger_nanos, rule.ledger_as_of)
                self._learnt += 1

    def _current_windows(self, now: float) -> dict[str, tuple[float | None, float | None]]:
        """Each window's (start, end) at `now` (unix seconds); worked out again at the next
        end."""
        if now >= self._windows_until:
            moment = datetime.fromtimestamp(now, UTC)
            windows: dict[str, tuple[float | None, float | None]] = {}
            for window in WINDOWS:
                start, end = window_bounds(window, moment)
                windows[window] = (
                    start.timestamp() if start else None,
                    end.timestamp() if end else None,
                )
            self._windows = windows
            # Buckets of the windows that ended, and of rules no bundle holds any more, go.
            self._kept.clear()
            # A clock set back (tests, or a corrected host clock) is caught at the next day.
            self._windows_until = windows["day"][1] or 0.0
        return self._windows

    async def ask(
        self,
        rules: Sequence[BudgetRule],
        chain: tuple[Upstream, ...],
        end_user: str | None,
        worst: Worst,
    ) -> BudgetAsk | None:
        """The buckets the request falls under and its worst case in each; None when none.

        Raises `400 end_user_required` for a per-end-user budget and no end user.
        """
        return await self.ask_at(rules, chain, end_user, worst, self._clock.time())

    async def ask_at(
        self,
        rules: Sequence[BudgetRule],
        chain: tuple[Upstream, ...],
        end_user: str | None,
        worst: Worst,
        now: float,
    ) -> BudgetAsk | None:
        """`ask` at `now` (unix seconds), read once by the caller."""
        windows = self._current_windows(now)
        groups: dict[str, int] = {}
        buckets: list[BudgetBucket] = []
        applied: list[BudgetRule] = []
        for rule in rules:
            if rule.scope_kind == "end_user":
                if end_user is None:
                    if rule.per_end_user:
                        raise end_user_required(rule)
                    continue
                if not rule.per_end_user and rule.scope_id != end_user:
                    continue
            group = 0
            if rule.provider_id is not None:
                if not any(u.provider_id == rule.provider_id for u in chain):
                    continue
                group = groups.setdefault(rule.provider_id, len(groups) + 1)
            start_ts, end_ts = windows[rule.window]
            if rule.per_end_user:
                assert end_user is not None
                bucket = await self._end_user_bucket(rule, end_user, group, start_ts, end_ts)
            else:
                bucket = self._bucket_of(rule, group, start_ts, end_ts)
            buckets.append(bucket)
            applied.append(rule)
        if not buckets:
            return None
        default_output = self._default_output
        by_provider: dict[str, int] = {}
        for upstream in chain:
            cost = worst.cost(upstream, default_output)
            provider_id = upstream.provider_id
            if cost > by_provider.get(provider_id, -1):
                by_provider[provider_id] = cost
        most = max(by_provider.values())
        if not groups:
            # Every bucket is of group 0.
            return BudgetAsk(buckets, [most] * len(buckets), applied, groups, by_provider)
        by_group = {0: most}
        for provider_id, group in groups.items():
            by_group[group] = by_provider[provider_id]
        amounts = [by_group[b.group] for b in buckets]
        return BudgetAsk(buckets, amounts, applied, groups, by_provider)

    async def _end_user_bucket(
        self,
        rule: BudgetRule,
        end_user: str,
        group: int,
        start_ts: float | None,
        end_ts: float | None,
    ) -> BudgetBucket:
        """One end user's share of a per-end-user budget, in the window from `start_ts`."""
        ledger, as_of = await self._end_user_ledger(rule, end_user, start_ts)
        user = hashlib.blake2b(end_user.encode(), digest_size=12).hexdigest()
        return _bucket(rule, group, start_ts, end_ts, ledger, as_of, f":{user}")

    def _bucket_of(
        self, rule: BudgetRule, group: int, start_ts: float | None, end_ts: float | None
    ) -> BudgetBucket:
        """The bucket of a rule not per end user in the window from `start_ts`: the same for
        every request of the window (and of the bundle the rule came with), so kept, and shared
        by those requests (nothing changes a bucket once built), until any key's bundle brings
        a newer figure of its budget (`learn`)."""
        kept = self._kept.get(id(rule))
        learnt = self._learnt
        # The entry holds `rule`: while it is kept, no other object can have its id.
        if kept is not None and kept[0] is rule and kept[1] == start_ts and kept[2] == group:
            if kept[4] == learnt:
                return kept[3]
            # Figures were learnt since: rebuilt only if its budget's is newer.
            newer = self._figures.get((rule.budget_id, start_ts))
            if newer is None or newer[1] <= kept[3].ledger_as_of:
                self._kept[id(rule)] = (rule, start_ts, group, kept[3], learnt)
                return kept[3]
        else:
            newer = self._figures.get((rule.budget_id, start_ts))
        if rule.ledger_window == start_ts:
            ledger, as_of = rule.ledger_nanos, rule.ledger_as_of
        else:
            # A bundle built in an earlier window says nothing of this one.
            ledger, as_of = 0, 0.0
        if newer is not None and newer[1] > as_of:
            ledger, as_of = newer
        bucket = _bucket(rule, group, start_ts, end_ts, ledger, as_of)
        if len(self._kept) >= KEPT_BUCKETS:
            self._kept.clear()
        self._kept[id(rule)] = (rule, start_ts, group, bucket, learnt)
        return bucket

    @staticmethod
    def retry_without_groups(
        ask: BudgetAsk, reservation: Reservation, chain: tuple[Upstream, ...]
    ) -> tuple[BudgetAsk, tuple[Upstream, ...]] | None:
        """When every provider with a filtered budget is out but the chain has others: the ask
        and chain to try again with, without them."""
        if (
            reservation.refused is None
            or ask.buckets[reservation.refused].group == 0
            or all(u.provider_id in ask.groups for u in chain)
        ):
            return None
        kept = tuple(u for u in chain if u.provider_id not in ask.groups)
        return ask.without_groups(), kept

    @staticmethod
    def conclude(
        ask: BudgetAsk, reservation: Reservation, chain: tuple[Upstream, ...]
    ) -> tuple[tuple[Upstream, ...], bytes | None]:
        """The chain left (providers whose filtered budgets are out removed) and the warning
        header's value; raises `402 budget_exceeded` when the reservation was refused."""
        if not reservation.admitted:
            at = reservation.refused or 0
            raise _exceeded(ask.rules[at], reservation.levels[at], ask.amounts[at])
        warnings: list[str] = []
        levels = reservation.levels
        if len(levels) != len(ask.rules):
            raise ValueError("one level per budget rule")
        for i, rule in enumerate(ask.rules):
            level = levels[i]
            if not rule.blocking and level >= rule.limit_nanos * WARN_AT:
                warnings.append(
                    f"{rule.label} is at {level * 100 // max(rule.limit_nanos, 1)}% of "
                    f"{rule.limit_usd} USD"
                )
        if ask.groups:
            out = {p for p, g in ask.groups.items() if g not in reservation.groups}
            chain = tuple(u for u in chain if u.provider_id not in out)
        warning = "; ".join(warnings).encode("latin-1", "replace") if warnings else None
        return chain, warning

    def settled(self, seq: int | None, ask: BudgetAsk, holder: str, costs: Sequence[int]) -> None:
        """Remember which buckets `holder` charged in record `seq`, to tell the counters when
        the ledger has it."""
        if seq is None:
            return
        charged = _charged(ask, holder, costs)
        if charged:
            heapq.heappush(self._pending, (seq, next(self._tiebreak), charged))

    def settled_unwritten(
        self, record: SpendRecord, ask: BudgetAsk, holder: str, costs: Sequence[int]
    ) -> None:
        """As `settled`, for an outcome the spool could not write yet (its disk was full): it
        waits in the spool's memory and gets its seq when written, which `ledgered_through`
        looks for. Until the ledger has it the counters keep its cost, as for any other."""
        charged = _charged(ask, holder, costs)
        if charged:
            self._unwritten.append((record, charged))

    def ledgered_through(self, seq: int) -> None:
        """The ledger holds every record of this process up to `seq` (the spool's callback)."""
        if self._unwritten:
            self._take_written()
        entries: list[tuple[str, str]] = []
        pending = self._pending
        while pending and pending[0][0] <= seq:
            entries.extend(heapq.heappop(pending)[2])
        if entries:
            task = asyncio.get_running_loop().create_task(self._ledgered(entries))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take_written(self) -> None:
        """Move the outcomes the spool wrote late among those waiting for the ledger."""
        waiting: deque[tuple[SpendRecord, list[tuple[str, str]]]] = deque(maxlen=UNWRITTEN_MAX)
        for record, charged in self._unwritten:
            if record.seq:
                heapq.heappush(self._pending, (record.seq, next(self._tiebreak), charged))
            else:
                waiting.append((record, charged))
        self._unwritten = waiting

    async def _ledgered(self, entries: list[tuple[str, str]]) -> None:
        moved = 0
        try:
            for start in range(0, len(entries), LEDGERED_CHUNK):
                if start:
                    await asyncio.sleep(0)  # requests waiting go first
                chunk = entries[start : start + LEDGERED_CHUNK]
                await self._counters.ledgered(chunk, self._clock.time())
                moved += len(chunk)
        except Exception:
            # They lapse after HOLD_S: counted twice until then, which only errs on the safe side.
            log.exception(
                "could not move %d settled amounts into their budgets' base",
                len(entries) - moved,
            )

    async def _end_user_ledger(
        self, rule: BudgetRule, end_user: str, start: float | None
    ) -> tuple[int, float]:
        """One end user's spend in the window from the ledger, and when it was read."""
        key = (rule.budget_id, start, end_user)
        now = self._clock.monotonic()
        cached = self._end_users.get(key)
        if cached is not None and now - cached[2] < END_USER_SPEND_TTL_S:
            return cached[0], cached[1]
        if self._source is None:
            return 0, 0.0
        try:
            answer = await self._source.bucket_spend(rule.budget_id, end_user)
            nanos = usd_to_nanos(answer.spent_usd)
        except Exception as exc:
            # Counted from what this replica (or Redis) knows; the ledger's part is retried.
            log.warning(
                "budget_spend_unavailable budget=%s: %s; counting in-flight and unledgered spend "
                "only",
                rule.budget_id,
                type(exc).__name__,
            )
            return (cached[0], cached[1]) if cached is not None else (0, 0.0)
        as_of = unix_seconds(answer.as_of) or 0.0
        self._end_users[key] = (nanos, as_of, now)
        return nanos, as_of


def end_user_required(rule: BudgetRule) -> ProxyError:
    """`400 end_user_required`: the request names no end user, and `rule` gives each one an
    allowance."""
    return ProxyError(
        ErrorCode.END_USER_REQUIRED,
        f"{rule.label} gives each end user an allowance: name the end user "
        "in the X-Vkgate-End-User header or the body's `user`",
    )


def check_end_user(rules: Sequence[BudgetRule], end_user: str | None) -> None:
    """Refuse a request without an end user when a per-end-user budget applies: also to one
    that moves no budget (a cache hit), so a request is accepted or refused alike whether or
    not its answer is cached."""
    if end_user is None:
        for rule in rules:
            if rule.per_end_user:
                raise end_user_required(rule)


def _exceeded(rule: BudgetRule, level: int, amount: int) -> ProxyError:
    remaining = max(0, rule.limit_nanos - level)
    return ProxyError(
        ErrorCode.BUDGET_EXCEEDED,
        f"{rule.label} cannot cover this request: {nanos_to_usd(remaining)} USD of "
        f"{rule.limit_usd} USD left, and the request may cost up to {nanos_to_usd(amount)} USD",
        details={
            "budget_id": rule.budget_id,
            "budget_scope": rule.scope_kind,
            "budget_window": rule.window,
            "limit_usd": rule.limit_usd,
            "remaining_usd": nanos_to_usd(remaining),
        },
    )


def _charged(ask: BudgetAsk, holder: str, costs: Sequence[int]) -> list[tuple[str, str]]:
    """The (bucket key, holder) pairs `holder` charged a cost to."""
    buckets = ask.buckets
    if len(costs) != len(buckets):
        raise ValueError("one cost per budget bucket")
    charged: list[tuple[str, str]] = []
    for i, c in enumerate(costs):
        if c:
            charged.append((buckets[i].key, holder))
    return charged


def _bucket(
    rule: BudgetRule,
    group: int,
    start_ts: float | None,
    end_ts: float | None,
    ledger: int,
    as_of: float,
    suffix: str = "",
) -> BudgetBucket:
    """`rule`'s counter in the window from `start_ts` (`suffix` names one end user's share)."""
    window = "total" if start_ts is None else int(start_ts)
    return BudgetBucket(
        f"bg:{rule.budget_id}:{window}{suffix}",
        rule.limit_nanos,
        ledger,
        as_of,
        rule.blocking,
        group,
        None if end_ts is None else end_ts + WINDOW_MARGIN_S,
    )

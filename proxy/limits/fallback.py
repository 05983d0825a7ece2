"""`FallbackCounters`: Redis while it answers, this replica's own counters while it does not.

While Redis is unreachable every call is served by `LocalCounters`: limits and budgets then
hold per replica (N replicas admit up to N times a rate limit, and share no reservations), the
price of not refusing all traffic. Redis is tried again `retry_s` after the last failure, by a
single call; the others stay local meanwhile.

The two sides never reconcile. A settle, release or `ledgered` that names something reserved
in Redis before the outage cannot reach it while Redis is down: those entries lapse there by
their lease (reservations, slots) or hold (unacknowledged spend), counted until then, which
errs on the safe side. What was reserved locally lapses locally the same way; a request reserved
locally that settles after recovery still records its spend in Redis. A call that times out
may have run in Redis all the same; its effect there lapses likewise.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import redis.exceptions

from proxy.limits.counters import LocalCounters
from proxy.limits.store import (
    Admission,
    Bucket,
    BudgetBucket,
    Counters,
    Levels,
    Reservation,
    Slots,
)
from vkgate.clock import Clock

log = logging.getLogger("vkgate.proxy.limits")

UNREACHABLE = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    # Redis answered, but cannot serve: out of memory, busy, a read-only replica after a
    # failover, a cluster refusing a script across slots. Served locally rather than a 500.
    redis.exceptions.ResponseError,
    # A cluster with a master down (its slots uncovered), or its nodes not yet known.
    redis.exceptions.ClusterError,
    redis.exceptions.RedisClusterException,
    TimeoutError,
    OSError,
)
"""What says Redis cannot serve (as opposed to a bug in the caller, which propagates)."""

T = TypeVar("T")


class FallbackCounters:
    """`Counters` on Redis, falling back to in-process counters while Redis is unreachable."""

    def __init__(
        self,
        redis: Counters,
        local: LocalCounters,
        clock: Clock,
        retry_s: float = 5.0,
        *,
        check: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """`redis`: the shared counters (`LeasedCounters` on Redis).
        `check`: a round trip to Redis, made before calls go back to it (leased counters can
        answer from their slices without one)."""
        self._redis = redis
        self.shared = redis
        """The shared counters (what the metrics read the leases' state from)."""
        self._local = local
        self._clock = clock
        self._retry_s = retry_s
        self._retry_at = 0.0
        self._check = check
        self.degraded = False
        """True while calls are served locally."""
        self.local_calls = 0
        """Calls served by the in-process counters (the metrics read it)."""

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
        return await self._serve(
            lambda c: c.admit(request_id, buckets, slots, budgets, amounts, lease_s, now)
        )

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
        await self._serve(
            lambda c: c.finish(request_id, adjust, slots, budgets, costs, hold_s, now)
        )

    async def take(self, buckets: Sequence[Bucket], now: float) -> Levels:
        return await self._serve(lambda c: c.take(buckets, now))

    async def adjust(self, buckets: Sequence[Bucket], now: float) -> None:
        await self._serve(lambda c: c.adjust(buckets, now))

    async def acquire(self, slots: Slots, request_id: str, now: float) -> bool:
        return await self._serve(lambda c: c.acquire(slots, request_id, now))

    async def release(self, slots: Slots, request_id: str) -> None:
        await self._serve(lambda c: c.release(slots, request_id))

    async def reserve(
        self,
        request_id: str,
        buckets: Sequence[BudgetBucket],
        amounts: Sequence[int],
        lease_s: float,
        now: float,
    ) -> Reservation:
        return await self._serve(lambda c: c.reserve(request_id, buckets, amounts, lease_s, now))

    async def settle(
        self,
        request_id: str,
        buckets: Sequence[BudgetBucket],
        costs: Sequence[int],
        hold_s: float,
        now: float,
    ) -> None:
        await self._serve(lambda c: c.settle(request_id, buckets, costs, hold_s, now))

    async def ledgered(self, entries: Sequence[tuple[str, str]], now: float) -> None:
        await self._serve(lambda c: c.ledgered(entries, now))

    async def close(self) -> None:
        try:
            await self._redis.close()
        finally:
            await self._local.close()

    async def _serve(self, call: Callable[[Counters], Awaitable[T]]) -> T:
        if self.degraded:
            if self._clock.monotonic() < self._retry_at:
                return await self._locally(call)
            # This call probes Redis; calls meanwhile stay local instead of all waiting on it.
            self._retry_at = self._clock.monotonic() + self._retry_s
        try:
            if self.degraded and self._check is not None:
                await self._check()
            result = await call(self._redis)
        except UNREACHABLE as exc:
            self._unreachable(exc)
            return await self._locally(call)
        if self.degraded:
            self.degraded = False
            log.warning("limits_redis_recovered: rate limits and budgets are shared again")
        return result

    async def _locally(self, call: Callable[[Counters], Awaitable[T]]) -> T:
        self.local_calls += 1
        return await call(self._local)

    def failed(self, exc: BaseException) -> None:
        """The shared counters failed on their own (not in a call of ours): served locally
        from now on if Redis cannot serve, as after a failed call."""
        if isinstance(exc, UNREACHABLE):
            self._unreachable(exc)

    def _unreachable(self, exc: BaseException) -> None:
        self._retry_at = self._clock.monotonic() + self._retry_s
        if self.degraded:
            return
        self.degraded = True
        log.warning(
            "limits_redis_unreachable: %s: %s; rate limits and budgets are now per replica "
            "until Redis answers again (retried every %g s)",
            type(exc).__name__,
            exc,
            self._retry_s,
        )

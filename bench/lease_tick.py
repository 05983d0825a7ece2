"""What a replica's lease tick costs when it holds many slices: µs of CPU per tick.

Each of `--keys` keys makes one request (three token buckets, a concurrency limit and a budget,
every bucket its own), so the replica holds five leases per key; then ticks are timed at the
moments a replica meets them: right after the requests (spend to report), while the slices
wait to go idle (nothing to send: what a tick costs for leases it has no business with), and
when they have gone idle (every slice given back). Times are the ticks' own, given to `tick`
(`now`), so the run is the same however long it takes; CPU is this process's, Redis's work
left out. Prints a table; asserts nothing.

    .venv/bin/python bench/lease_tick.py [--keys 1000,10000] [--redis-url redis://127.0.0.1:6379/0]

Uses a unique key prefix and deletes its keys afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import secrets
import time
from datetime import UTC, datetime

from counters import LEASE_S, PLENTY, budget, delete_prefixed
from redis.asyncio import Redis

from proxy.limits.lease_store import RedisLeaseStore
from proxy.limits.leases import TICK_S, LeasedCounters
from proxy.limits.store import Bucket, Slots

TTL_S = 2.0
QUIET_TICKS = 2
"""Ticks timed while the slices wait to go idle or to be renewed (both half a time to live
after their use): nothing is due."""


class StillClock:
    """The run's own time: the counters never find their slices older than the run says."""

    def __init__(self, at: float) -> None:
        self.at = at

    def time(self) -> float:
        return self.at

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.at, UTC)

    def monotonic(self) -> float:
        return self.at


async def one_request(counters: LeasedCounters, n: int, now: float) -> None:
    request_id = f"req-{n}"
    rpm = Bucket(f"rl:vk:{n}:rpm", PLENTY, PLENTY / 60, 1.0)
    rpd = Bucket(f"rl:vk:{n}:rpd", PLENTY, PLENTY / 86_400, 1.0)
    tpm = Bucket(f"rl:vk:{n}:tpm", PLENTY, PLENTY / 60, 1200.0)
    slots = Slots(f"cc:vk:{n}", 1_000_000_000, LEASE_S)
    budgets = [budget(f"bg:vk:{n}", True)]
    admission = await counters.admit(
        request_id, [rpm, rpd, tpm], [slots], budgets, [2_000_000], LEASE_S, now
    )
    assert admission.admitted
    await counters.finish(request_id, [], [slots], budgets, [1_500_000], 600.0, now)


async def timed_tick(counters: LeasedCounters, clock: StillClock, now: float) -> float:
    """µs of this process's CPU the tick at `now` took."""
    clock.at = now
    gc.collect()  # a collection of what earlier steps left is not the tick's
    started = time.process_time()
    await counters.tick(now)
    return (time.process_time() - started) * 1e6


async def run(keys: int, redis_url: str) -> tuple[str, ...]:
    prefix = f"vkgate-bench-{secrets.token_hex(6)}:"
    admin = Redis.from_url(redis_url)
    t0 = time.time()
    clock = StillClock(t0)
    counters = LeasedCounters(
        RedisLeaseStore(Redis.from_url(redis_url), prefix), clock, ttl_s=TTL_S
    )
    try:
        for start in range(0, keys, 500):
            await asyncio.gather(
                *(one_request(counters, n, t0) for n in range(start, min(keys, start + 500)))
            )
        held = sum(len(leases) for leases in (counters._tokens, counters._slots, counters._budgets))
        report = await timed_tick(counters, clock, t0 + TICK_S)
        quiet = [
            await timed_tick(counters, clock, t0 + TICK_S * (2 + i)) for i in range(QUIET_TICKS)
        ]
        # The first tick after the slices went idle (half a time to live after their use).
        idle = await timed_tick(counters, clock, t0 + TTL_S / 2 + TICK_S)
        after = await timed_tick(counters, clock, t0 + TTL_S / 2 + 2 * TICK_S)
        left = sum(len(leases) for leases in (counters._tokens, counters._slots, counters._budgets))
        return (
            f"{keys:,}",
            f"{held:,}",
            f"{report:,.0f}",
            f"{min(quiet):,.0f}-{max(quiet):,.0f}",
            f"{idle:,.0f}",
            f"{after:,.0f}",
            f"{left:,}",
        )
    finally:
        await counters.close()
        await delete_prefixed(admin, prefix)
        await admin.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="1000,10000")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    rows = [asyncio.run(run(int(k), args.redis_url)) for k in args.keys.split(",")]
    header = (
        "keys",
        "leases",
        "µs: report tick",
        "µs: quiet ticks",
        "µs: idle tick",
        "µs: tick after",
        "leases left",
    )
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    for row in (header, tuple("-" * w for w in widths), *rows):
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()

"""What the limit counters cost: µs per call of `LocalCounters` and `LeasedCounters` (on Redis),
one at a time and 16 at once. Prints a table; asserts nothing.

Each case is what one request asks of the counters for one kind of limit; a pair (acquire then
release, ...) counts as one operation, as a request makes both. `admit + finish` is a whole
governed request in its two calls: 3 token buckets, 1 concurrency slot, 2 budgets; `in 6 calls`
is the same request made of the single-purpose calls. A Redis `PING` gives the scale: one round
trip through redis-py's asyncio client.

    .venv/bin/python bench/counters.py [--calls 3000] [--redis-url redis://127.0.0.1:6379/0]
        [--cases take,slots,budget,calls,request,cold,ping]

Bounded: `--calls` operations per case and mode, after a short warm-up. Uses a unique key
prefix and deletes its keys afterwards. Limits are set far above what a run takes, so every
call is admitted (the common path). Columns "1" are one call at a time (latency); columns "16"
the wall time of the calls made by 16 concurrent tasks over their number (the inverse of
throughput). From Redis's own `INFO commandstats`, for the calls made one at a time: "in
scripts" is the µs Redis spent running the operation's scripts, "commands" the Redis commands
it ran (inside scripts or not, `EVALSHA` left out). Both count every client of that Redis: run
it on an otherwise idle one.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis

from proxy.limits.counters import LocalCounters
from proxy.limits.lease_store import RedisLeaseStore
from proxy.limits.leases import LeasedCounters
from proxy.limits.store import Bucket, BudgetBucket, Counters, Slots
from vkgate.clock import SystemClock

CONCURRENCY = 16
TICK_S = 0.25
WARMUP = 200
LEASE_S = 900.0
HOLD_S = 600.0
PLENTY = 1e12
"""A capacity no run exhausts."""

RPM = Bucket("rl:vk:bench:rpm", PLENTY, PLENTY / 60, 1.0)
RPD = Bucket("rl:vk:bench:rpd", PLENTY, PLENTY / 86_400, 1.0)
TPM = Bucket("rl:vk:bench:tpm", PLENTY, PLENTY / 60, 1200.0)
TPM_CORRECTION = Bucket(TPM.key, TPM.capacity, TPM.per_second, -300.0)
SLOTS = Slots("cc:vk:bench", 1_000_000_000, LEASE_S)


def budget(key: str, blocking: bool, group: int = 0) -> BudgetBucket:
    return BudgetBucket(
        key=key,
        limit_nanos=10**17,
        ledger_nanos=5 * 10**9,
        ledger_as_of=time.time() - 30,
        blocking=blocking,
        group=group,
        expires_at=time.time() + 86_400,
    )


Op = Callable[[str], Awaitable[object]]
"""One operation, given a request id unique to it."""

_request_numbers = itertools.count()
"""Request ids are never reused, not even across cases: a repeat would find its reservation."""


def cases(counters: Counters) -> dict[str, tuple[str, Op]]:
    org, key = budget("bg:org:bench", True), budget("bg:vk:bench", False)

    async def take(_: str) -> None:
        await counters.take([RPM, TPM], time.time())

    async def slots(request_id: str) -> None:
        await counters.acquire(SLOTS, request_id, time.time())
        await counters.release(SLOTS, request_id)

    async def one_budget(request_id: str) -> None:
        await counters.reserve(request_id, [org], [2_000_000], LEASE_S, time.time())
        await counters.settle(request_id, [org], [1_500_000], HOLD_S, time.time())

    async def in_six_calls(request_id: str) -> None:
        budgets = [org, key]
        await counters.take([RPM, RPD, TPM], time.time())
        await counters.acquire(SLOTS, request_id, time.time())
        await counters.reserve(request_id, budgets, [2_000_000, 2_000_000], LEASE_S, time.time())
        await counters.release(SLOTS, request_id)
        await counters.adjust([TPM_CORRECTION], time.time())
        await counters.settle(request_id, budgets, [1_500_000, 1_500_000], HOLD_S, time.time())

    async def request(request_id: str) -> None:
        budgets = [org, key]
        await counters.admit(
            request_id,
            [RPM, RPD, TPM],
            [SLOTS],
            budgets,
            [2_000_000, 2_000_000],
            LEASE_S,
            time.time(),
        )
        await counters.finish(
            request_id,
            [TPM_CORRECTION],
            [SLOTS],
            budgets,
            [1_500_000, 1_500_000],
            HOLD_S,
            time.time(),
        )

    ticked = [time.monotonic()]

    async def cold(request_id: str) -> None:
        # Every bucket of this request is one no slice covers: the key's only request a while.
        rpm = Bucket(f"rl:vk:{request_id}:rpm", PLENTY, PLENTY / 60, 1.0)
        rpd = Bucket(f"rl:vk:{request_id}:rpd", PLENTY, PLENTY / 86_400, 1.0)
        tpm = Bucket(f"rl:vk:{request_id}:tpm", PLENTY, PLENTY / 60, 1200.0)
        own = Slots(f"cc:vk:{request_id}", 1_000_000_000, LEASE_S)
        budgets = [budget(f"bg:vk:{request_id}", True)]
        await counters.admit(
            request_id, [rpm, rpd, tpm], [own], budgets, [2_000_000], LEASE_S, time.time()
        )
        await counters.finish(request_id, [], [own], budgets, [1_500_000], HOLD_S, time.time())
        tick = getattr(counters, "tick", None)
        if tick is not None and time.monotonic() >= ticked[0] + TICK_S:
            # A replica's tick, at its pace: it reports every slice's use (and a tick later,
            # finds the slices empty and idle, and forgets them with no call).
            ticked[0] = time.monotonic()
            await tick(time.time())

    return {
        "cold": ("a key's only request a while (5 buckets; leased: and its report)", cold),
        "take": ("take (2 buckets)", take),
        "slots": ("acquire + release", slots),
        "budget": ("reserve + settle (1 budget)", one_budget),
        "calls": ("a request in 6 calls (3 buckets, 1 slot, 2 budgets)", in_six_calls),
        "request": ("a request: admit + finish (the same)", request),
    }


async def per_op_us(op: Op, calls: int, concurrency: int) -> float:
    """Wall time per operation of `calls` operations made by `concurrency` tasks, in µs."""
    ids = (f"req-{i}" for i in _request_numbers)
    for _ in range(WARMUP):
        await op(next(ids))
    left = calls

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await op(next(ids))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return (time.perf_counter() - started) / calls * 1e6


async def server_stats(client: Redis) -> tuple[int, int]:
    """From Redis's own counts: µs spent running scripts (the commands they call included) and
    commands run (in scripts or not; `EVALSHA` and `INFO` themselves left out)."""
    stats: dict[str, Any] = await client.info("commandstats")
    usec = int(stats.get("cmdstat_evalsha", {}).get("usec", 0))
    calls = sum(
        int(stat["calls"])
        for name, stat in stats.items()
        if name not in ("cmdstat_evalsha", "cmdstat_info")
    )
    return usec, calls


async def delete_prefixed(client: Redis, prefix: str) -> None:
    keys = [key async for key in client.scan_iter(match=prefix + "*", count=1000)]
    for at in range(0, len(keys), 500):
        await client.delete(*keys[at : at + 500])


async def run(calls: int, redis_url: str, wanted: list[str]) -> list[tuple[str, ...]]:
    prefix = f"vkgate-bench-{secrets.token_hex(6)}:"
    admin = Redis.from_url(redis_url)
    pinged = Redis.from_url(redis_url)
    local = LocalCounters()
    # No tick runs here: the leased counters report nothing, so the figures are the calls'
    # own (every limit is far above the run, so nearly every call is served from a slice).
    shared = LeasedCounters(RedisLeaseStore(Redis.from_url(redis_url), prefix), SystemClock())
    rows: list[tuple[str, ...]] = []

    async def ping(_: str) -> None:
        await pinged.ping()

    try:
        local_cases, shared_cases = cases(local), cases(shared)
        for name in wanted:
            local_op: Op | None
            shared_op: Op
            if name == "ping":
                label, local_op, shared_op = "Redis PING, for scale", None, ping
            else:
                label, local_op = local_cases[name]
                shared_op = shared_cases[name][1]
            row = [label, "", ""]
            if local_op is not None:
                row[1] = f"{await per_op_us(local_op, calls, 1):.1f}"
                row[2] = f"{await per_op_us(local_op, calls, CONCURRENCY):.1f}"
            before = await server_stats(admin)
            row.append(f"{await per_op_us(shared_op, calls, 1):.1f}")
            after = await server_stats(admin)
            row.append(f"{await per_op_us(shared_op, calls, CONCURRENCY):.1f}")
            done = calls + WARMUP  # the warm-up ran between the two counts as well
            if name == "ping":
                row += ["", "1"]
            else:
                row.append(f"{(after[0] - before[0]) / done:.1f}")
                row.append(f"{(after[1] - before[1]) / done:.1f}")
            rows.append(tuple(row))
    finally:
        await shared.close()
        await local.close()
        await pinged.aclose()
        await delete_prefixed(admin, prefix)
        await admin.aclose()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--cases", default="take,slots,budget,calls,request,cold,ping")
    args = parser.parse_args()
    rows = asyncio.run(run(args.calls, args.redis_url, args.cases.split(",")))

    header = (
        "µs per operation",
        "local 1",
        "local 16",
        "Redis 1",
        "Redis 16",
        "in scripts",
        "commands",
    )
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    for row in (header, tuple("-" * w for w in widths), *rows):
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        print("  ".join(cells))


if __name__ == "__main__":
    main()

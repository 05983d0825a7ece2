"""The `Counters` contract, run against `LocalCounters` and `LeasedCounters` (on a real Redis,
and on a Redis Cluster of three masters)."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from proxy.limits.counters import LocalCounters
from proxy.limits.lease_store import Call, Grant, RedisLeaseStore
from proxy.limits.leases import LeasedCounters
from proxy.limits.store import ACKED_KEEP_S, LEDGER_SKEW_S, Bucket, BudgetBucket, Counters, Slots
from tests.support.clock import ManualClock
from tests.support.redis_servers import redis_cluster

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
T0 = 1_800_000_000.0
"""Every test's start, unix seconds; time then moves only by the `now` each call passes."""
LEASE_S = 30.0
LEASED_TTL_S = 0.4
PAST = ManualClock(datetime(2001, 1, 1, tzinfo=UTC))
HOLD_S = 600.0


def redis_client() -> Redis:
    return Redis.from_url(REDIS_URL)


def unique_prefix() -> str:
    return f"vkgate-test-{secrets.token_hex(6)}:"


async def delete_prefixed(prefix: str) -> None:
    client = redis_client()
    try:
        keys = [key async for key in client.scan_iter(match=prefix + "*", count=500)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


@pytest.fixture(scope="module")
def cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Redis Cluster of three masters of this module's own."""
    with redis_cluster(tmp_path_factory.mktemp("counters-cluster")) as cluster:
        yield cluster.url


@pytest.fixture(params=["local", "leased", "leased-cluster"])
async def counters(request: pytest.FixtureRequest) -> AsyncIterator[Counters]:
    if request.param == "local":
        local = LocalCounters()
        yield local
        await local.close()
        return
    if request.param == "leased-cluster":
        # Every sync stays on one bucket's hash slot; many go as one call per master.
        url = request.getfixturevalue("cluster_url")
        on_cluster = LeasedCounters(
            RedisLeaseStore(RedisCluster.from_url(url), unique_prefix()),
            PAST,
            ttl_s=LEASED_TTL_S,
        )
        yield on_cluster
        await on_cluster.close()
        return
    prefix = unique_prefix()
    # A short time to live: a level read after the test moves time on is the store's.
    shared = leased(prefix)
    try:
        yield shared
    finally:
        await shared.close()
        await delete_prefixed(prefix)


def leased(prefix: str) -> LeasedCounters:
    # Its clock is far behind every `now` the tests give: those are the time.
    return LeasedCounters(RedisLeaseStore(redis_client(), prefix), PAST, ttl_s=LEASED_TTL_S)


def rpm(capacity: float, cost: float = 1.0, key: str = "rl:vk:a:rpm") -> Bucket:
    """A bucket refilled over a minute."""
    return Bucket(key=key, capacity=capacity, per_second=capacity / 60, cost=cost)


def budget(
    key: str = "bg:b1:0",
    *,
    limit: int = 100,
    ledger: int = 0,
    as_of: float = 0.0,
    blocking: bool = True,
    group: int = 0,
    expires_at: float | None = None,
) -> BudgetBucket:
    return BudgetBucket(
        key=key,
        limit_nanos=limit,
        ledger_nanos=ledger,
        ledger_as_of=as_of,
        blocking=blocking,
        group=group,
        expires_at=expires_at,
    )


async def level(counters: Counters, bucket: BudgetBucket, now: float) -> int:
    """The bucket's level as a reservation of nothing reports it."""
    probe = await counters.reserve(f"probe-{secrets.token_hex(4)}", [bucket], [0], LEASE_S, now)
    return probe.levels[0]


# Token buckets


async def test_a_burst_admits_exactly_the_capacity_then_the_refill_rate(
    counters: Counters,
) -> None:
    bucket = rpm(3)  # one request every 20 s
    taken = [await counters.take([bucket], T0) for _ in range(4)]
    assert [t.admitted for t in taken] == [True, True, True, False]
    assert [t.remaining[0] for t in taken] == [2.0, 1.0, 0.0, 0.0]
    assert taken[3].refused == 0

    assert not (await counters.take([bucket], T0 + 19)).admitted
    assert (await counters.take([bucket], T0 + 20)).admitted, "20 s refill one request"
    assert not (await counters.take([bucket], T0 + 20)).admitted
    after = [await counters.take([bucket], T0 + 80 + i) for i in range(4)]
    assert [t.admitted for t in after] == [True, True, True, False], "60 s refill it fully"


async def test_a_bucket_never_fills_beyond_its_capacity(counters: Counters) -> None:
    bucket = rpm(2)
    await counters.take([bucket], T0)
    taken = [await counters.take([bucket], T0 + 3600) for _ in range(3)]
    assert [t.admitted for t in taken] == [True, True, False]


async def test_a_take_is_all_or_none_across_buckets(counters: Counters) -> None:
    key_rpm, team_rpm = rpm(5, key="rl:vk:a:rpm"), rpm(1, key="rl:team:t:rpm")
    assert (await counters.take([key_rpm, team_rpm], T0)).admitted
    refused = await counters.take([key_rpm, team_rpm], T0)
    assert not refused.admitted
    assert refused.refused == 1
    assert refused.remaining == (4.0, 0.0), "levels before the take"

    alone = await counters.take([key_rpm], T0)
    assert alone.admitted and alone.remaining == (3.0,), "the refused take took nothing"


async def test_the_first_refusing_bucket_is_named(counters: Counters) -> None:
    a, b = rpm(1, key="rl:a"), rpm(1, key="rl:b")
    await counters.take([a, b], T0)
    assert (await counters.take([a, b], T0)).refused == 0


async def test_retry_after_is_when_every_refusing_bucket_holds_its_cost(
    counters: Counters,
) -> None:
    fast = Bucket("rl:fast", capacity=1, per_second=1.0, cost=1)
    slow = Bucket("rl:slow", capacity=1, per_second=0.25, cost=1)
    assert (await counters.take([fast, slow], T0)).admitted

    refused = await counters.take([fast, slow], T0)
    assert refused.retry_after_s == 4.0
    assert refused.reset_s == (1.0, 4.0)

    refused = await counters.take([fast, slow], T0 + 2)
    assert refused.refused == 1, "the fast one holds its cost again by now"
    assert refused.retry_after_s == 2.0

    admitted = await counters.take([fast, slow], T0 + 4)
    assert admitted.admitted and admitted.retry_after_s == 0.0
    assert admitted.reset_s == (1.0, 4.0)


async def test_a_cost_beyond_the_level_waits_for_the_refill(counters: Counters) -> None:
    tpm = Bucket("rl:vk:a:tpm", capacity=100, per_second=10.0, cost=60)
    assert (await counters.take([tpm], T0)).admitted
    refused = await counters.take([tpm], T0)
    assert refused.remaining == (40.0,)
    assert refused.retry_after_s == 2.0


async def test_adjust_may_go_below_zero_and_never_above_capacity(counters: Counters) -> None:
    tpm = Bucket("rl:vk:a:tpm", capacity=100, per_second=10.0, cost=50)
    await counters.take([tpm], T0)
    await counters.adjust([Bucket(tpm.key, 100, 10.0, cost=70)], T0)  # spent 120, not 50

    refused = await counters.take([Bucket(tpm.key, 100, 10.0, cost=1)], T0)
    assert refused.remaining == (-20.0,)
    assert refused.retry_after_s == 2.1
    assert refused.reset_s == (12.0,)

    await counters.adjust([Bucket(tpm.key, 100, 10.0, cost=-1000)], T0)
    full = await counters.take([Bucket(tpm.key, 100, 10.0, cost=100)], T0)
    assert full.admitted and full.remaining == (0.0,), "given back only up to capacity"


async def test_adjust_refills_first(counters: Counters) -> None:
    tpm = Bucket("rl:vk:a:tpm", capacity=100, per_second=10.0, cost=100)
    await counters.take([tpm], T0)
    await counters.adjust([Bucket(tpm.key, 100, 10.0, cost=30)], T0 + 5)
    seen = await counters.take([Bucket(tpm.key, 100, 10.0, cost=100)], T0 + 5)
    assert seen.remaining == (20.0,)


# Concurrency slots


async def test_slots_admit_up_to_the_limit_until_released(counters: Counters) -> None:
    slots = Slots("cc:vk:a", limit=2, lease_s=LEASE_S)
    assert await counters.acquire(slots, "r1", T0)
    assert await counters.acquire(slots, "r2", T0)
    assert not await counters.acquire(slots, "r3", T0)

    await counters.release(slots, "r1")
    assert await counters.acquire(slots, "r3", T0)
    assert not await counters.acquire(slots, "r4", T0)


async def test_acquiring_again_holds_one_slot(counters: Counters) -> None:
    slots = Slots("cc:vk:a", limit=2, lease_s=LEASE_S)
    assert await counters.acquire(slots, "r1", T0)
    assert await counters.acquire(slots, "r1", T0), "idempotent"
    assert await counters.acquire(slots, "r2", T0)
    assert await counters.acquire(slots, "r1", T0), "still held, so still true at the limit"
    assert not await counters.acquire(slots, "r3", T0)


async def test_releasing_what_is_not_held_changes_nothing(counters: Counters) -> None:
    slots = Slots("cc:vk:a", limit=1, lease_s=LEASE_S)
    await counters.release(slots, "never")
    assert await counters.acquire(slots, "r1", T0)
    await counters.release(slots, "r2")
    assert not await counters.acquire(slots, "r3", T0)


async def test_a_slot_never_released_lapses_after_its_lease(counters: Counters) -> None:
    slots = Slots("cc:vk:a", limit=2, lease_s=LEASE_S)
    assert await counters.acquire(slots, "r1", T0)
    assert await counters.acquire(slots, "r2", T0 + 10)
    assert not await counters.acquire(slots, "r3", T0 + LEASE_S - 1)
    assert await counters.acquire(slots, "r3", T0 + LEASE_S), "r1's replica died"
    assert not await counters.acquire(slots, "r4", T0 + LEASE_S)


# Budget reservations


async def test_reserve_counts_from_the_ledger_figure(counters: Counters) -> None:
    first = await counters.reserve("r1", [budget(ledger=60, as_of=T0)], [30], LEASE_S, T0)
    assert first.admitted and first.levels == (90,)
    refused = await counters.reserve("r2", [budget(ledger=60, as_of=T0)], [20], LEASE_S, T0)
    assert not refused.admitted and refused.levels == (90,) and refused.refused == 0


async def test_a_newer_figure_replaces_the_base_even_when_smaller(counters: Counters) -> None:
    """The proxy's estimate and the ledger's price may differ: the ledger's word is the base."""
    await counters.reserve("r1", [budget(ledger=60, as_of=T0)], [30], LEASE_S, T0)
    newer = await counters.reserve("r2", [budget(ledger=40, as_of=T0 + 5)], [30], LEASE_S, T0 + 5)
    assert newer.admitted and newer.levels == (100,), "40 + both reservations"

    await counters.settle("r1", [budget(ledger=0, as_of=T0 + 6)], [0], HOLD_S, T0 + 6)
    assert await level(counters, budget(ledger=0, as_of=T0 + 6), T0 + 6) == 30, "settle too"


async def test_an_older_or_equal_figure_changes_nothing(counters: Counters) -> None:
    await counters.reserve("r1", [budget(ledger=60, as_of=T0 + 10)], [30], LEASE_S, T0)
    assert await level(counters, budget(ledger=80, as_of=T0 + 10), T0) == 90, "equal"
    assert await level(counters, budget(ledger=0, as_of=T0 + 9), T0) == 90, "older, smaller"
    assert await level(counters, budget(ledger=95, as_of=T0 + 9), T0) == 90, "older, larger"
    await counters.settle("r1", [budget(ledger=0, as_of=T0)], [30], HOLD_S, T0)
    assert await level(counters, budget(), T0) == 90


async def test_a_blocking_budget_refuses_what_would_overspend(counters: Counters) -> None:
    outcomes = [
        await counters.reserve(f"r{i}", [budget(limit=100)], [30], LEASE_S, T0) for i in range(4)
    ]
    assert [o.admitted for o in outcomes] == [True, True, True, False]
    assert [o.levels for o in outcomes] == [(30,), (60,), (90,), (90,)]
    assert outcomes[3].refused == 0
    assert outcomes[0].groups == frozenset()


async def test_a_warn_budget_never_refuses_but_counts(counters: Counters) -> None:
    warn = budget(limit=10, blocking=False)
    outcomes = [await counters.reserve(f"r{i}", [warn], [30], LEASE_S, T0) for i in range(3)]
    assert all(o.admitted for o in outcomes)
    assert [o.levels[0] for o in outcomes] == [30, 60, 90]


async def test_a_refusal_in_group_zero_reserves_nothing(counters: Counters) -> None:
    org = budget("bg:org:0", limit=50)
    openai = budget("bg:openai:0", limit=1000, group=1)
    warn = budget("bg:warn:0", limit=1000, blocking=False)
    refused = await counters.reserve("r1", [openai, warn, org], [60, 60, 60], LEASE_S, T0)
    assert not refused.admitted and refused.refused == 2
    assert refused.groups == frozenset()
    assert refused.levels == (0, 0, 0)
    for bucket in (org, openai, warn):
        assert await level(counters, bucket, T0) == 0


async def test_a_group_whose_budget_is_out_is_dropped_and_not_reserved(
    counters: Counters,
) -> None:
    org = budget("bg:org:0", limit=1000)
    first = budget("bg:openai:0", limit=50, group=1)
    first_warn = budget("bg:openai-warn:0", limit=50, blocking=False, group=1)
    second = budget("bg:anthropic:0", limit=1000, group=2)
    buckets = [org, first, first_warn, second]
    outcome = await counters.reserve("r1", buckets, [80, 70, 70, 80], LEASE_S, T0)
    assert outcome.admitted and outcome.refused is None
    assert outcome.groups == frozenset({2})
    assert outcome.levels == (80, 0, 0, 80)
    assert await level(counters, first_warn, T0) == 0, "a dropped group's warn budget too"


async def test_when_every_group_is_out_nothing_is_reserved(counters: Counters) -> None:
    org = budget("bg:org:0", limit=1000)
    g1 = budget("bg:p1:0", limit=10, group=1)
    g2_roomy = budget("bg:p2-roomy:0", limit=1000, group=2)
    g2 = budget("bg:p2:0", limit=10, group=2)
    buckets = [org, g2_roomy, g2, g1]
    outcome = await counters.reserve("r1", buckets, [50, 50, 50, 50], LEASE_S, T0)
    assert not outcome.admitted
    assert outcome.refused == 2, "the first refusing bucket of the last provider group"
    assert outcome.groups == frozenset()
    assert outcome.levels == (0, 0, 0, 0)
    assert await level(counters, org, T0) == 0


async def test_reserving_again_changes_nothing(counters: Counters) -> None:
    org = budget("bg:org:0", limit=100)
    g1 = budget("bg:p1:0", limit=10, group=1)
    g2 = budget("bg:p2:0", limit=100, group=2)
    first = await counters.reserve("r1", [org, g1, g2], [60, 60, 60], LEASE_S, T0)
    assert first.admitted and first.groups == frozenset({2})
    again = await counters.reserve("r1", [org, g1, g2], [60, 60, 60], LEASE_S, T0 + 1)
    assert again.admitted, "the budget is nearly full, but this request is already in it"
    assert again.groups == first.groups
    assert again.levels == first.levels == (60, 0, 60)
    assert await level(counters, org, T0 + 1) == 60


async def test_a_refused_request_may_reserve_again(counters: Counters) -> None:
    full = budget(limit=100)
    await counters.reserve("r1", [full], [90], LEASE_S, T0)
    assert not (await counters.reserve("r2", [full], [20], LEASE_S, T0)).admitted
    assert (await counters.reserve("r2", [full], [10], LEASE_S, T0)).admitted


async def test_a_reservation_never_settled_lapses_after_its_lease(counters: Counters) -> None:
    full = budget(limit=100)
    assert (await counters.reserve("r1", [full], [100], LEASE_S, T0)).admitted
    assert not (await counters.reserve("r2", [full], [1], LEASE_S, T0 + LEASE_S - 1)).admitted
    later = await counters.reserve("r2", [full], [100], LEASE_S, T0 + LEASE_S)
    assert later.admitted and later.levels == (100,)


async def test_a_window_past_its_expiry_is_forgotten(counters: Counters) -> None:
    day = budget(limit=100, expires_at=T0 + 100)
    assert (await counters.reserve("r1", [day], [100], 1000.0, T0)).admitted
    assert await level(counters, day, T0 + 99) == 100
    assert await level(counters, day, T0 + 100) == 0


# Settling and the ledger


async def test_settling_turns_the_reservation_into_unledgered_spend(counters: Counters) -> None:
    org, warn = budget("bg:org:0"), budget("bg:warn:0", blocking=False)
    await counters.reserve("r1", [org, warn], [40, 40], LEASE_S, T0)
    await counters.settle("r1", [org, warn], [25, 0], HOLD_S, T0 + 1)
    assert await level(counters, org, T0 + 1) == 25
    assert await level(counters, warn, T0 + 1) == 0, "a cost of 0 adds nothing"

    await counters.settle("r1", [org, warn], [25, 0], HOLD_S, T0 + 2)
    assert await level(counters, org, T0 + 2) == 25, "settling twice adds nothing twice"
    assert await level(counters, org, T0 + LEASE_S + 5) == 25, "not a reservation: no lease"


async def test_settling_what_was_never_reserved_counts_once(counters: Counters) -> None:
    org = budget()
    await counters.settle("r1", [org], [30], HOLD_S, T0)
    await counters.settle("r1", [org], [30], HOLD_S, T0)
    assert await level(counters, org, T0) == 30


async def test_settling_after_the_lease_lapsed_still_counts_the_spend(counters: Counters) -> None:
    org = budget()
    await counters.reserve("r1", [org], [50], LEASE_S, T0)
    await counters.settle("r1", [org], [20], HOLD_S, T0 + LEASE_S + 1)
    assert await level(counters, org, T0 + LEASE_S + 1) == 20


async def test_unacknowledged_spend_lapses_after_its_hold(counters: Counters) -> None:
    org = budget()
    await counters.reserve("r1", [org], [50], LEASE_S, T0)
    await counters.settle("r1", [org], [20], HOLD_S, T0)
    assert await level(counters, org, T0 + HOLD_S - 1) == 20
    assert await level(counters, org, T0 + HOLD_S) == 0


async def test_ledgered_moves_the_spend_to_acknowledged_once(counters: Counters) -> None:
    org, other = budget("bg:org:0"), budget("bg:other:0")
    await counters.reserve("r1", [org, other], [50, 50], LEASE_S, T0)
    await counters.settle("r1", [org, other], [20, 20], HOLD_S, T0)
    await counters.ledgered([("bg:org:0", "r1")], T0 + 1)
    await counters.ledgered([("bg:org:0", "r1"), ("bg:org:0", "r1")], T0 + 2)
    assert await level(counters, org, T0 + 2) == 20, "moved, not added"

    assert await level(counters, org, T0 + HOLD_S) == 20, "acknowledged: no hold to lapse"
    assert await level(counters, other, T0 + HOLD_S) == 0, "never acknowledged: it lapsed"


async def request_entries(counters: Counters, key: str) -> tuple[list[str], int]:
    """What a budget bucket keeps per request: its entries (`o:<id>` open, `u:<id>` settled;
    for Redis, every hash field but the running sums and the acknowledged seconds), and how
    many deadlines it keeps for them."""
    if isinstance(counters, LocalCounters):
        state = counters._budgets[key]
        entries = [f"o:{r}" for r in state.open] + [f"u:{r}" for r in state.unacked]
        return sorted(entries), len(state.deadlines)
    assert isinstance(counters, LeasedCounters)
    # Per request, only the replica keeps anything: its reservation in its lease, and which
    # reported entry its settled cost went into until the ledger has it.
    lease = counters._budgets.get(key)
    opened = [f"o:{r}" for r in lease.reserved] if lease is not None else []
    settled = [f"u:{r}" for k, r in counters._entries if k == key]
    return sorted(opened + settled), len(opened) + len(settled)


async def test_acknowledged_spend_leaves_no_entry_behind(counters: Counters) -> None:
    """Request ids are unique and settled once: once acknowledged, nothing of a request is kept
    (the hold may last a day; an entry kept for it would cost memory per request)."""
    org = budget(ledger=10, as_of=T0 - 60, expires_at=T0 + 86_400)
    await counters.reserve("r1", [org], [50], LEASE_S, T0)
    assert (await request_entries(counters, org.key))[0] == ["o:r1"]
    await counters.settle("r1", [org], [20], HOLD_S, T0)
    entries, deadlines = await request_entries(counters, org.key)
    assert entries == ["u:r1"]
    if isinstance(counters, LeasedCounters):
        assert deadlines == 1, "the reservation's deadline went with it"
    assert await level(counters, org, T0) == 30  # its probe lapses at T0 + LEASE_S

    acked_at = T0 + LEASE_S
    await counters.ledgered([(org.key, "r1")], acked_at)
    assert await request_entries(counters, org.key) == ([], 0)
    await counters.ledgered([(org.key, "r1")], acked_at + 1)
    assert await request_entries(counters, org.key) == ([], 0), "a repeat finds nothing"
    assert await level(counters, org, acked_at + 1) == 30, "moved once, not dropped or added"
    assert await level(counters, org, T0 + HOLD_S) == 30, "acknowledged: no hold to lapse"


async def test_local_counters_keep_deadlines_in_proportion_to_the_entries() -> None:
    """Settling and acknowledging leave heap entries behind; they never pile up."""
    local = LocalCounters()
    org = budget(limit=10**9)
    for i in range(1000):
        now = T0 + i / 100
        await local.reserve(f"r{i}", [org], [50], LEASE_S, now)
        await local.settle(f"r{i}", [org], [20], HOLD_S, now)
        if i >= 10:
            await local.ledgered([(org.key, f"r{i - 10}")], now)
    state = local._budgets[org.key]
    assert not state.open and len(state.unacked) == 10
    assert len(state.deadlines) <= 2 * 10 + 1
    await local.ledgered([(org.key, f"r{i}") for i in range(990, 1000)], T0 + 11)
    assert not state.unacked and not state.deadlines
    assert await level(local, org, T0 + 11) == 20 * 1000


async def test_ledgered_of_what_was_never_settled_changes_nothing(counters: Counters) -> None:
    org = budget()
    await counters.reserve("r1", [org], [50], LEASE_S, T0)
    entries = [("bg:b1:0", "r1"), ("bg:b1:0", "r9"), ("bg:none:0", "r1")]
    await counters.ledgered(entries, T0)
    assert await level(counters, org, T0) == 50
    assert await level(counters, org, T0 + LEASE_S) == 0


async def test_ledgered_after_the_hold_lapsed_changes_nothing(counters: Counters) -> None:
    org = budget()
    await counters.settle("r1", [org], [20], HOLD_S, T0)
    await counters.ledgered([("bg:b1:0", "r1")], T0 + HOLD_S)
    assert await level(counters, org, T0 + HOLD_S) == 0


async def test_a_figure_read_after_the_acknowledgement_counts_the_spend_once(
    counters: Counters,
) -> None:
    """The usual order: settle, the ledger acknowledges, the next bundle's figure has it."""
    before = budget(ledger=10, as_of=T0 - 60)
    await counters.reserve("r1", [before], [50], LEASE_S, T0)
    await counters.settle("r1", [before], [20], HOLD_S, T0)
    acked_at = T0 + 5.5
    await counters.ledgered([("bg:b1:0", "r1")], acked_at)
    assert await level(counters, before, acked_at) == 30

    inside = budget(ledger=30, as_of=acked_at + LEDGER_SKEW_S + 1)
    assert await level(counters, inside, T0 + 9) == 30, "counted once: the figure has it"
    assert await level(counters, inside, T0 + 9 + ACKED_KEEP_S) == 30


async def test_a_figure_announced_before_the_acknowledgement_counts_twice_until_the_next(
    counters: Counters,
) -> None:
    """The race: the control plane announces the spend before the proxy hears it is in the
    ledger. Counted twice, safely, until a figure read after the acknowledgement arrives."""
    await counters.settle("r1", [budget(ledger=10, as_of=T0 - 60)], [20], HOLD_S, T0)
    early = budget(ledger=30, as_of=T0 + 3)
    assert await level(counters, early, T0 + 4) == 50, "unacknowledged: counted on top"
    await counters.ledgered([("bg:b1:0", "r1")], T0 + 6)
    assert await level(counters, early, T0 + 6) == 50, "acknowledged after the figure was read"

    assert await level(counters, budget(ledger=30, as_of=T0 + 6 + LEDGER_SKEW_S), T0 + 9) == 50
    later = budget(ledger=30, as_of=T0 + 7 + LEDGER_SKEW_S)
    assert await level(counters, later, T0 + 10) == 30, "counted once again"


async def test_spend_acknowledged_after_the_figure_was_read_counts_on_top(
    counters: Counters,
) -> None:
    await counters.settle("r1", [budget(ledger=0, as_of=T0 - 60)], [20], HOLD_S, T0)
    await counters.ledgered([("bg:b1:0", "r1")], T0 + 20)
    # Read at T0 + 10, before the ledger had r1; it reaches this replica only now.
    stale = budget(ledger=10, as_of=T0 + 10)
    assert await level(counters, stale, T0 + 21) == 30


async def test_spend_acknowledged_within_the_skew_of_the_figure_counts_twice(
    counters: Counters,
) -> None:
    """Clocks may disagree by `LEDGER_SKEW_S`: a figure read that close to an acknowledgement
    may or may not have the spend, so it is counted on top: too much, never too little."""
    for i, read_after_s in enumerate([-LEDGER_SKEW_S, 0.0, 1.0, LEDGER_SKEW_S]):
        key = f"bg:skew{i}:0"
        await counters.settle("r1", [budget(key, ledger=10, as_of=T0 - 60)], [20], HOLD_S, T0)
        await counters.ledgered([(key, "r1")], T0 + 20)
        figure = budget(key, ledger=30, as_of=T0 + 20 + read_after_s)
        seen = await level(counters, figure, T0 + 23)
        assert seen >= 30, "never below the true spend"
        assert seen == 50, f"read {read_after_s} s after the acknowledgement"


async def test_spend_acknowledged_by_a_replica_whose_clock_is_ahead_counts(
    counters: Counters,
) -> None:
    org = budget(ledger=0, as_of=T0 - 60)
    await counters.settle("r1", [org], [20], HOLD_S, T0)
    await counters.ledgered([("bg:b1:0", "r1")], T0 + 1.5)
    assert await level(counters, org, T0 + 0.5) == 20


async def test_acknowledged_spend_is_forgotten_after_acked_keep_s(counters: Counters) -> None:
    """A bundle is refreshed well within `ACKED_KEEP_S`; one that was not (the control plane
    unreachable) has its figure's acknowledged spend forgotten rather than kept for ever."""
    org = budget(ledger=10, as_of=T0 - 60)
    await counters.settle("r1", [org], [20], HOLD_S, T0 + 0.5)
    await counters.ledgered([("bg:b1:0", "r1")], T0 + 0.5)
    assert await level(counters, org, T0 + ACKED_KEEP_S) == 30
    assert await level(counters, org, T0 + ACKED_KEEP_S + 1) == 10


# Admitting and finishing a request in one call each


async def test_admit_takes_holds_and_reserves_everything(counters: Counters) -> None:
    tpm = Bucket("rl:vk:a:tpm", capacity=100, per_second=10.0, cost=40)
    slots = Slots("cc:vk:a", limit=1, lease_s=LEASE_S)
    org = budget("bg:org:0", limit=100)
    admission = await counters.admit("r1", [rpm(3), tpm], [slots], [org], [30], LEASE_S, T0)
    assert admission.admitted
    assert admission.levels is not None and admission.levels.remaining == (2.0, 60.0)
    assert admission.levels.reset_s == (20.0, 4.0)
    assert admission.slots_refused is None
    assert admission.reservation is not None and admission.reservation.levels == (30,)

    assert (await counters.take([rpm(3)], T0)).remaining == (1.0,)
    assert not await counters.acquire(slots, "r2", T0), "r1 holds the only slot"
    assert await level(counters, org, T0) == 30


async def test_admit_refused_at_the_take_holds_and_reserves_nothing(counters: Counters) -> None:
    slots = Slots("cc:vk:a", limit=1, lease_s=LEASE_S)
    org = budget("bg:org:0", limit=100)
    await counters.take([rpm(1)], T0)
    admission = await counters.admit("r1", [rpm(1)], [slots], [org], [30], LEASE_S, T0)
    assert not admission.admitted
    assert admission.levels is not None and admission.levels.refused == 0
    assert admission.levels.retry_after_s == 60.0
    assert admission.slots_refused is None and admission.reservation is None

    assert await counters.acquire(slots, "r2", T0), "r1 holds no slot"
    assert await level(counters, org, T0) == 0


async def test_admit_refused_at_the_slots_gives_the_take_back(counters: Counters) -> None:
    free = Slots("cc:team:t", limit=1, lease_s=LEASE_S)
    full = Slots("cc:vk:a", limit=1, lease_s=LEASE_S)
    org = budget("bg:org:0", limit=100)
    await counters.take([rpm(3)], T0)
    assert await counters.acquire(full, "other", T0)

    admission = await counters.admit("r1", [rpm(3)], [free, full], [org], [30], LEASE_S, T0)
    assert not admission.admitted
    assert admission.slots_refused == 1, "the first full one"
    assert admission.levels is not None and admission.levels.admitted, "the take passed"
    assert admission.reservation is None

    assert (await counters.take([rpm(3)], T0)).remaining == (1.0,), "levels as before"
    assert await counters.acquire(free, "r2", T0), "the free slot was not kept"
    assert await level(counters, org, T0) == 0


async def test_admit_refused_at_the_reservation_gives_back_the_take_and_the_slots(
    counters: Counters,
) -> None:
    slots = Slots("cc:vk:a", limit=1, lease_s=LEASE_S)
    tpm = Bucket("rl:vk:a:tpm", capacity=100, per_second=10.0, cost=40)
    org = budget("bg:org:0", limit=100)
    await counters.reserve("other", [org], [80], LEASE_S, T0)

    admission = await counters.admit("r1", [rpm(3), tpm], [slots], [org], [30], LEASE_S, T0)
    assert not admission.admitted
    assert admission.levels is not None and admission.levels.admitted
    assert admission.slots_refused is None
    assert admission.reservation is not None and admission.reservation.refused == 0
    assert admission.reservation.levels == (80,)

    assert (await counters.take([rpm(3), tpm], T0)).remaining == (2.0, 60.0), "as before"
    assert await counters.acquire(slots, "r2", T0), "r1's slot was released"
    assert await level(counters, org, T0) == 80


async def test_a_refused_admit_may_be_asked_again(counters: Counters) -> None:
    """What a caller does when every provider group is out: ask again without them."""
    org = budget("bg:org:0", limit=1000)
    g1 = budget("bg:p1:0", limit=10, group=1)
    slots = Slots("cc:vk:a", limit=1, lease_s=LEASE_S)
    out = await counters.admit("r1", [rpm(3)], [slots], [org, g1], [50, 50], LEASE_S, T0)
    assert not out.admitted and out.reservation is not None and out.reservation.refused == 1

    again = await counters.admit("r1", [rpm(3)], [slots], [org], [50], LEASE_S, T0)
    assert again.admitted
    assert again.levels is not None and again.levels.remaining == (2.0,), "taken once"
    assert await level(counters, org, T0) == 50
    assert await level(counters, g1, T0) == 0


async def test_admit_drops_a_provider_group_that_is_out_and_admits(counters: Counters) -> None:
    org = budget("bg:org:0", limit=1000)
    g1 = budget("bg:p1:0", limit=10, group=1)
    g2 = budget("bg:p2:0", limit=1000, group=2)
    admission = await counters.admit(
        "r1", [rpm(3)], [Slots("cc:vk:a", 1, LEASE_S)], [org, g1, g2], [50, 50, 50], LEASE_S, T0
    )
    assert admission.admitted
    assert admission.reservation is not None
    assert admission.reservation.groups == frozenset({2})
    assert admission.reservation.levels == (50, 0, 50)
    assert (await counters.take([rpm(3)], T0)).remaining == (1.0,)


async def test_admit_skips_the_parts_given_nothing(counters: Counters) -> None:
    nothing = await counters.admit("r1", [], [], [], [], LEASE_S, T0)
    assert nothing.admitted and nothing.levels is None and nothing.reservation is None

    slots = Slots("cc:vk:a", limit=1, lease_s=LEASE_S)
    only_slots = await counters.admit("r2", [], [slots], [], [], LEASE_S, T0)
    assert only_slots.admitted and only_slots.levels is None and only_slots.reservation is None
    full = await counters.admit("r3", [], [slots], [], [], LEASE_S, T0)
    assert not full.admitted and full.slots_refused == 0

    org = budget("bg:org:0", limit=100)
    only_budgets = await counters.admit("r4", [], [], [org], [30], LEASE_S, T0)
    assert only_budgets.admitted and only_budgets.levels is None
    assert only_budgets.reservation is not None and only_budgets.reservation.levels == (30,)

    only_buckets = await counters.admit("r5", [rpm(3)], [], [], [], LEASE_S, T0)
    assert only_buckets.admitted and only_buckets.reservation is None
    assert only_buckets.levels is not None and only_buckets.levels.remaining == (2.0,)


async def test_admitting_again_reserves_once_and_holds_one_slot(counters: Counters) -> None:
    org = budget("bg:org:0", limit=100)
    g1 = budget("bg:p1:0", limit=10, group=1)
    g2 = budget("bg:p2:0", limit=100, group=2)
    slots = Slots("cc:vk:a", limit=1, lease_s=LEASE_S)
    buckets, amounts = [org, g1, g2], [60, 60, 60]
    first = await counters.admit("r1", [], [slots], buckets, amounts, LEASE_S, T0)
    again = await counters.admit("r1", [], [slots], buckets, amounts, LEASE_S, T0 + 1)
    assert first.admitted and again.admitted, "the budget is nearly full, but r1 is in it"
    assert first.reservation is not None and again.reservation is not None
    assert again.reservation.groups == first.reservation.groups == frozenset({2})
    assert again.reservation.levels == first.reservation.levels == (60, 0, 60)
    assert await level(counters, org, T0 + 1) == 60
    assert not await counters.acquire(slots, "r2", T0 + 1), "r1 holds it, once"


async def test_finish_adjusts_releases_and_settles_in_one_call(counters: Counters) -> None:
    tpm = Bucket("rl:vk:a:tpm", capacity=100, per_second=10.0, cost=50)
    slots = Slots("cc:vk:a", limit=1, lease_s=LEASE_S)
    org, warn = budget("bg:org:0"), budget("bg:warn:0", blocking=False)
    assert (await counters.admit("r1", [tpm], [slots], [org, warn], [40, 40], LEASE_S, T0)).admitted

    used_less = Bucket(tpm.key, 100, 10.0, cost=-20)
    await counters.finish("r1", [used_less], [slots], [org, warn], [25, 0], HOLD_S, T0)
    assert (await counters.take([Bucket(tpm.key, 100, 10.0, cost=0)], T0)).remaining == (70.0,)
    assert await counters.acquire(slots, "r2", T0), "released"
    assert await level(counters, org, T0) == 25
    assert await level(counters, warn, T0) == 0

    await counters.finish("r1", [], [], [org, warn], [25, 0], HOLD_S, T0 + 1)
    assert await level(counters, org, T0 + 1) == 25, "settling twice adds nothing twice"
    await counters.finish("r1", [], [], [], [], HOLD_S, T0 + 1)
    assert await level(counters, org, T0 + HOLD_S) == 0, "the hold lapses as after settle"


# Memory


async def test_local_counters_forget_what_equals_never_seen() -> None:
    """Memory follows the keys in use: looked at inside, as nothing outside can tell."""
    local = LocalCounters()
    await local.take([rpm(60, key="rl:a")], T0)
    await local.take([rpm(60, key="rl:b")], T0 + 0.5)
    await local.acquire(Slots("cc:a", 1, LEASE_S), "r1", T0)
    await local.reserve("r1", [budget(expires_at=T0 + 100)], [10], LEASE_S, T0)
    assert len(local._tokens) == 2 and local._slots and local._budgets

    await local.take([rpm(60, key="rl:c")], T0 + 1)
    assert set(local._tokens) == {"rl:b", "rl:c"}, "rl:a is full again after a second"

    await local.take([rpm(60, key="rl:c", cost=0)], T0 + 1000)
    assert not local._tokens and not local._slots and not local._budgets
    assert len(local._forget) == 0


async def test_requests_forget_full_buckets_at_most_once_a_second() -> None:
    """`admit` and `finish` sweep once a second, not once a request: a bucket far from its
    limit, full again a moment after each take, is kept until then, and reads as full."""
    local = LocalCounters()
    quick = rpm(6000, key="rl:a")  # full again 0.01 s after a take
    await local.admit("r1", [quick], [], [], [], LEASE_S, T0)
    await local.admit("r2", [rpm(6000, key="rl:b")], [], [], [], LEASE_S, T0 + 0.5)
    assert set(local._tokens) == {"rl:a", "rl:b"}, "kept until the next sweep"
    admission = await local.admit("r3", [quick], [], [], [], LEASE_S, T0 + 0.9)
    assert admission.levels is not None and admission.levels.remaining == (5999.0,)
    await local.finish("r3", [], [], [], [], HOLD_S, T0 + 0.95)
    assert set(local._tokens) == {"rl:a", "rl:b"}
    await local.finish("r3", [], [], [], [], HOLD_S, T0 + 1.0)
    assert not local._tokens, "the sweep a second after the first forgot both"


async def test_local_counters_forget_acknowledged_seconds_a_figure_covers() -> None:
    local = LocalCounters()
    total = budget("bg:b1:total", ledger=0, as_of=T0 - 60)
    await local.settle("r1", [total], [20], HOLD_S, T0)
    await local.ledgered([("bg:b1:total", "r1")], T0)
    state = local._budgets["bg:b1:total"]
    assert state.acked == {int(T0): 20}

    await local.reserve("r2", [budget("bg:b1:total", ledger=20, as_of=T0 + 5)], [0], LEASE_S, T0)
    assert not state.acked and not state.acked_seconds and state.acked_sum == 0


async def test_redis_forgets_acknowledged_seconds_a_figure_covers() -> None:
    prefix = unique_prefix()
    shared = leased(prefix)
    client = redis_client()
    day = budget(ledger=0, as_of=T0 - 60, expires_at=T0 + 86_400)
    hash_key = f"{prefix}bg:{{{day.key}}}"
    try:
        await shared.settle("r1", [day], [20], HOLD_S, T0)
        await shared.ledgered([(day.key, "r1")], T0)
        assert await client.zrange(hash_key + ":ak", 0, -1) == [str(int(T0)).encode()]
        assert await client.hget(hash_key, f"a:{int(T0)}") == b"20"
        assert 0 < await client.pttl(hash_key + ":ak") <= 86_400_000, "expires with the window"

        newer = budget(ledger=20, as_of=T0 + 5, expires_at=T0 + 86_400)
        await shared.reserve("r2", [newer], [0], LEASE_S, T0 + 5)
        assert await client.exists(hash_key + ":ak") == 0
        assert await client.hget(hash_key, f"a:{int(T0)}") is None
        assert await client.hget(hash_key, "ack") == b"0"
    finally:
        await client.aclose()
        await shared.close()
        await delete_prefixed(prefix)


# Shared by every replica


async def test_concurrent_admits_on_replicas_give_back_exactly_what_they_refused() -> None:
    prefix = unique_prefix()
    replicas = [leased(prefix) for _ in range(3)]
    bucket = Bucket("rl:vk:a:rpd", capacity=1000, per_second=1000 / 86_400, cost=1)
    slots = Slots("cc:vk:a", limit=5, lease_s=LEASE_S)
    org = budget("bg:org:0", limit=1000)
    try:
        outcomes = await asyncio.gather(
            *(
                replicas[i % 3].admit(f"r{i}", [bucket], [slots], [org], [100], LEASE_S, T0)
                for i in range(60)
            )
        )
        assert sum(o.admitted for o in outcomes) == 5, "the slots are the tighter limit"
        # Once every replica has given back its idle slices, the store holds what the five
        # admitted took, and nothing of the refused ones.
        later = T0 + LEASED_TTL_S  # every slice idle for longer than half its time to live
        for replica in replicas:
            await replica.tick(later)
        newcomer = leased(prefix)
        try:
            remaining = (await newcomer.take([bucket], later)).remaining[0]
            assert 994 <= remaining < 994.01, "5 taken, then 1 (and a refill of 0.005)"
            assert await level(newcomer, org, later) == 500
        finally:
            await newcomer.close()
    finally:
        for replica in replicas:
            await replica.close()
        await delete_prefixed(prefix)


async def test_concurrent_replicas_never_overspend_a_shared_budget() -> None:
    prefix = unique_prefix()
    replicas = [leased(prefix) for _ in range(3)]
    unit = 1_000_000
    shared = budget("bg:org:0", limit=20 * unit)
    try:
        outcomes = await asyncio.gather(
            *(replicas[i % 3].reserve(f"r{i}", [shared], [unit], LEASE_S, T0) for i in range(300))
        )
        assert sum(o.admitted for o in outcomes) <= 20
        later = T0 + LEASED_TTL_S  # every slice idle for longer than half its time to live
        for replica in replicas:
            await replica.tick(later)
        newcomer = leased(prefix)
        try:
            admitted = sum(o.admitted for o in outcomes)
            assert await level(newcomer, shared, later) == admitted * unit
            more = [
                await newcomer.reserve(f"n{i}", [shared], [unit], LEASE_S, later) for i in range(21)
            ]
            assert admitted + sum(o.admitted for o in more) == 20, "idle slices came back"
        finally:
            await newcomer.close()
    finally:
        for replica in replicas:
            await replica.close()
        await delete_prefixed(prefix)


async def test_many_syncs_on_a_cluster_are_one_script_call_per_master(cluster_url: str) -> None:
    client = RedisCluster.from_url(cluster_url)
    store = RedisLeaseStore(client, unique_prefix())
    buckets = [Bucket(f"rl:vk:{n}:rpd", 60, 0.0, 1.0) for n in range(40)]
    try:
        await client.initialize()
        masters = client.get_primaries()
        assert len({client.get_node_from_key(f"{{{b.key}}}").name for b in buckets}) == 3

        async def script_calls() -> int:
            """Script calls that ran (a refused one, for a script not loaded, left out)."""
            stats = await client.info("commandstats", target_nodes=RedisCluster.PRIMARIES)
            ran = 0
            for stat in stats.values():
                evalsha = stat.get("cmdstat_evalsha", {})
                ran += int(evalsha.get("calls", 0)) - int(evalsha.get("failed_calls", 0))
            return ran

        def takes(now: float) -> list[Call]:
            return [
                store.tokens(b, "r.1", now, used=0, keep=0, need=1, want=1, ttl=5.0, pay=1)
                for b in buckets
            ]

        before = await script_calls()
        grants = await store.run(takes(T0))
        assert [g.granted for g in grants if isinstance(g, Grant)] == [1.0] * len(buckets)
        assert await script_calls() - before == len(masters)

        # A master that lost its scripts (restarted, or a replica that took over) is given
        # them again, and the syncs it refused are sent again: none is lost or run twice.
        await client.script_flush()  # on every master
        grants = await store.run(takes(T0 + 1))
        assert [g.granted for g in grants if isinstance(g, Grant)] == [1.0] * len(buckets)
        levels = {g.level for g in grants if isinstance(g, Grant)}
        assert levels == {58.0}, "each bucket paid twice, once a call"
    finally:
        await store.close()

"""What `LeasedCounters` does beyond the `Counters` contract: slices, syncs and what they report.

The store is a real Redis; a store whose budget syncs wait on a gate the test opens lets a test
look at a replica while a sync is in flight, without any timing.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from proxy.limits._lease_state import Lease, Schedule
from proxy.limits.lease_store import BUDGET_SCRIPT, Call, Grant, RedisLeaseStore
from proxy.limits.leases import LeasedCounters
from proxy.limits.store import Bucket, BudgetBucket, Slots
from proxy.settings import ProxySettings
from proxy.telemetry.metrics import ProxyMetrics
from tests.proxy.test_counters import delete_prefixed, redis_client
from tests.support.clock import ManualClock
from tests.support.env import INTERNAL_SECRET
from vkgate import env as E

T0 = 1_800_000_000.0
LEASE_S = 30.0
HOLD_S = 600.0
TTL_S = 2.0
PAST = ManualClock(datetime(2001, 1, 1, tzinfo=UTC))
"""The counters' clock, far behind every `now` the tests give: those are the time."""


class GatedStore(RedisLeaseStore):
    """A Redis store whose budget syncs (and the syncs sent with them) wait for `gate` while
    it is closed."""

    def __init__(self, prefix: str) -> None:
        super().__init__(redis_client(), prefix)
        self.prefix = prefix
        self.gate = asyncio.Event()
        self.gate.set()
        self.waiting = 0

    async def run(self, calls: Sequence[Call]) -> list[Grant | Exception]:
        if any(call.script == BUDGET_SCRIPT for call in calls):
            self.waiting += 1
            await self.gate.wait()
            self.waiting -= 1
        return await super().run(calls)


@pytest.fixture
async def gated() -> AsyncIterator[tuple[LeasedCounters, GatedStore]]:
    prefix = f"vkgate-test-{secrets.token_hex(6)}:"
    store = GatedStore(prefix)
    counters = LeasedCounters(store, PAST, ttl_s=TTL_S)
    try:
        yield counters, store
    finally:
        store.gate.set()
        await counters.close()
        await delete_prefixed(prefix)


def budget(limit: int = 100) -> BudgetBucket:
    return BudgetBucket("bg:b1:0", limit, 0, 0.0, True, 0, None)


async def stored_level(prefix: str) -> int:
    """The bucket's level as a newcomer replica finds it in the store."""
    other = LeasedCounters(RedisLeaseStore(redis_client(), prefix), PAST)
    try:
        probe = await other.reserve("probe", [budget()], [0], LEASE_S, T0 + 0.5)
        return probe.levels[0]
    finally:
        await other.close()


async def test_spend_being_reported_is_not_room_in_the_slice_meanwhile(
    gated: tuple[LeasedCounters, GatedStore],
) -> None:
    counters, store = gated
    assert (await counters.reserve("r1", [budget()], [40], LEASE_S, T0)).admitted
    await counters.settle("r1", [budget()], [40], HOLD_S, T0)
    store.gate.clear()
    report = asyncio.create_task(counters.tick(T0 + 0.1))
    while store.waiting == 0:
        await asyncio.sleep(0)  # the tick starts its report, which waits at the gate

    # The slice held 40, all settled: nothing of it is room, report in flight or not.
    second = asyncio.create_task(counters.reserve("r2", [budget()], [30], LEASE_S, T0 + 0.1))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not second.done(), "admitted from spend being reported, without the store"

    store.gate.set()
    await report
    assert (await second).admitted, "the store had room for it"
    await counters.tick(T0 + 1.5)  # its idle room goes back
    assert await stored_level(store.prefix) == 70


async def test_a_slice_grows_with_the_pace_it_is_spent_at_and_shrinks_near_the_limit() -> None:
    prefix = f"vkgate-test-{secrets.token_hex(6)}:"
    counters = LeasedCounters(RedisLeaseStore(redis_client(), prefix), PAST, ttl_s=TTL_S)
    bucket = Bucket("rl:vk:a:rpm", capacity=1000, per_second=0.0, cost=1)
    try:
        for _ in range(200):
            assert (await counters.take([bucket], T0)).admitted
        busy = counters.stats.taken
        assert busy < 20, f"200 requests took {busy} slices: most were served locally"
        for _ in range(900):
            await counters.take([bucket], T0)
        assert not (await counters.take([bucket], T0)).admitted, "exactly the capacity"
        assert counters.stats.local + counters.stats.synced == 1101
    finally:
        await counters.close()
        await delete_prefixed(prefix)


async def test_a_budget_whose_limit_changed_gets_its_slice_back_before_admitting_under_it() -> None:
    prefix = f"vkgate-test-{secrets.token_hex(6)}:"
    counters = LeasedCounters(RedisLeaseStore(redis_client(), prefix), PAST, ttl_s=TTL_S)
    try:
        for n in range(5):  # a slice larger than one request, at this pace
            assert (await counters.reserve(f"r{n}", [budget(1000)], [10], LEASE_S, T0)).admitted
        lowered = await counters.reserve("r5", [budget(60)], [20], LEASE_S, T0)
        assert counters.stats.revoked == 1
        assert not lowered.admitted, "50 reserved of 60: no room for 20 more"
        assert lowered.levels == (50,), "nothing of the old slice is counted any more"
    finally:
        await counters.close()
        await delete_prefixed(prefix)


def test_lease_settings_are_read_and_checked() -> None:
    def settings(**values: str) -> ProxySettings:
        return ProxySettings.from_env({"VKGATE_INTERNAL_SECRET": INTERNAL_SECRET, **values})

    assert (settings().limits_lease_s, settings().redis_cluster) == (2.0, False)
    read = settings(VKGATE_LIMITS_LEASE_SECONDS="5", VKGATE_REDIS_CLUSTER="true")
    assert (read.limits_lease_s, read.redis_cluster) == (5.0, True)
    for value in ("0.1", "61"):
        with pytest.raises(E.SettingError, match="VKGATE_LIMITS_LEASE_SECONDS must be between"):
            settings(VKGATE_LIMITS_LEASE_SECONDS=value)
    with pytest.raises(E.SettingError, match="VKGATE_REDIS_CLUSTER"):
        settings(VKGATE_REDIS_CLUSTER="maybe")


class CountingStore(RedisLeaseStore):
    """A store that records the syncs of each `run`: one `run` is one round trip per node."""

    def __init__(self, client: Any, prefix: str) -> None:
        super().__init__(client, prefix)
        self.runs: list[list[int]] = []

    async def run(self, calls: Sequence[Call]) -> list[Grant | Exception]:
        self.runs.append(sorted(call.script for call in calls))
        return await super().run(calls)


TOKENS_SCRIPT, SLOTS_SCRIPT = 0, 1


async def test_a_rare_keys_request_makes_one_round_trip_in_and_one_out() -> None:
    prefix = f"vkgate-test-{secrets.token_hex(6)}:"
    store = CountingStore(redis_client(), prefix)
    counters = LeasedCounters(store, PAST, ttl_s=TTL_S)
    rpm = Bucket("rl:vk:a:rpm", capacity=10, per_second=0.0, cost=1)
    rpd = Bucket("rl:vk:a:rpd", capacity=100, per_second=0.0, cost=1)
    tpm = Bucket("rl:vk:a:tpm", capacity=1000, per_second=0.0, cost=300)
    slots = Slots("cc:vk:a", limit=2, lease_s=LEASE_S)
    try:
        admission = await counters.admit(
            "r1", [rpm, rpd, tpm], [slots], [budget()], [40], LEASE_S, T0
        )
        assert admission.admitted
        assert admission.levels is not None and admission.levels.remaining == (9, 99, 700)
        five = sorted([TOKENS_SCRIPT] * 3 + [SLOTS_SCRIPT, BUDGET_SCRIPT])
        assert store.runs == [five], "every bucket new: one round trip for all five"

        await counters.finish("r1", [], [slots], [budget()], [25], HOLD_S, T0 + 0.05)
        await counters.tick(T0 + 0.25)
        # The tokens were paid by the call that took them: only the budget owes a report, and
        # what is left of its slice (15, less than the request's 40) goes back with it.
        assert store.runs[1:] == [[BUDGET_SCRIPT]]
        for quarter in range(2, 6):  # a tick every quarter second, T0 + 0.5 to T0 + 1.25
            await counters.tick(T0 + quarter / 4)
        # Due for renewal at T0 + 1 but idle by the next tick: given back then, not renewed.
        assert store.runs[2:] == [[SLOTS_SCRIPT]], "the idle slot goes back; nothing else"
        await counters.tick(T0 + 1.5)
        assert len(store.runs) == 3, "nothing is left to sync"

        # Another replica finds the buckets as one request left them.
        other = LeasedCounters(RedisLeaseStore(redis_client(), prefix), PAST, ttl_s=TTL_S)
        try:
            seen = await other.admit(
                "r2", [rpm, rpd, tpm], [slots], [budget()], [0], LEASE_S, T0 + 2
            )
            assert seen.levels is not None and seen.levels.remaining == (8, 98, 400)
            assert seen.reservation is not None and seen.reservation.levels == (25,)
        finally:
            await other.close()
    finally:
        await counters.close()
        await delete_prefixed(prefix)


async def test_a_token_paid_for_a_request_another_bucket_refused_goes_back() -> None:
    prefix = f"vkgate-test-{secrets.token_hex(6)}:"
    counters = LeasedCounters(RedisLeaseStore(redis_client(), prefix), PAST, ttl_s=TTL_S)
    rpm = Bucket("rl:vk:a:rpm", capacity=5, per_second=0.0, cost=1)
    full = Slots("cc:vk:a", limit=0, lease_s=LEASE_S)
    try:
        refused = await counters.admit("r1", [rpm], [full], [], [], LEASE_S, T0)
        assert not refused.admitted
        await counters.tick(T0 + 1.5)  # idle: what it holds goes back
        other = LeasedCounters(RedisLeaseStore(redis_client(), prefix), PAST, ttl_s=TTL_S)
        try:
            assert (await other.take([rpm], T0 + 2)).remaining == (4.0,), "the 5 are whole"
        finally:
            await other.close()
    finally:
        await counters.close()
        await delete_prefixed(prefix)


def test_a_tick_is_due_the_leases_touched_and_those_whose_time_came_each_once() -> None:
    schedule = Schedule()
    quiet, touched, due = (Lease(name) for name in ("quiet", "touched", "due"))
    schedule.at(quiet, T0 + 1.0)
    schedule.at(due, T0 + 0.5)
    schedule.at(due, T0 + 0.9)  # a later time leaves the earlier one set
    schedule.touch(touched)
    schedule.touch(touched)
    schedule.at(touched, T0 + 0.2)
    assert schedule.due(T0 + 0.25) == [touched]
    assert schedule.due(T0 + 0.5) == [due]
    schedule.at(quiet, T0 + 0.6)  # earlier: the entry for T0 + 1 is stale from now on
    assert schedule.due(T0 + 0.75) == [quiet]
    assert schedule.due(T0 + 2.0) == [], "each lease once, stale entries dropped"
    assert len(schedule) == 0


async def test_spend_a_killed_replica_had_not_reported_counts_again_once_the_ledger_has_it() -> (
    None
):
    """What a replica settled after its last report is lost with it, for at most a tick: its
    slice lapses back into the budget, and the settled spend counts again when the ledger
    (its spool, shipped once the replica is back) brings a newer figure."""
    prefix = f"vkgate-test-{secrets.token_hex(6)}:"
    doomed_store = RedisLeaseStore(redis_client(), prefix)
    doomed = LeasedCounters(doomed_store, PAST, ttl_s=TTL_S)
    survivor = LeasedCounters(RedisLeaseStore(redis_client(), prefix), PAST, ttl_s=TTL_S)
    try:
        assert (await doomed.reserve("r1", [budget()], [30], LEASE_S, T0)).admitted
        await doomed.tick(T0 + 0.25)
        await doomed.settle("r1", [budget()], [30], HOLD_S, T0 + 0.3)
        # Killed before its next tick: no report, no shutdown.
        await doomed_store.close()

        after_lapse = T0 + 0.3 + TTL_S
        probe = await survivor.reserve("p1", [budget()], [0], LEASE_S, after_lapse)
        assert probe.levels == (0,), "the slice came back; the spend is missing meanwhile"

        ledger = BudgetBucket("bg:b1:0", 100, 30, after_lapse, True, 0, None)
        probe = await survivor.reserve("p2", [ledger], [0], LEASE_S, after_lapse + 0.1)
        assert probe.levels == (30,), "the ledger's figure brings it back"
    finally:
        await survivor.close()
        await delete_prefixed(prefix)


async def test_the_metrics_count_slices_taken_returned_expired_and_revoked() -> None:
    prefix = f"vkgate-test-{secrets.token_hex(6)}:"
    counters = LeasedCounters(RedisLeaseStore(redis_client(), prefix), PAST, ttl_s=TTL_S)
    metrics = ProxyMetrics()
    metrics.sources.limits_leases = lambda: counters.stats

    def sample(name: str, labels: dict[str, str] | None = None) -> float:
        value = metrics.registry.get_sample_value(name, labels or {})
        assert value is not None, name
        return value

    rpm = Bucket("rl:vk:a:rpm", capacity=1000, per_second=0.0, cost=1)
    try:
        for _ in range(10):  # one sync, then a slice at the pace it is spent
            assert (await counters.take([rpm], T0)).admitted
        lowered = Bucket(rpm.key, capacity=500, per_second=0.0, cost=1)
        assert (await counters.take([lowered], T0 + 0.1)).admitted  # the old slice goes back
        await counters.tick(T0 + 1.5)  # idle: the new slice goes back
        for _ in range(2):  # the first pays for itself; the second takes a slice
            assert (await counters.take([lowered], T0 + 2)).admitted
        # Not synced for longer than a time to live: the store had lapsed the slice.
        assert (await counters.take([lowered], T0 + 2 + 2 * TTL_S)).admitted
        events = {
            event: sample("vkgate_limits_leases_total", {"event": event})
            for event in ("taken", "returned", "expired", "revoked")
        }
        assert events == {"taken": 6, "returned": 1, "expired": 1, "revoked": 1}, events
        local = sample("vkgate_limits_admissions_total", {"source": "lease"})
        synced = sample("vkgate_limits_admissions_total", {"source": "redis"})
        assert local + synced == 14
        assert synced == 6, "each take of a slice was a request's"
        assert sample("vkgate_limits_served_without_redis_ratio") == local / 14
    finally:
        await counters.close()
        await delete_prefixed(prefix)


async def test_a_request_cancelled_while_its_sync_is_out_leaves_the_sync_to_finish() -> None:
    prefix = f"vkgate-test-{secrets.token_hex(6)}:"
    counters = LeasedCounters(RedisLeaseStore(redis_client(), prefix), PAST, ttl_s=TTL_S)
    rpm = Bucket("rl:vk:a:rpm", capacity=10, per_second=0.0, cost=1)
    try:
        first = asyncio.create_task(counters.take([rpm], T0))
        await asyncio.sleep(0)  # it starts its sync, which pays for it
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        # The next request finds the sync answered (or waits for it) and spends what it paid.
        assert (await counters.take([rpm], T0)).remaining == (9.0,)
        await counters.tick(T0 + 1.5)
        other = LeasedCounters(RedisLeaseStore(redis_client(), prefix), PAST, ttl_s=TTL_S)
        try:
            assert (await other.take([rpm], T0 + 2)).remaining == (8.0,), "paid once each"
        finally:
            await other.close()
    finally:
        await counters.close()
        await delete_prefixed(prefix)

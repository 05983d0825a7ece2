"""`FallbackCounters`: served locally while Redis is unreachable, shared again once it answers."""

from __future__ import annotations

import logging
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from proxy.limits.counters import LocalCounters
from proxy.limits.fallback import FallbackCounters
from proxy.limits.lease_store import RedisLeaseStore
from proxy.limits.leases import LeasedCounters
from proxy.limits.store import Bucket, BudgetBucket, Counters, Slots
from tests.support.clock import ManualClock
from tests.support.processes import free_port, stop

T0 = 1_800_000_000.0
RETRY_S = 5.0
READY_TIMEOUT_S = 10.0
POLL_INTERVAL_S = 0.05
ONE_A_MINUTE = Bucket("rl:vk:a:rpm", capacity=1, per_second=1 / 60, cost=1)
BUDGET = BudgetBucket(
    key="bg:b1:0",
    limit_nanos=100,
    ledger_nanos=10,
    ledger_as_of=T0 - 60,
    blocking=True,
    group=0,
    expires_at=None,
)


@pytest.fixture(params=["leased"])
def shared(request: pytest.FixtureRequest) -> str:
    """The shared counters behind the fallback."""
    kind: str = request.param
    return kind


def counters_at(port: int, clock: ManualClock, shared: str) -> FallbackCounters:
    # No retries of the client's own: failing fast is the fallback's job.
    client = Redis(
        host="127.0.0.1",
        port=port,
        socket_connect_timeout=1,
        socket_timeout=1,
        retry=Retry(NoBackoff(), 0),
    )
    prefix = f"vkgate-test-{secrets.token_hex(6)}:"
    store: Counters = LeasedCounters(RedisLeaseStore(client, prefix), clock)
    return FallbackCounters(store, LocalCounters(), clock, retry_s=RETRY_S)


def messages(caplog: pytest.LogCaptureFixture, start: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "vkgate.proxy.limits" and r.getMessage().startswith(start)
    ]


@contextmanager
def redis_server(port: int, directory: Path) -> Iterator[None]:
    """A throwaway `redis-server` of this test's own on `port`, stopped by its PID."""
    executable = shutil.which("redis-server")
    if executable is None:
        pytest.skip("redis-server is not installed")
    with (directory / "redis.log").open("wb") as log:
        process = subprocess.Popen(
            [
                executable,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(directory),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1)
        while True:
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("redis-server did not come up") from None
                time.sleep(POLL_INTERVAL_S)  # waiting on another process, bounded above
        client.close()
        yield
    finally:
        stop(process)


def stopped_clock() -> ManualClock:
    """A clock only the test moves: the retry is due when the test says so, however long
    starting a redis-server takes in real time."""
    clock = ManualClock()
    clock.freeze()
    return clock


async def test_an_unreachable_redis_is_served_locally_with_one_warning(
    caplog: pytest.LogCaptureFixture,
    shared: str,
) -> None:
    caplog.set_level(logging.INFO, logger="vkgate.proxy.limits")
    clock = stopped_clock()
    counters = counters_at(free_port(), clock, shared)  # nothing listens there
    try:
        assert (await counters.take([ONE_A_MINUTE], T0)).admitted
        assert counters.degraded
        assert not (await counters.take([ONE_A_MINUTE], T0)).admitted, "the local bucket counts"
        clock.elapse(RETRY_S + 1)
        assert not (await counters.take([ONE_A_MINUTE], T0 + 1)).admitted, "Redis tried, still out"
        assert counters.degraded
        assert counters.local_calls == 3

        [warning] = messages(caplog, "limits_redis_unreachable")
        assert "per replica" in warning
        assert not messages(caplog, "limits_redis_recovered")
    finally:
        await counters.close()


async def test_calls_go_back_to_redis_once_it_answers_and_retry_s_passed(
    caplog: pytest.LogCaptureFixture, tmp_path: Path, shared: str
) -> None:
    caplog.set_level(logging.INFO, logger="vkgate.proxy.limits")
    clock = stopped_clock()
    port = free_port()
    counters = counters_at(port, clock, shared)
    try:
        assert (await counters.take([ONE_A_MINUTE], T0)).admitted
        assert counters.degraded

        with redis_server(port, tmp_path):
            clock.elapse(RETRY_S - 1)
            assert not (await counters.take([ONE_A_MINUTE], T0)).admitted, "not retried yet"
            assert counters.degraded

            clock.elapse(2)
            shared = await counters.take([ONE_A_MINUTE], T0)
            assert shared.admitted, "Redis has never seen this bucket"
            assert not counters.degraded
            assert not (await counters.take([ONE_A_MINUTE], T0)).admitted
            assert not counters.degraded

            assert len(messages(caplog, "limits_redis_unreachable")) == 1
            assert len(messages(caplog, "limits_redis_recovered")) == 1
    finally:
        await counters.close()


async def test_budgets_are_settled_and_acknowledged_locally_while_redis_is_out(shared: str) -> None:
    clock = stopped_clock()
    counters = counters_at(free_port(), clock, shared)
    try:
        assert (await counters.reserve("r1", [BUDGET], [50], 30.0, T0)).admitted
        await counters.settle("r1", [BUDGET], [20], 600.0, T0)
        await counters.ledgered([(BUDGET.key, "r1")], T0 + 1)
        assert counters.degraded
        probe = await counters.reserve("probe", [BUDGET], [0], 30.0, T0 + 700)
        assert probe.levels == (30,), "acknowledged locally: counted past the hold"
    finally:
        await counters.close()


async def test_requests_are_admitted_and_finished_locally_while_redis_is_out(shared: str) -> None:
    clock = stopped_clock()
    counters = counters_at(free_port(), clock, shared)
    slots = Slots("cc:vk:a", limit=1, lease_s=30.0)
    before = counters.local_calls
    try:
        admitted = await counters.admit("r1", [ONE_A_MINUTE], [slots], [BUDGET], [50], 30.0, T0)
        assert admitted.admitted and counters.degraded
        refused = await counters.admit("r2", [], [slots], [], [], 30.0, T0)
        assert refused.slots_refused == 0, "r1 holds the local slot"

        await counters.finish("r1", [], [slots], [BUDGET], [20], 600.0, T0)
        assert (await counters.admit("r2", [], [slots], [], [], 30.0, T0)).admitted, "released"
        probe = await counters.reserve("probe", [BUDGET], [0], 30.0, T0)
        assert probe.levels == (30,), "settled locally: the ledger's 10 and r1's 20"
        assert counters.local_calls == before + 5
    finally:
        await counters.close()


async def test_a_report_that_cannot_reach_redis_puts_limits_in_process_until_it_answers(
    tmp_path: Path,
) -> None:
    """Requests served from a leased slice make no Redis call: the tick's report is what finds
    Redis gone, and a probe must reach Redis before calls go back to it."""
    clock = stopped_clock()
    port = free_port()
    client = Redis(host="127.0.0.1", port=port, socket_timeout=1, retry=Retry(NoBackoff(), 0))
    leased = LeasedCounters(RedisLeaseStore(client, f"vkgate-test-{secrets.token_hex(6)}:"), clock)
    counters = FallbackCounters(leased, LocalCounters(), clock, RETRY_S, check=leased.check)
    leased.on_failure = counters.failed
    busy = Bucket("rl:vk:a:rpm", capacity=6000, per_second=100, cost=1)
    try:
        with redis_server(port, tmp_path):
            assert (await counters.take([busy], T0)).admitted
            assert (await counters.take([busy], T0)).admitted, "a second take: a larger slice"
        assert (await counters.take([busy], T0)).admitted, "served from the slice"
        assert not counters.degraded, "no call met Redis gone"

        with pytest.raises(redis.exceptions.ConnectionError):
            await leased.tick(T0 + 0.3)
        assert counters.degraded, "the report found Redis gone"
        clock.elapse(RETRY_S + 1)
        assert (await counters.take([busy], T0 + 0.3)).admitted
        assert counters.degraded, "the probe could not reach Redis: still in-process"
    finally:
        await counters.close()

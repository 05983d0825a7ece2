"""Leased limits held by three `vkgate proxy` processes, on one Redis and on a Redis Cluster.

Each store is the test's own (a `redis-server`, or three cluster masters made with
`redis-cli --cluster create`), so a failover can be played by stopping it. The proxies lease
slices for a second (`VKGATE_LIMITS_LEASE_SECONDS=1`). Real processes cannot share the test's
clock: where a lease's time to live must pass, the test polls Redis for the state that says it
has (bounded by a deadline), never sleeps for it. Assertions are on counts, never on how long
anything took; where a bucket refills while a burst runs, the bound says by how much.
"""

from __future__ import annotations

import asyncio
import math
import signal
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
import redis
from redis.crc import key_slot

from tests.proxy.test_limits_replicas import (
    BUDGET_BURST,
    COST_USD,
    LIMIT_USD,
    WORST_CASE,
    burst,
    created,
    new_key,
    post,
    priced_tenant,
    settled_report,
    stop_together,
)
from tests.proxy.test_processes import proxy_env
from tests.support.api import ADMIN
from tests.support.fake_openai import FakeOpenAI
from tests.support.processes import (
    Service,
    free_port,
    sqlite_controlplane,
    start,
    wait_until_healthy,
)
from tests.support.redis_servers import RedisServer, redis_cluster, redis_server

PREFIX = "vkgate:"
REPLICAS = 3
LEASE_S = 1.0
WAIT_S = 15.0
"""Bound on every wait for another process (a lease's return, a failover's recovery)."""
POLL_S = 0.1
DOOMED_LEASE_S = 4.0


@dataclass
class Fleet:
    kind: str
    """`redis` or `cluster`."""
    controlplane: Service
    proxies: list[Service]
    servers: list[RedisServer]
    redis_url: str
    workdir: Path

    def client(self) -> redis.Redis | redis.RedisCluster:
        if self.kind == "cluster":
            return redis.RedisCluster.from_url(self.redis_url, decode_responses=True)
        return redis.Redis.from_url(self.redis_url, decode_responses=True)

    def env(self, n: int, port: int, lease_s: float = LEASE_S) -> dict[str, str]:
        return proxy_env(
            self.controlplane.url,
            port,
            VKGATE_REDIS_URL=self.redis_url,
            VKGATE_REDIS_CLUSTER="true" if self.kind == "cluster" else "false",
            VKGATE_LIMITS_LEASE_SECONDS=str(lease_s),
            VKGATE_SPOOL_DIR=str(self.workdir / f"spool-{n}"),
            VKGATE_REPLICA_ID=f"replica-{n}",
        )

    def proxy(self, n: int, lease_s: float = LEASE_S) -> Service:
        port = free_port()
        log = self.workdir / f"proxy-{n}.log"
        env = self.env(n, port, lease_s)
        return start(["proxy"], env=env, port=port, log=log, cwd=self.workdir)

    def logs(self) -> str:
        return "\n".join(f"--- {p.log.name}\n{p.output()[-3000:]}" for p in self.proxies)


@pytest.fixture(scope="module", params=["redis", "cluster"])
def fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """A control plane and three proxies sharing a store of the test's own."""
    kind: str = request.param
    workdir = tmp_path_factory.mktemp(f"leases-{kind}")
    with ExitStack() as stack:
        if kind == "cluster":
            cluster = stack.enter_context(redis_cluster(workdir / "redis"))
            servers, url = cluster.nodes, cluster.url
        else:
            server = stack.enter_context(redis_server(workdir / "redis"))
            servers, url = [server], server.url
        controlplane = stack.enter_context(sqlite_controlplane(workdir))
        fleet = Fleet(kind, controlplane, [], servers, url, workdir)
        stack.callback(stop_together, fleet.proxies)
        for n in range(1, REPLICAS + 1):
            fleet.proxies.append(fleet.proxy(n))
        for proxy in fleet.proxies:
            wait_until_healthy(proxy)
        yield fleet


async def limits_mode(proxy: Service) -> str:
    async with httpx.AsyncClient(timeout=5) as http:
        mode: str = (await http.get(f"{proxy.url}/readyz")).json()["limits"]
        return mode


async def assert_shared(fleet: Fleet) -> None:
    for proxy in fleet.proxies:
        assert await limits_mode(proxy) == "redis", fleet.logs()


def leases_of(fleet: Fleet, hash_key: str, prefix: str = "l:") -> dict[str, str]:
    client = fleet.client()
    try:
        fields: dict[str, str] = client.hgetall(hash_key)
    finally:
        client.close()
    return {name: value for name, value in fields.items() if name.startswith(prefix)}


async def until(check: object, what: str) -> None:
    """Poll `check()` (a callable returning a truth value) until it holds, within `WAIT_S`."""
    assert callable(check)
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        await asyncio.sleep(POLL_S)  # waiting on other processes, bounded above


def tokens_key(key_id: str, window: str) -> str:
    return f"{PREFIX}tl:{{rl:vk:{key_id}:{window}}}"


async def test_an_rpm_burst_admits_at_most_the_limit_and_exactly_it_once_idle_slices_return(
    fleet: Fleet, fake_openai: FakeOpenAI
) -> None:
    rpm = 6  # refills one request every 10 s: a few seconds of test add none
    async with httpx.AsyncClient(base_url=fleet.controlplane.url, timeout=10) as admin:
        tenant = await priced_tenant(admin, fake_openai)
        key_id, key = await new_key(admin, tenant, limits={"rpm": rpm})
    await assert_shared(fleet)
    started = time.monotonic()

    first = await burst(fleet.proxies, key, 60)
    statuses = Counter(a.status_code for a in first.answers)
    assert set(statuses) <= {200, 429}, (statuses, fleet.logs())
    refill = math.floor((time.monotonic() - started) * rpm / 60)
    assert statuses[200] <= rpm + refill, statuses

    # Slices nobody uses go back within a lease's time to live.
    await until(lambda: not leases_of(fleet, tokens_key(key_id, "rpm")), "idle slices returned")
    second = await burst(fleet.proxies, key, 60)
    admitted = statuses[200] + sum(a.status_code == 200 for a in second.answers)
    refill = math.floor((time.monotonic() - started) * rpm / 60)
    print(
        f"\n{fleet.kind}: rpm {rpm}: {statuses[200]} admitted in the burst, {admitted} in all "
        f"(refill {refill})"
    )
    assert rpm <= admitted <= rpm + refill
    for answer in second.answers:
        assert answer.headers["x-ratelimit-limit-requests"] == str(rpm), answer.headers
        if answer.status_code == 429:
            assert answer.json()["error"]["code"] == "rate_limited", answer.text
            assert int(answer.headers["retry-after"]) >= 1, answer.headers
    await assert_shared(fleet)


async def test_300_requests_against_a_budget_worth_20_overspend_it_by_at_most_one_per_replica(
    fleet: Fleet, fake_openai: FakeOpenAI
) -> None:
    async with httpx.AsyncClient(base_url=fleet.controlplane.url, timeout=10) as admin:
        tenant = await priced_tenant(admin, fake_openai)
        key_id, key = await new_key(admin, tenant)
        budget = {
            "organization_id": tenant.org,
            "scope": {"kind": "virtual_key", "id": key_id},
            "window": "day",
            "on_breach": "block",
            "limit_usd": str(LIMIT_USD),
        }
        budget_id = (await created(admin, "/api/admin/budgets", budget))["id"]
        await assert_shared(fleet)

        sent = await burst(fleet.proxies, key, BUDGET_BURST)
        statuses = Counter(a.status_code for a in sent.answers)
        assert set(statuses) <= {200, 402}, (statuses, fleet.logs())
        served = statuses[200]
        totals = await settled_report(admin, tenant.org, BUDGET_BURST)
        spent = Decimal(totals["cost_usd"])
        print(f"\n{fleet.kind}: budget {LIMIT_USD} USD: {served} served, {spent} USD spent")
        assert spent == served * COST_USD
        assert spent <= LIMIT_USD + REPLICAS * COST_USD

        # Once the slices are back, one request at a time serves until what is left cannot
        # cover a request's worst case: nothing is stuck in a slice.
        budget_hash = f"{PREFIX}bg:{{bg:{budget_id}:"
        await until(lambda: not _budget_slices(fleet, budget_hash), "budget slices returned")
        async with httpx.AsyncClient(timeout=10) as http:
            for turn in range(REPLICAS * 20):
                answer = await post(http, fleet.proxies[turn % REPLICAS], key)
                if answer.status_code == 402:
                    break
                assert answer.status_code == 200, answer.text
        assert answer.status_code == 402, "the budget never ran out"
    error = answer.json()["error"]
    assert error["budget_id"] == budget_id, error
    worst = WORST_CASE.search(error["message"])
    assert worst is not None, error
    assert Decimal(error["remaining_usd"]) < Decimal(worst.group(1)), error


def _budget_slices(fleet: Fleet, budget_hash_prefix: str) -> dict[str, str]:
    """The open slices (`o:` entries) of every window bucket of a budget."""
    client = fleet.client()
    try:
        names = [n for n in client.scan_iter(match=budget_hash_prefix + "*") if n[-1] == "}"]
        found: dict[str, str] = {}
        for name in names:
            for field, value in client.hgetall(name).items():
                if field.startswith("o:"):
                    found[f"{name} {field}"] = value
        return found
    finally:
        client.close()


async def test_a_killed_proxy_gives_its_slices_back_within_their_time_to_live(
    fleet: Fleet, fake_openai: FakeOpenAI
) -> None:
    rpd = 40  # refills nothing in a test's seconds: every count below is exact
    async with httpx.AsyncClient(base_url=fleet.controlplane.url, timeout=10) as admin:
        tenant = await priced_tenant(admin, fake_openai)
        key_id, key = await new_key(admin, tenant, limits={"rpd": rpd})
    bucket = tokens_key(key_id, "rpd")
    # Its slices live longer, so it still holds one, idle, when it is killed.
    doomed = fleet.proxy(9, lease_s=DOOMED_LEASE_S)
    try:
        wait_until_healthy(doomed)
        async with httpx.AsyncClient(timeout=10) as http:
            for _ in range(3):
                assert (await post(http, doomed, key)).status_code == 200
        # Its slice holds more than it used; once it has reported what it used, it dies.
        client = fleet.client()
        try:

            def reported() -> bool:
                fields = client.hgetall(bucket)
                held = sum(float(v.split()[0]) for f, v in fields.items() if f.startswith("l:"))
                # The level refills by 40 a day meanwhile: a few thousandths.
                return bool(fields) and held > 0 and abs(float(fields["level"]) + held - 37) < 0.01

            await until(reported, "the doomed proxy reported its use")
            held = leases_of(fleet, bucket)
            assert held, "the doomed proxy holds a slice"
            doomed.process.send_signal(signal.SIGKILL)
            doomed.process.wait(timeout=10)
            deadline = max(float(v.split()[1]) for v in held.values())
            await until(lambda: time.time() > deadline, "the dead proxy's slice lapsed")
        finally:
            client.close()
    finally:
        stop_together([doomed])

    sent = await burst(fleet.proxies, key, 2 * rpd)
    admitted = sum(a.status_code == 200 for a in sent.answers)
    assert admitted <= rpd - 3, fleet.logs()
    # A burst's last slices can be left unspent on a replica whose requests were all answered:
    # once they are back, whatever of the limit is left is admitted.
    await until(lambda: not leases_of(fleet, bucket), "idle slices returned")
    again = await burst(fleet.proxies, key, 2 * rpd)
    late = sum(a.status_code == 200 for a in again.answers)
    print(
        f"\n{fleet.kind}: rpd {rpd}: 3 by the killed proxy, {admitted} by the others after "
        f"(and {late} once their idle slices were back)"
    )
    assert admitted + late == rpd - 3, fleet.logs()


async def test_a_limit_lowered_mid_burst_is_obeyed_within_a_second(
    fleet: Fleet, fake_openai: FakeOpenAI
) -> None:
    lowered = 6
    async with httpx.AsyncClient(base_url=fleet.controlplane.url, timeout=10) as admin:
        tenant = await priced_tenant(admin, fake_openai)
        key_id, key = await new_key(admin, tenant, limits={"rpm": 600})
        await assert_shared(fleet)
        answers: list[tuple[float, httpx.Response]] = []
        stop = asyncio.Event()

        async def sender(n: int) -> None:
            async with httpx.AsyncClient(timeout=10) as http:
                turn = n
                while not stop.is_set():
                    sent_at = time.monotonic()
                    answers.append((sent_at, await post(http, fleet.proxies[turn % REPLICAS], key)))
                    turn += 1

        senders = [asyncio.create_task(sender(n)) for n in range(6)]
        try:
            # The burst runs under the first limit for a while, then under the lowered one.
            await _until_async(_counted(lambda: len(answers) >= 30), "answers under rpm 600")
            patched = await admin.patch(
                f"/api/admin/virtual-keys/{key_id}",
                json={"limits": {"rpm": lowered}},
                headers=ADMIN,
            )
            assert patched.status_code == 200, patched.text
            changed = time.monotonic()
            await _until_async(
                _counted(lambda: sum(at >= changed + 1.0 for at, _ in answers) >= 40),
                "answers a second after the change",
            )
        finally:
            stop.set()
            await asyncio.gather(*senders)
    before = sum(r.status_code == 200 for at, r in answers if at < changed)
    late = [r for at, r in answers if at >= changed + 1.0]
    admitted_late = sum(r.status_code == 200 for r in late)
    print(
        f"\n{fleet.kind}: {before} admitted under rpm 600; from a second after lowering it to "
        f"{lowered}: {admitted_late} of {len(late)}"
    )
    assert before > lowered, "the burst ran under the first limit"
    assert late and admitted_late <= lowered, fleet.logs()
    assert {r.status_code for r in late} <= {200, 429}
    stale = [
        round(at - changed, 2)
        for at, r in answers
        if at >= changed and r.headers["x-ratelimit-limit-requests"] != str(lowered)
    ]
    print(f"answers under the old limit after the change, seconds after it: {stale}")
    assert all(r.headers["x-ratelimit-limit-requests"] == str(lowered) for r in late), stale


async def test_a_redis_failover_falls_back_to_in_process_counters_and_recovers(
    fleet: Fleet, fake_openai: FakeOpenAI
) -> None:
    async with httpx.AsyncClient(base_url=fleet.controlplane.url, timeout=10) as admin:
        tenant = await priced_tenant(admin, fake_openai)
        key_id, key = await new_key(admin, tenant, limits={"rpm": 1000})
    await assert_shared(fleet)
    server = _server_of(fleet, f"rl:vk:{key_id}:rpm")
    server.stop()
    try:
        async with httpx.AsyncClient(timeout=10) as http:

            async def served_locally() -> bool:
                answers = [await post(http, proxy, key) for proxy in fleet.proxies]
                assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
                modes = [await limits_mode(proxy) for proxy in fleet.proxies]
                return all(m == "in-process (redis unreachable)" for m in modes)

            await _until_async(served_locally, "requests served on in-process counters")
    finally:
        server.start()
    if fleet.kind == "cluster":
        await asyncio.to_thread(_cluster_ok, fleet)

    async with httpx.AsyncClient(timeout=10) as http:

        async def shared_again() -> bool:
            answers = [await post(http, proxy, key) for proxy in fleet.proxies]
            assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
            return all([await limits_mode(proxy) == "redis" for proxy in fleet.proxies])

        await _until_async(shared_again, "limits shared through Redis again")
    # The restarted server (its counts start at zero) is running the proxies' scripts again.
    restarted = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        assert restarted.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0) > 0
    finally:
        restarted.close()


def _server_of(fleet: Fleet, bucket: str) -> RedisServer:
    """The server holding a bucket: the cluster master serving its slot."""
    if fleet.kind != "cluster":
        return fleet.servers[0]
    slot = key_slot(bucket.encode())
    client = fleet.client()
    try:
        assert isinstance(client, redis.RedisCluster)
        port = client.get_node_from_key(tokens_key_of(bucket)).port
    finally:
        client.close()
    found = [s for s in fleet.servers if s.port == int(port)]
    assert found, (slot, port)
    return found[0]


def tokens_key_of(bucket: str) -> str:
    return f"{PREFIX}tl:{{{bucket}}}"


def _counted(check: object) -> object:
    """A synchronous check as `_until_async` takes it."""
    assert callable(check)

    async def checked() -> bool:
        return bool(check())

    return checked


def _cluster_ok(fleet: Fleet) -> None:
    from tests.support.redis_servers import RedisCluster

    RedisCluster(fleet.servers).wait_until_ok()


async def _until_async(check: object, what: str) -> None:
    assert callable(check)
    deadline = time.monotonic() + WAIT_S
    while not await check():
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        await asyncio.sleep(POLL_S)  # waiting on other processes, bounded above

"""Rate limits and budgets held by three `vkgate proxy` processes that share one Redis.

The acceptance test of shared counters: a burst spread round-robin over three replicas is held
to one key's budget and one key's rate limit, as a single proxy would hold it. Real processes
cannot share the test's clock, so the rate test waits, briefly and always within a bound, for
the bucket to refill; it asserts on the counts, never on how long anything took.

Prices come from a provider override so every answer's cost is known: the fake provider (served
in the test's own event loop, reached by the proxies over loopback) answers a plain chat with
11 prompt and 7 completion tokens.
"""

from __future__ import annotations

import asyncio
import math
import re
import secrets
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio

from tests.proxy.conftest import CHAT_ALIAS, UPSTREAM_CHAT_MODEL
from tests.proxy.test_processes import proxy_env
from tests.support.api import ADMIN
from tests.support.fake_openai import FakeOpenAI
from tests.support.processes import (
    EXIT_TIMEOUT_S,
    Service,
    free_port,
    sqlite_controlplane,
    start,
    wait_until_healthy,
)

REDIS_URL = "redis://127.0.0.1:6379/0"
PREFIX = "vkgate:"
"""The proxies' default key prefix in Redis (`RedisLeaseStore`)."""
REPLICAS = 3

# 0.1 USD a token: a plain answer (11 + 7 tokens) costs 1.8 USD.
PRICE = {"input_per_mtok": "100000", "output_per_mtok": "100000"}
COST_USD = Decimal("1.8")
MAX_TOKENS = 7
"""What the fake answers anyway: the worst case reserved is close to the actual cost."""
CHAT = {
    "model": CHAT_ALIAS,
    "messages": [{"role": "user", "content": "hello"}],
    "max_tokens": MAX_TOKENS,
}

BUDGET_ANSWERS = 20
LIMIT_USD = COST_USD * BUDGET_ANSWERS
BUDGET_BURST = 300
WORST_CASE = re.compile(r"may cost up to ([0-9.]+) USD")
RPM = 60
RATE_BURST = 200
CONCURRENCY = 64
"""Requests in flight at once, over all replicas."""

LEDGER_WAIT_S = 20.0
LEASE_RETURN_S = 10.0
"""Idle slices go back within a lease's time to live (2 s by default) and a tick: a bound."""
LEDGER_POLL_S = 0.2
TRICKLE_EVERY_S = 0.25
TRICKLE_REQUESTS = 16
"""After the burst, one request every 0.25 s for about 4 s: the refill rate is one a second."""


@dataclass
class Deployment:
    controlplane: Service
    proxies: list[Service]

    def logs(self) -> str:
        return "\n".join(f"--- {p.log.name}\n{p.output()[-4000:]}" for p in self.proxies)


def redis_unreachable() -> str | None:
    """Why the test cannot run against Redis, or None when it can."""
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1, socket_timeout=1)
    try:
        client.ping()
    except redis.exceptions.RedisError as exc:
        return f"no Redis at {REDIS_URL} ({exc}): shared counters cannot be tested"
    finally:
        client.close()
    return None


def stop_together(services: list[Service]) -> None:
    """Stop these processes (ours, by PID) side by side: SIGTERM to each, then wait for each,
    killing one that does not exit in time."""
    for service in services:
        if service.process.poll() is None:
            service.process.terminate()
    for service in services:
        try:
            service.process.wait(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            service.process.kill()
            service.process.wait(timeout=EXIT_TIMEOUT_S)


@contextmanager
def proxy_replicas(controlplane: Service, workdir: Path) -> Iterator[list[Service]]:
    """`REPLICAS` proxy processes sharing Redis, each with its own spool; started together."""
    proxies: list[Service] = []
    try:
        for n in range(1, REPLICAS + 1):
            port = free_port()
            env = proxy_env(
                controlplane.url,
                port,
                VKGATE_REDIS_URL=REDIS_URL,
                VKGATE_SPOOL_DIR=str(workdir / f"spool-{n}"),
                VKGATE_REPLICA_ID=f"replica-{n}",
            )
            log = workdir / f"proxy-{n}.log"
            proxies.append(start(["proxy"], env=env, port=port, log=log, cwd=workdir))
        for proxy in proxies:
            wait_until_healthy(proxy)
        yield proxies
    finally:
        stop_together(proxies)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """One control plane process (SQLite, embedded ledger) and three proxies sharing Redis."""
    reason = redis_unreachable()
    if reason is not None:
        pytest.skip(reason)
    workdir = tmp_path_factory.mktemp("limits-replicas")
    with (
        sqlite_controlplane(workdir) as controlplane,
        proxy_replicas(controlplane, workdir) as proxies,
    ):
        yield Deployment(controlplane, proxies)


@pytest.fixture
async def shared_counters() -> AsyncIterator[tuple[redis.asyncio.Redis, list[str]]]:
    """The Redis the proxies share, and a list of ids (budget, key) whose keys are deleted
    afterwards: nothing else in Redis is touched."""
    client = redis.asyncio.Redis.from_url(REDIS_URL, decode_responses=True)
    ids: list[str] = []
    try:
        yield client, ids
    finally:
        for owner in ids:
            async for name in client.scan_iter(match=f"{PREFIX}*{owner}*", count=1000):
                await client.delete(name)
        await client.aclose()


@dataclass
class Tenant:
    org: str
    project: str
    policy: str


async def created(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = await http.post(path, json=body, headers=ADMIN)
    assert response.status_code == 201, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def priced_tenant(http: httpx.AsyncClient, fake: FakeOpenAI) -> Tenant:
    """An organization whose `chat` alias routes to the fake provider at a known price."""
    name = f"replicas-{secrets.token_hex(4)}"
    org = (await created(http, "/api/admin/organizations", {"name": name}))["id"]
    body = {"organization_id": org, "name": "p"}
    project = (await created(http, "/api/admin/projects", body))["id"]
    provider = (
        await created(
            http,
            "/api/admin/providers",
            {
                "organization_id": org,
                "name": "priced",
                "kind": "openai_compatible",
                "base_url": fake.url,
                "api_key": fake.api_key,
                "price_overrides": {UPSTREAM_CHAT_MODEL: PRICE},
            },
        )
    )["id"]
    policy = (
        await created(
            http,
            "/api/admin/routing-policies",
            {
                "organization_id": org,
                "name": "default",
                "aliases": {CHAT_ALIAS: [{"provider_id": provider, "model": UPSTREAM_CHAT_MODEL}]},
            },
        )
    )["id"]
    return Tenant(org, project, policy)


async def new_key(http: httpx.AsyncClient, tenant: Tenant, **fields: Any) -> tuple[str, str]:
    """A key of the tenant's project: (id, key)."""
    body = {
        "project_id": tenant.project,
        "name": f"key-{secrets.token_hex(4)}",
        "routing_policy_id": tenant.policy,
        **fields,
    }
    key = await created(http, "/api/admin/virtual-keys", body)
    return key["id"], key["key"]


async def post(http: httpx.AsyncClient, proxy: Service, key: str) -> httpx.Response:
    return await http.post(
        f"{proxy.url}/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"}
    )


@dataclass
class Burst:
    answers: list[httpx.Response]
    """In the order sent: answer i came from proxy i mod REPLICAS."""
    started: float
    ended: float

    def served_by_replica(self) -> list[int]:
        served = Counter(i % REPLICAS for i, a in enumerate(self.answers) if a.status_code == 200)
        return [served[n] for n in range(REPLICAS)]


async def burst(proxies: list[Service], key: str, requests: int) -> Burst:
    """`requests` requests spread round-robin over `proxies`, `CONCURRENCY` at a time."""
    gate = asyncio.Semaphore(CONCURRENCY)
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(timeout=30, limits=limits) as http:

        async def one(i: int) -> httpx.Response:
            async with gate:
                return await post(http, proxies[i % len(proxies)], key)

        started = time.monotonic()
        answers = await asyncio.gather(*(one(i) for i in range(requests)))
        ended = time.monotonic()
    return Burst(list(answers), started, ended)


async def assert_counters_in_redis(deployment: Deployment) -> None:
    """Every replica counts in Redis, not in its own memory (the fallback while Redis is
    unreachable, under which replicas share nothing)."""
    async with httpx.AsyncClient(timeout=5) as http:
        for proxy in deployment.proxies:
            ready = await http.get(f"{proxy.url}/readyz")
            assert ready.json()["limits"] == "redis", f"{proxy.log.name}: {ready.text}"


async def settled_report(http: httpx.AsyncClient, org: str, requests: int) -> dict[str, Any]:
    """The spend report's totals once the ledger holds an outcome for `requests` requests."""
    deadline = time.monotonic() + LEDGER_WAIT_S
    while True:
        response = await http.get(
            "/api/spend/report", params={"organization_id": org}, headers=ADMIN
        )
        assert response.status_code == 200, response.text
        totals: dict[str, Any] = response.json()["totals"]
        recorded = totals["requests"] + totals["refused"] + totals["failed"]
        if recorded >= requests:
            return totals
        assert time.monotonic() < deadline, (
            f"the ledger holds {recorded} of {requests} requests after {LEDGER_WAIT_S} s: {totals}"
        )
        await asyncio.sleep(LEDGER_POLL_S)  # waiting on the proxies' drainers, bounded above


async def test_replicas_sharing_redis_hold_a_burst_to_one_budget(
    deployment: Deployment,
    fake_openai: FakeOpenAI,
    shared_counters: tuple[redis.asyncio.Redis, list[str]],
) -> None:
    counters, created_ids = shared_counters
    async with httpx.AsyncClient(base_url=deployment.controlplane.url, timeout=10) as admin:
        tenant = await priced_tenant(admin, fake_openai)
        key_id, key = await new_key(admin, tenant)
        budget_id = (
            await created(
                admin,
                "/api/admin/budgets",
                {
                    "organization_id": tenant.org,
                    "scope": {"kind": "virtual_key", "id": key_id},
                    "window": "day",
                    "on_breach": "block",
                    "limit_usd": str(LIMIT_USD),
                },
            )
        )["id"]
        created_ids += [budget_id, key_id]
        await assert_counters_in_redis(deployment)

        sent = await burst(deployment.proxies, key, BUDGET_BURST)

        statuses = Counter(a.status_code for a in sent.answers)
        served, refused = statuses[200], statuses[402]
        print(
            f"\nbudget {LIMIT_USD} USD ({BUDGET_ANSWERS} answers): {BUDGET_BURST} requests in "
            f"{sent.ended - sent.started:.2f} s, served {served} "
            f"(per replica {sent.served_by_replica()}), refused {refused}"
        )
        assert set(statuses) <= {200, 402}, (statuses, deployment.logs())
        for answer in sent.answers:
            if answer.status_code != 402:
                continue
            error = answer.json()["error"]
            assert error["code"] == "budget_exceeded", answer.text
            assert error["budget_id"] == budget_id, answer.text
            assert error["budget_scope"] == "virtual_key", answer.text
            assert error["budget_window"] == "day", answer.text
            assert Decimal(error["limit_usd"]) == LIMIT_USD, answer.text
            assert 0 <= Decimal(error["remaining_usd"]) <= LIMIT_USD, answer.text
        await assert_counters_in_redis(deployment)

        totals = await settled_report(admin, tenant.org, BUDGET_BURST)
    spent = Decimal(totals["cost_usd"])
    print(f"ledger: {totals['requests']} served, {totals['refused']} refused, {spent} USD")
    assert (totals["requests"], totals["refused"], totals["failed"]) == (served, refused, 0)
    assert spent == served * COST_USD
    assert spent <= LIMIT_USD + COST_USD
    # How many a burst gets through depends on how many reservations were open when each came
    # (refusing under contention is the point); one at a time, the budget serves until what is
    # left cannot cover a request's worst case, and no sooner.
    async with httpx.AsyncClient(timeout=10) as http:
        for turn in range(BUDGET_ANSWERS + 1):
            answer = await post(http, deployment.proxies[turn % len(deployment.proxies)], key)
            if answer.status_code == 402:
                break
            assert answer.status_code == 200, answer.text
        assert answer.status_code == 402, "the budget never ran out"
    error = answer.json()["error"]
    worst = WORST_CASE.search(error["message"])
    assert worst is not None, error
    assert Decimal(error["remaining_usd"]) < Decimal(worst.group(1)), error

    # Every reservation was settled, and the replicas gave back their idle slices: nothing is
    # left open in any replica's name. The bucket is the hash `bg:{<bucket key>}`; the sorted
    # sets beside it index its entries.
    deadline = time.monotonic() + LEASE_RETURN_S
    while True:
        buckets = [
            name
            async for name in counters.scan_iter(
                match=f"{PREFIX}bg:{{bg:{budget_id}:*", count=1000, _type="hash"
            )
        ]
        assert buckets, "the budget was never counted in Redis"
        opened = {}
        for name in buckets:
            fields = await counters.hgetall(name)
            if int(fields.get("open", 0)) or [f for f in map(str, fields) if f.startswith("o:")]:
                opened[name] = fields
        if not opened:
            break
        assert time.monotonic() < deadline, opened
        await asyncio.sleep(LEDGER_POLL_S)  # waiting on the proxies' ticks, bounded above


async def test_replicas_sharing_redis_admit_one_rate_limit_then_its_refill_rate(
    deployment: Deployment,
    fake_openai: FakeOpenAI,
    shared_counters: tuple[redis.asyncio.Redis, list[str]],
) -> None:
    _, created_ids = shared_counters
    async with httpx.AsyncClient(base_url=deployment.controlplane.url, timeout=10) as admin:
        tenant = await priced_tenant(admin, fake_openai)
        key_id, key = await new_key(admin, tenant, limits={"rpm": RPM})
    created_ids.append(key_id)
    await assert_counters_in_redis(deployment)

    sent = await burst(deployment.proxies, key, RATE_BURST)

    statuses = Counter(a.status_code for a in sent.answers)
    admitted = statuses[200]
    took = sent.ended - sent.started
    print(
        f"\nrpm {RPM}: {RATE_BURST} requests in {took:.2f} s, admitted {admitted} "
        f"(per replica {sent.served_by_replica()}), refused {statuses[429]}"
    )
    assert set(statuses) <= {200, 429}, (statuses, deployment.logs())
    for answer in sent.answers:
        assert answer.headers["x-ratelimit-limit-requests"] == str(RPM), answer.headers
        if answer.status_code == 429:
            assert answer.json()["error"]["code"] == "rate_limited", answer.text
            assert int(answer.headers["retry-after"]) >= 1, answer.headers
    # The bucket holds the limit and refills one a second while the burst runs.
    assert RPM <= admitted <= RPM + math.floor(took)
    await assert_counters_in_redis(deployment)

    # Afterwards, one more a second, whichever replica is asked.
    admitted_after = 0
    async with httpx.AsyncClient(timeout=10) as http:
        for n in range(1, TRICKLE_REQUESTS + 1):
            # Sleeping is the point here: the bucket refills on the processes' own clocks.
            await asyncio.sleep(max(0.0, sent.ended + n * TRICKLE_EVERY_S - time.monotonic()))
            answer = await post(http, deployment.proxies[n % REPLICAS], key)
            assert answer.status_code in (200, 429), answer.text
            admitted_after += answer.status_code == 200
        elapsed = time.monotonic() - sent.ended
    print(f"then {admitted_after} admitted of {TRICKLE_REQUESTS} over {elapsed:.2f} s")
    assert math.floor(elapsed) - 1 <= admitted_after <= math.floor(elapsed) + 1

"""vkgate scaled out on one machine: two control planes behind a load balancer, three proxies.

Real `python -m vkgate` processes on loopback, as a cluster runs them: both control planes on
one PostgreSQL database, the proxies sharing one Redis and each with its own spend spool, and
every proxy reaching the control planes only through a load balancer (`tests/support/balancer`)
that sends each request to the next control plane in turn. The embedded ledger (chDB) can be
opened by one process only, so the balancer's path rule sends spend ingestion and the finance
API to control plane A, as an Ingress rule would send them to the replica that owns a
single-writer store. Control plane B serves everything else half of the time, and its admin API
is called directly here, as an operator's CLI might reach any replica.

The fake OpenAI provider runs in the test's event loop; the proxies reach it over loopback.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from controlplane.migrate import upgrade
from proxy.providers.mock import REPLY as MOCK_REPLY
from tests.proxy.conftest import CHAT_ALIAS
from tests.proxy.test_limits_replicas import (
    REDIS_URL,
    priced_tenant,
    redis_unreachable,
    settled_report,
    stop_together,
)
from tests.proxy.test_limits_replicas import new_key as new_priced_key

# A fixture (Redis keys of the ids it is given are deleted afterwards), used here by name.
from tests.proxy.test_limits_replicas import shared_counters as shared_counters
from tests.proxy.test_processes import (
    Key,
    assert_completes,
    make_tenant,
    new_key,
    proxy_env,
)
from tests.support.api import ADMIN
from tests.support.balancer import Balancer, balancing
from tests.support.databases import postgres_database
from tests.support.env import secrets_env
from tests.support.fake_openai import FakeOpenAI, serve_fake_openai
from tests.support.processes import (
    READY_TIMEOUT_S,
    Service,
    clean_env,
    free_port,
    start,
    stop,
    wait_until_healthy,
)
from vkgate.spend import BUDGET_BUCKET_SPEND_PATH, SPEND_COMMANDS_PATH
from vkgate.wire import INTERNAL_PREFIX

CONTROL_PLANES = ("a", "b")
LEDGER_OWNER = 0
"""Control plane A opens the ledger that counts; B's embedded ledger is never written."""
LEDGER_ROUTES = (
    INTERNAL_PREFIX + SPEND_COMMANDS_PATH,
    INTERNAL_PREFIX + BUDGET_BUCKET_SPEND_PATH,
    "/api/spend/",
)
"""Every route that reads or writes the ledger, save a key's config (it also reads budgets'
spend there, but this file sets no budget)."""
PROXIES = 3
RESHIPPER = PROXIES - 1
"""The proxy that is stopped and started again on its spool. It seals only when it stops, so
that everything it wrote is in one open segment the test can copy."""
FAST_FLUSH_S = "0.2"
SEAL_ON_STOP_S = "3600"
"""Longer than the test: the re-shipping proxy seals when it stops, not before."""
START_TIMEOUT_S = 2 * READY_TIMEOUT_S
"""Five processes starting at once share the machine's cores."""
PROPAGATION_BOUND_S = 1.0
"""The product requirement: an admin change is in force on every proxy within this long."""
REFUSAL_POLL_S = 0.01
LOOKUPS_QUIET_S = 1.5
"""No key lookups for this long: the proxies are done with the events of a tenant just made
(the feed brings an event to every proxy within a second, `bench/feed_wake.py`)."""
SPOOL_WAIT_S = 20.0
HELLO: Any = [{"role": "user", "content": "hello"}]
PRICE_PER_TOKEN_USD = Decimal("0.1")
"""What `priced_tenant`'s price override makes one token, input or output, cost."""


@dataclass
class Replica:
    """A proxy process, and what it takes to start it again as it was."""

    service: Service
    env: dict[str, str]
    port: int
    spool: Path
    workdir: Path

    @property
    def url(self) -> str:
        return self.service.url

    def replica_dir(self) -> Path:
        return self.spool / self.env["VKGATE_REPLICA_ID"]

    def restart(self) -> None:
        """Start the proxy again with the same settings, port and spool (after it stopped)."""
        assert self.service.process.poll() is not None, "still running"
        log = self.workdir / f"{self.service.log.stem}-again.log"
        self.service = start(["proxy"], env=self.env, port=self.port, log=log, cwd=self.workdir)


@dataclass
class Cluster:
    controlplanes: list[Service]
    balancer: Balancer
    proxies: list[Replica] = field(default_factory=list)


def start_controlplane(database_url: str, name: str, workdir: Path) -> Service:
    home = workdir / f"controlplane-{name}"
    home.mkdir()
    port = free_port()
    env = clean_env(
        **secrets_env(database_url),
        # Each its own home, so each its own embedded ledger directory.
        VKGATE_HOME=str(home),
        VKGATE_CONTROLPLANE_ADDR=f"127.0.0.1:{port}",
    )
    # --migrate for the ledger; the shared database is already at the newest schema.
    return start(
        ["controlplane", "--migrate"], env=env, port=port, log=home / "controlplane.log", cwd=home
    )


def start_proxy(balancer: Balancer, n: int, workdir: Path) -> Replica:
    port = free_port()
    spool = workdir / f"spool-{n}"
    env = proxy_env(
        balancer.url,
        port,
        VKGATE_REDIS_URL=REDIS_URL,
        VKGATE_SPOOL_DIR=str(spool),
        VKGATE_REPLICA_ID=f"topology-{n}",
        VKGATE_SPEND_FLUSH_INTERVAL_SECONDS=SEAL_ON_STOP_S if n == RESHIPPER else FAST_FLUSH_S,
    )
    log = workdir / f"proxy-{n}.log"
    return Replica(
        start(["proxy"], env=env, port=port, log=log, cwd=workdir), env, port, spool, workdir
    )


def stop_replicas(replicas: list[Replica]) -> None:
    stop_together([r.service for r in replicas])


def wait_until_following(replica: Replica) -> None:
    """Until the proxy follows the change feed and counts limits in Redis.

    A proxy drops its cached keys when its feed poller first connects; keys warmed before that
    would be looked up cold again, and a revocation test would prove nothing.
    """
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        ready = httpx.get(f"{replica.url}/readyz", timeout=5)
        body = ready.json()
        if ready.status_code == 200 and body["controlplane"] is True and body["limits"] == "redis":
            return
        assert time.monotonic() < deadline, f"{replica.service.log.name}: {ready.text}"
        time.sleep(0.05)  # waiting on another process's poller, bounded above


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Everything started at once: the proxies wait (unready) until the control planes answer."""
    reason = redis_unreachable()
    if reason is not None:
        pytest.skip(reason)
    workdir = tmp_path_factory.mktemp("topology")
    with postgres_database() as url, ExitStack() as stack:
        # Once, here: replicas that all migrate on start would race on the same tables.
        upgrade(url)
        controlplanes = [start_controlplane(url, name, workdir) for name in CONTROL_PLANES]
        # Registered first, so run last: the control planes outlive the proxies' final shipments.
        stack.callback(stop_together, controlplanes)
        balancer = stack.enter_context(
            balancing([c.url for c in controlplanes], pinned=LEDGER_ROUTES, owner=LEDGER_OWNER)
        )
        deployed = Cluster(controlplanes, balancer)
        stack.callback(lambda: stop_replicas(deployed.proxies))
        deployed.proxies.extend(start_proxy(balancer, n, workdir) for n in range(PROXIES))
        for service in [*controlplanes, *(p.service for p in deployed.proxies)]:
            wait_until_healthy(service, timeout=START_TIMEOUT_S)
        for replica in deployed.proxies:
            wait_until_following(replica)
        yield deployed


@pytest.fixture
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    async with serve_fake_openai() as fake:
        yield fake


def openai_client(replica: Replica, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{replica.url}/v1", api_key=key, max_retries=0, timeout=10)


def key_lookups(balancer: Balancer, since: int = 0) -> int:
    """Calls the proxies made to resolve a key or fetch its config, from the `since`th call."""
    internal = [f.path for f in balancer.forwarded[since:] if f.path.startswith(INTERNAL_PREFIX)]
    return sum(1 for p in internal if p.endswith("/resolve-key") or "/config/" in p)


async def settled_lookups(balancer: Balancer) -> int:
    """`key_lookups` once no more come for a while.

    The events of a tenant just made reach each proxy within about a second, through either
    control plane, and each one refreshes the keys of its organization a proxy has cached (a
    key cached while one was on its way is resolved again): lookups that are not the requests'.
    """
    deadline = time.monotonic() + START_TIMEOUT_S
    count = key_lookups(balancer)
    while True:
        await asyncio.sleep(LOOKUPS_QUIET_S)  # waiting on other processes, bounded above
        again = key_lookups(balancer)
        if again == count:
            return count
        assert time.monotonic() < deadline, f"the proxies kept looking keys up: {again}"
        count = again


def test_key_created_on_one_control_plane_works_on_every_proxy(cluster: Cluster) -> None:
    b = cluster.controlplanes[1]
    before = len(cluster.balancer.forwarded)
    key = new_key(b, make_tenant(b))

    for replica in cluster.proxies:
        assert_completes(replica.service, key.key)

    # Each proxy looked the new key up through the balancer, not only B's own cache.
    assert key_lookups(cluster.balancer, before) >= len(cluster.proxies)


@dataclass(frozen=True)
class Refusal:
    sent_after: float
    """Seconds from the revoke's answer to sending the first request that was refused."""
    answered_after: float
    """… and to that refusal's arrival."""
    served_after_revoke: int
    """Requests still served after the revoke had answered."""


async def first_refusal(client: openai.AsyncOpenAI, since: float, deadline: float) -> Refusal:
    """Ask with the key until it is refused.

    Fails when no request sent before `deadline` was refused: the last one sent in time was
    still served.
    """
    served = 0
    while (sent := time.monotonic()) < deadline:
        try:
            await client.chat.completions.create(model=CHAT_ALIAS, messages=HELLO)
        except openai.PermissionDeniedError as exc:
            assert exc.code == "virtual_key_revoked", exc.body
            return Refusal(sent - since, time.monotonic() - since, served)
        served += 1
        await asyncio.sleep(REFUSAL_POLL_S)  # a short pause between asks, not a measurement
    raise AssertionError(f"{client.base_url} still served the key {deadline - since:.1f} s on")


async def test_key_revoked_through_another_control_plane_is_refused_everywhere_within_one_second(
    cluster: Cluster,
) -> None:
    a, b = cluster.controlplanes
    key: Key = new_key(b, make_tenant(b))
    clients = [openai_client(replica, key.key) for replica in cluster.proxies]
    try:
        for client in clients:
            reply = await client.chat.completions.create(model=CHAT_ALIAS, messages=HELLO)
            assert reply.choices[0].message.content == MOCK_REPLY
        # Warm: a second round reaches no control plane, so the revocation must be pushed.
        lookups = await settled_lookups(cluster.balancer)
        for client in clients:
            await client.chat.completions.create(model=CHAT_ALIAS, messages=HELLO)
        assert key_lookups(cluster.balancer) == lookups

        async with httpx.AsyncClient(timeout=10) as http:
            sent = time.monotonic()
            answer = await http.post(
                f"{a.url}/api/admin/virtual-keys/{key.id}/revoke", headers=ADMIN
            )
        returned = time.monotonic()
        assert answer.status_code == 200, answer.text

        refusals = await asyncio.gather(
            *(first_refusal(c, returned, returned + PROPAGATION_BOUND_S) for c in clients)
        )
    finally:
        for client in clients:
            await client.close()
    figures = ", ".join(
        f"proxy-{n}: asked at {r.sent_after * 1000:.0f} ms, refused at "
        f"{r.answered_after * 1000:.0f} ms ({r.served_after_revoke} served before)"
        for n, r in enumerate(refusals)
    )
    print(f"\nrevoke answered in {(returned - sent) * 1000:.0f} ms; then {figures}")


@dataclass(frozen=True)
class Call:
    proxy: int
    stream: bool
    include_usage: bool = False


CALLS = [
    Call(n % PROXIES, stream=(n // PROXIES) % 2 == 1, include_usage=n % 2 == 0) for n in range(12)
]
"""Four a proxy, half of them streams (with and without usage asked for)."""


async def chat(replica: Replica, key: str, call: Call) -> tuple[int, int] | None:
    """One completion through `replica`; its usage when the client sees it."""
    async with openai_client(replica, key) as client:
        if not call.stream:
            reply = await client.chat.completions.create(model=CHAT_ALIAS, messages=HELLO)
            assert reply.usage is not None
            return reply.usage.prompt_tokens, reply.usage.completion_tokens
        stream = await client.chat.completions.create(
            model=CHAT_ALIAS,
            messages=HELLO,
            stream=True,
            stream_options={"include_usage": call.include_usage},
        )
        text = ""
        async for chunk in stream:
            text += "".join(c.delta.content or "" for c in chunk.choices)
        assert text == "Hi there!"
        return None


def streamed_usages(fake: FakeOpenAI) -> list[tuple[int, int]]:
    """The usage of every stream the fake sent (the proxy asks for it even when the client
    did not)."""
    usages = []
    for event in fake.streamed:
        payload = event.removeprefix(b"data: ").strip()
        if payload.startswith(b"{") and b'"usage": {' in payload:
            usage = json.loads(payload)["usage"]
            usages.append((usage["prompt_tokens"], usage["completion_tokens"]))
    return usages


def open_segments(replica: Replica) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in replica.replica_dir().glob("*.open")}


def served_in(segments: dict[str, bytes], key_id: str) -> int:
    """Confirm records of `key_id` in spool segments (each line: JSON, a space, a CRC)."""
    records = (
        json.loads(line.rsplit(b" ", 1)[0])
        for data in segments.values()
        for line in data.splitlines()
    )
    return sum(1 for r in records if r["kind"] == "confirm" and r.get("virtual_key_id") == key_id)


def shipments(service: Service) -> list[dict[str, Any]]:
    """The `spool_shipped` events in a proxy's log (its complete lines: it may be writing)."""
    output = service.output()
    events = []
    for line in output[: output.rfind("\n") + 1].splitlines():
        if '"spool_shipped"' in line:
            events.append(json.loads(line))
    return events


async def ledger_rows(admin: httpx.AsyncClient, org: str) -> int:
    rows, cursor = 0, None
    while True:
        params = {"organization_id": org, **({"cursor": cursor} if cursor else {})}
        page = await admin.get("/api/spend/ledger", params=params, headers=ADMIN)
        assert page.status_code == 200, page.text
        rows += len(page.json()["data"])
        cursor = page.json()["next_cursor"]
        if not cursor:
            return rows


async def shipped_again(replica: Replica) -> list[dict[str, Any]]:
    """Once the proxy has shipped its spool (no sealed segment left, and the shipment logged:
    the log line comes just after the segment is deleted), its `spool_shipped` events."""
    deadline = time.monotonic() + SPOOL_WAIT_S
    while list(replica.replica_dir().glob("*.seg")) or not shipments(replica.service):
        assert replica.service.process.poll() is None, replica.service.output()
        assert time.monotonic() < deadline, replica.service.output()[-3000:]
        await asyncio.sleep(0.05)  # waiting on the proxy's drainer, bounded above
    return shipments(replica.service)


async def test_spend_from_every_proxy_lands_in_the_ledger_once(
    cluster: Cluster,
    fake_openai: FakeOpenAI,
    shared_counters: tuple[Any, list[str]],
) -> None:
    _, redis_owned = shared_counters
    reshipper = cluster.proxies[RESHIPPER]
    async with httpx.AsyncClient(base_url=cluster.balancer.url, timeout=10) as admin:
        tenant = await priced_tenant(admin, fake_openai)
        # A rate limit, so that the three proxies count this key in Redis together.
        key_id, key = await new_priced_key(admin, tenant, limits={"rpm": 1000})
        redis_owned.append(key_id)

        seen = await asyncio.gather(*(chat(cluster.proxies[c.proxy], key, c) for c in CALLS))
        usages = [u for u in seen if u is not None] + streamed_usages(fake_openai)
        assert len(usages) == len(CALLS)

        # Everything the re-shipping proxy wrote is in its open segment, on disk already.
        copied = open_segments(reshipper)
        assert served_in(copied, key_id) == sum(1 for c in CALLS if c.proxy == RESHIPPER)
        stop(reshipper.service.process)  # SIGTERM: it seals and ships before it exits
        # A graceful stop (uvicorn ends the process by the signal it handled), not a kill.
        assert reshipper.service.process.returncode in (0, -signal.SIGTERM)
        assert '"backlog_segments":0' in reshipper.service.output(), reshipper.service.output()

        totals = await settled_report(admin, tenant.org, len(CALLS))
        tokens = sum(i + o for i, o in usages)
        assert (totals["requests"], totals["refused"], totals["failed"]) == (len(CALLS), 0, 0)
        assert totals["input_tokens"] == sum(i for i, _ in usages)
        assert totals["output_tokens"] == sum(o for _, o in usages)
        assert Decimal(totals["cost_usd"]) == PRICE_PER_TOKEN_USD * tokens
        rows = await ledger_rows(admin, tenant.org)

        # As if it had died between the ledger's acknowledgement and deleting the segment.
        assert not list(reshipper.replica_dir().glob("*.seg")), "it left segments unshipped"
        for name, data in copied.items():
            (reshipper.replica_dir() / name).write_bytes(data)
        reshipper.restart()
        wait_until_healthy(reshipper.service, timeout=START_TIMEOUT_S)
        again = await shipped_again(reshipper)
        assert all(s["ingested"] == 0 and s["duplicates"] == s["records"] for s in again), again
        assert await settled_report(admin, tenant.org, len(CALLS)) == totals
        assert await ledger_rows(admin, tenant.org) == rows

    # Only the ledger's owner ever took spend.
    spend = [f for f in cluster.balancer.forwarded if f.path.startswith(LEDGER_ROUTES)]
    assert spend and {f.backend for f in spend} == {LEDGER_OWNER}

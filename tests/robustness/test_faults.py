"""Faults around a running deployment, each followed by a look at the ledger: PostgreSQL
restarting under the control plane, the control plane restarting under a proxy, Redis going
away and coming back under a proxy, and the spool's disk filling up.

Everything runs as real processes on loopback: the control plane and the proxies as `vkgate`
commands, PostgreSQL and Redis as servers of the test's own, so they can be stopped without
touching the machine's shared ones. What is checked afterwards is always the same promise: every
request a client had an answer for is in the ledger exactly once.
"""

from __future__ import annotations

import asyncio
import errno
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.exc import OperationalError

from controlplane.errors import transient
from tests.proxy.conftest import CHAT_ALIAS
from tests.proxy.test_counters_fallback import redis_server
from tests.proxy.test_processes import Tenant, admin_create, make_tenant, new_key, proxy_env
from tests.support.api import ADMIN
from tests.support.env import secrets_env
from tests.support.outcomes import LEDGER_WAIT_S, outcomes_in_ledger
from tests.support.postgres_server import postgres_server
from tests.support.processes import (
    POLL_INTERVAL_S,
    Service,
    clean_env,
    free_port,
    running,
    sqlite_controlplane,
    start,
    stop,
    wait_until_healthy,
)
from tests.support.upstreams import HELLO, openai_like_upstream, send, upstream_tenant

RECOVERY_WAIT_S = 20.0
"""Bound on waiting for a proxy to go back to a store that came back."""
MAX_UNTIL_REFUSED = 200
SHIP_EVERY = {"VKGATE_SPEND_FLUSH_INTERVAL_SECONDS": "0.2"}


def chat(proxy: Service, key: str, **body: Any) -> httpx.Response:
    """One chat request with a request id of its own (`x-request-id` of the answer)."""
    return httpx.post(
        f"{proxy.url}/v1/chat/completions",
        json={"model": CHAT_ALIAS, "messages": HELLO, **body},
        headers={"Authorization": f"Bearer {key}", "X-Request-ID": uuid.uuid4().hex},
        timeout=15,
    )


def served(proxy: Service, key: str, answered: list[str]) -> None:
    response = chat(proxy, key)
    assert response.status_code == 200, response.text
    answered.append(response.headers["x-request-id"])


def error_code(response: httpx.Response) -> str:
    code: str = response.json()["error"]["code"]
    return code


def sealed_and_shipped(spool: Path) -> None:
    """Wait until every record the spool holds has been shipped: no sealed segment is left, and
    each open one is empty."""
    deadline = time.monotonic() + LEDGER_WAIT_S
    while True:
        segments = [p for p in spool.rglob("*") if p.suffix in (".open", ".seg")]
        if segments and all(p.suffix == ".open" and p.stat().st_size == 0 for p in segments):
            return
        assert time.monotonic() < deadline, f"the spool still holds records: {segments}"
        time.sleep(POLL_INTERVAL_S)  # waiting on another process's drainer, bounded above


def readiness(proxy: Service) -> dict[str, Any]:
    """The proxy's `/readyz` answer: what it can serve from, ready or not."""
    ready: dict[str, Any] = httpx.get(f"{proxy.url}/readyz", timeout=5).json()
    return ready


@contextmanager
def proxy_at(controlplane: Service, workdir: Path, **extra: str) -> Iterator[Service]:
    port = free_port()
    env = proxy_env(controlplane.url, port, VKGATE_SPOOL_DIR=str(workdir / "spool"), **extra)
    with running(["proxy"], env=env, port=port, log=workdir / "proxy.log", cwd=workdir) as proxy:
        yield proxy


# -- PostgreSQL stops and starts again under the control plane ----------------------------------


def test_postgres_restarting_under_the_control_plane_loses_nothing(tmp_path: Path) -> None:
    with postgres_server() as postgres:
        port = free_port()
        env = clean_env(
            **secrets_env(postgres.url),
            VKGATE_HOME=str(tmp_path),
            VKGATE_CONTROLPLANE_ADDR=f"127.0.0.1:{port}",
        )
        with (
            running(
                ["controlplane", "--migrate"],
                env=env,
                port=port,
                log=tmp_path / "controlplane.log",
                cwd=tmp_path,
            ) as controlplane,
            proxy_at(controlplane, tmp_path, **SHIP_EVERY) as proxy,
        ):
            tenant = make_tenant(controlplane)
            cached, never_seen = new_key(controlplane, tenant), new_key(controlplane, tenant)
            answered: list[str] = []
            for _ in range(3):
                served(proxy, cached.key, answered)

            postgres.stop()
            for _ in range(3):
                served(proxy, cached.key, answered)  # a cached key needs no database
            down = httpx.get(
                f"{controlplane.url}/api/admin/organizations", headers=ADMIN, timeout=10
            )
            assert down.status_code == 503, down.text
            assert error_code(down) == "store_unavailable"
            assert down.headers["retry-after"] == "1"
            assert "database_unavailable" in controlplane.output()
            refused = chat(proxy, never_seen.key)
            assert refused.status_code == 503, refused.text
            assert error_code(refused) == "auth_upstream_unavailable"

            postgres.start()
            # The first calls after the restart work: no pooled connection of the dead server
            # is handed out.
            after = new_key(controlplane, tenant)
            served(proxy, after.key, answered)
            served(proxy, never_seen.key, answered)
            outcomes_in_ledger(controlplane, tenant.org, answered)


class _Sqlstate(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(f"sqlstate {sqlstate}")
        self.sqlstate = sqlstate


@pytest.mark.parametrize(
    ("orig", "answer"),
    [
        (sqlite3.OperationalError("database is locked"), 503),
        (sqlite3.OperationalError("no such table: organizations"), 500),
        (_Sqlstate("57P01"), 503),  # admin shutdown: the server restarts
        (_Sqlstate("08006"), 503),  # connection failure
        (_Sqlstate("42P01"), 500),  # undefined table: a retry will not help
        (ConnectionRefusedError("connection refused"), 503),
    ],
)
def test_only_a_database_failure_that_a_retry_may_cure_is_a_503(
    orig: Exception, answer: int
) -> None:
    error = OperationalError("SELECT 1", {}, orig)
    assert (503 if transient(error) else 500) == answer


# -- the control plane stops and starts again under a proxy ----------------------------------------


def test_a_control_plane_restart_keeps_cached_keys_served_and_loses_no_spend(
    tmp_path: Path,
) -> None:
    port = free_port()
    env = clean_env(
        **secrets_env(f"sqlite:///{tmp_path / 'controlplane.db'}"),
        VKGATE_HOME=str(tmp_path),
        VKGATE_CONTROLPLANE_ADDR=f"127.0.0.1:{port}",
    )

    def controlplane(log: str) -> Service:
        service = start(["controlplane", "--migrate"], env=env, port=port, log=tmp_path / log)
        wait_until_healthy(service)
        return service

    first = controlplane("first.log")
    try:
        with proxy_at(first, tmp_path, **SHIP_EVERY) as proxy:
            tenant = make_tenant(first)
            cached, unseen = new_key(first, tenant), new_key(first, tenant)
            answered: list[str] = []
            served(proxy, cached.key, answered)

            stop(first.process)
            for _ in range(3):  # nothing to ask: the key is cached, the spend waits on disk
                served(proxy, cached.key, answered)
            refused = chat(proxy, unseen.key)
            assert refused.status_code == 503, refused.text
            assert error_code(refused) == "auth_upstream_unavailable"

            second = controlplane("second.log")
            try:
                served(proxy, unseen.key, answered)
                outcomes_in_ledger(second, tenant.org, answered)
            finally:
                stop(second.process)
    finally:
        stop(first.process)


# -- Redis goes away and comes back under a proxy ------------------------------------------------


def limited_key(controlplane: Service, tenant: Tenant) -> str:
    """A key with rate limits and a concurrency cap, under a daily budget of its organization."""
    admin_create(
        controlplane,
        "/api/admin/budgets",
        {
            "organization_id": tenant.org,
            "scope": {"kind": "organization"},
            "window": "day",
            "limit_usd": "100",
            "on_breach": "block",
        },
    )
    created = admin_create(
        controlplane,
        "/api/admin/virtual-keys",
        {
            "project_id": tenant.project,
            "name": f"limited-{uuid.uuid4().hex[:8]}",
            "routing_policy_id": tenant.policy,
            "limits": {"rpm": 1000, "tpm": 1_000_000, "max_concurrency": 4},
        },
    )
    key: str = created["key"]
    return key


def test_redis_going_away_and_back_keeps_serving_and_loses_no_spend(tmp_path: Path) -> None:
    redis_port = free_port()
    with (
        sqlite_controlplane(tmp_path) as controlplane,
        proxy_at(
            controlplane,
            tmp_path,
            VKGATE_REDIS_URL=f"redis://127.0.0.1:{redis_port}/0",
            **SHIP_EVERY,
        ) as proxy,
    ):
        tenant = make_tenant(controlplane)
        key = limited_key(controlplane, tenant)
        answered: list[str] = []
        with redis_server(redis_port, tmp_path):
            for _ in range(3):
                served(proxy, key, answered)
            assert readiness(proxy)["limits"] == "redis"

        # Redis is gone: served from the slices the proxy leased, then, once a sync finds Redis
        # gone (a slice running out, or the next report, within a quarter second), in-process.
        for _ in range(3):
            served(proxy, key, answered)
        deadline = time.monotonic() + RECOVERY_WAIT_S
        while readiness(proxy)["limits"] != "in-process (redis unreachable)":
            assert time.monotonic() < deadline, "the proxy never noticed that Redis was gone"
            served(proxy, key, answered)
            time.sleep(POLL_INTERVAL_S)  # the next report is on the proxy's own clock

        with redis_server(redis_port, tmp_path):
            deadline = time.monotonic() + RECOVERY_WAIT_S
            while readiness(proxy)["limits"] != "redis":
                assert time.monotonic() < deadline, "the proxy never went back to Redis"
                served(proxy, key, answered)  # each request may be the one that retries
                time.sleep(POLL_INTERVAL_S * 4)  # the retry is on the proxy's own clock
            served(proxy, key, answered)
            assert readiness(proxy)["limits"] == "redis"
        outcomes_in_ledger(controlplane, tenant.org, answered)


# -- the spool's disk fills up --------------------------------------------------------------------


@contextmanager
def small_filesystem(mountpoint: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` at `mountpoint` (root only), unmounted afterwards."""
    mountpoint.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mountpoint)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {mounted.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True, check=False)


def fill(directory: Path) -> Path:
    """Write a file until the filesystem is full; return it."""
    filler = directory / "filler"
    with filler.open("wb", buffering=0) as sink:
        block = b"\0" * 4096
        while True:
            try:
                sink.write(block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                break
        with suppress(OSError):  # the last bytes: a block smaller than the page
            while sink.write(b"\0"):
                pass
    return filler


def test_a_full_disk_refuses_requests_unpaid_and_loses_no_record(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with openai_like_upstream() as upstream:
            with (
                sqlite_controlplane(tmp_path) as controlplane,
                small_filesystem(tmp_path / "disk", "1m") as disk,
            ):
                port = free_port()
                env = proxy_env(
                    controlplane.url, port, VKGATE_SPOOL_DIR=str(disk / "spool"), **SHIP_EVERY
                )
                with running(
                    ["proxy"], env=env, port=port, log=tmp_path / "proxy.log", cwd=tmp_path
                ) as proxy:
                    tenant, key = upstream_tenant(controlplane, upstream.url)
                    answered: list[str] = []
                    for _ in range(3):
                        await asyncio.to_thread(served, proxy, key, answered)

                    # A stream is under way when the disk fills up: its outcome cannot be
                    # written when it ends, and must not be lost.
                    held = uuid.uuid4().hex
                    in_flight = asyncio.create_task(send(proxy, key, "held", True, held))
                    await upstream.reached.wait()
                    # Once the segment with its admission is sealed, its outcome goes to a new,
                    # empty one: a write that needs a page the full disk does not have.
                    await asyncio.to_thread(sealed_and_shipped, disk / "spool")
                    filler = fill(disk)
                    upstream.release.set()
                    request_id, status, body = await in_flight
                    assert status == 200 and body.endswith(b"data: [DONE]\n\n"), body
                    answered.append(request_id)

                    refused = None
                    for _ in range(MAX_UNTIL_REFUSED):  # a part-used page may still take a line
                        paid = upstream.calls
                        response = await asyncio.to_thread(chat, proxy, key)
                        if response.status_code != 200:
                            refused = response
                            break
                        answered.append(response.headers["x-request-id"])
                    assert refused is not None, "the proxy never noticed the full disk"
                    assert refused.status_code == 503, refused.text
                    assert error_code(refused) == "spend_spool_full"
                    assert upstream.calls == paid, "a request with no record was not paid for"
                    assert readiness(proxy)["spend_spool"]["writable"] is False

                    filler.unlink()
                    deadline = time.monotonic() + RECOVERY_WAIT_S
                    while not readiness(proxy)["spend_spool"]["writable"]:
                        assert time.monotonic() < deadline, "the spool never wrote again"
                        await asyncio.sleep(POLL_INTERVAL_S * 4)  # the drainer's next pass
                    for _ in range(3):
                        await asyncio.to_thread(served, proxy, key, answered)
                    await asyncio.to_thread(outcomes_in_ledger, controlplane, tenant.org, answered)
                    log = (tmp_path / "proxy.log").read_text()
                    assert "spend record lost" not in log

    asyncio.run(scenario())

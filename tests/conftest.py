"""Fixtures: the control plane on SQLite and on PostgreSQL, a manual clock, signed calls."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from litestar import Litestar

from controlplane.app import create_app
from controlplane.db import Database, create_engine
from controlplane.migrate import upgrade
from controlplane.settings import ControlPlaneSettings, LedgerLocation
from tests.support import databases
from tests.support.api import create
from tests.support.clock import ManualClock
from tests.support.env import INTERNAL_SECRET, secrets_env
from tests.support.ledger import embedded_ledger, ledger_server
from vkgate import signing


@pytest.fixture(scope="session", params=databases.backends())
def database_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A migrated database per backend, shared by the tests of that backend."""
    if request.param == "postgres":
        manager = databases.postgres_database()
    else:
        manager = databases.sqlite_database(tmp_path_factory.mktemp("sqlite"))
    with manager as url:
        upgrade(url)
        yield url


@pytest.fixture(scope="session")
async def database(database_url: str) -> AsyncIterator[Database]:
    db = Database(create_engine(database_url))
    yield db
    await db.close()


@pytest.fixture
async def clean_database(database: Database) -> Database:
    await databases.empty_all_tables(database.engine)
    return database


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(scope="session")
def ledger_location(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LedgerLocation]:
    """The session's one embedded spend ledger (chDB allows one per process), migrated."""
    with embedded_ledger(tmp_path_factory.mktemp("ledger") / "chdb") as location:
        yield location


@pytest.fixture(scope="session")
def clickhouse_server() -> Iterator[LedgerLocation]:
    """A ClickHouse server for the ledger's HTTP path, started on first use (see ledger_server)."""
    with ledger_server() as location:
        yield location


@pytest.fixture
def settings(database_url: str, ledger_location: LedgerLocation) -> ControlPlaneSettings:
    return dataclasses.replace(
        ControlPlaneSettings.from_env(secrets_env(database_url)), ledger=ledger_location
    )


@pytest.fixture
def app(settings: ControlPlaneSettings, clock: ManualClock, clean_database: Database) -> Litestar:
    return create_app(settings, clock=clock, database=clean_database)


@asynccontextmanager
async def serve_in_loop(app: Litestar, base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client for `app`, run in the test's own event loop with its lifespan.

    (Litestar's AsyncTestClient runs the app on a thread of its own, where it could not share
    the test's database engine, and it blocks the test's loop while a request waits.)
    """
    started, stop = asyncio.Event(), asyncio.Event()

    async def lifespan() -> None:
        # Entered and left in this one task: the lifespan's cancel scopes require it, and a
        # fixture's setup and teardown may run in different tasks.
        async with app.lifespan():
            started.set()
            await stop.wait()

    runner = asyncio.create_task(lifespan())
    ready = asyncio.create_task(started.wait())
    await asyncio.wait({runner, ready}, return_when=asyncio.FIRST_COMPLETED)
    if runner.done():  # start-up failed: raise its error here instead of waiting forever
        ready.cancel()
        runner.result()
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url=base_url
        ) as http:
            yield http
    finally:
        stop.set()
        await runner


@pytest.fixture
async def client(app: Litestar) -> AsyncIterator[httpx.AsyncClient]:
    async with serve_in_loop(app, "http://controlplane.test") as http:
        yield http


@dataclass
class Internal:
    """Signs internal API calls the way a proxy does, at the manual clock's time."""

    client: httpx.AsyncClient
    clock: ManualClock
    secret: str = INTERNAL_SECRET

    async def call(
        self,
        method: str,
        path_and_query: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        raw = b"" if body is None else json.dumps(body).encode()
        signed = signing.signed_headers(self.secret, method, path_and_query, raw, self.clock.time())
        return await self.client.request(
            method,
            path_and_query,
            content=raw,
            headers={**signed, "content-type": "application/json", **(headers or {})},
        )

    async def revision(self) -> int:
        """The feed's current revision, from the health route."""
        response = await self.call("GET", "/api/internal/gateway/health")
        assert response.status_code == 200, response.text
        revision: int = response.json()["revision"]
        return revision

    async def events_since(self, since: int) -> list[tuple[str, str, str]]:
        """(kind, entity_kind, entity_id) of every event after `since`, without waiting."""
        response = await self.call(
            "GET", f"/api/internal/gateway/changes?since={since}&timeout_s=0"
        )
        if response.status_code == 204:
            return []
        assert response.status_code == 200, response.text
        return [(e["kind"], e["entity_kind"], e["entity_id"]) for e in response.json()["events"]]


@pytest.fixture
def internal(client: httpx.AsyncClient, clock: ManualClock) -> Internal:
    return Internal(client, clock)


@dataclass
class World:
    """An organization with a team, a project, an OpenAI provider, a policy and a key."""

    org: str
    team: str
    project: str
    provider: str
    policy: str
    key_id: str
    key: str


OPENAI_PROVIDER: dict[str, Any] = {
    "name": "openai-main",
    "kind": "openai",
    "api_key": "sk-test-provider-credential-7d1f",
}


@pytest.fixture
async def world(client: httpx.AsyncClient) -> World:
    return await seed_world(client)


async def seed_world(
    client: httpx.AsyncClient,
    provider_fields: dict[str, Any] = OPENAI_PROVIDER,
    model: str = "gpt-4o-mini",
    name: str = "acme",
) -> World:
    """A `World` through the admin API, its organization called `name`: its provider made of
    `provider_fields`, its policy's alias `fast` routed to that provider's `model`."""
    org = (await create(client, "/api/admin/organizations", {"name": name}))["id"]
    team = (await create(client, "/api/admin/teams", {"organization_id": org, "name": "ml"}))["id"]
    project = (
        await create(
            client, "/api/admin/projects", {"organization_id": org, "team_id": team, "name": "chat"}
        )
    )["id"]
    provider = (
        await create(client, "/api/admin/providers", {"organization_id": org, **provider_fields})
    )["id"]
    policy = (
        await create(
            client,
            "/api/admin/routing-policies",
            {
                "organization_id": org,
                "name": "default",
                "aliases": {"fast": [{"provider_id": provider, "model": model}]},
            },
        )
    )["id"]
    key = await create(
        client,
        "/api/admin/virtual-keys",
        {"project_id": project, "name": "app", "routing_policy_id": policy},
    )
    return World(org, team, project, provider, policy, key["id"], key["key"])


# -- long-polls of the change feed ----------------------------------------------------------


@pytest.fixture
def waking_app(
    settings: ControlPlaneSettings, clock: ManualClock, clean_database: Database
) -> Litestar:
    """A control plane whose waiting long-polls re-read the feed only hourly: only a wake-up
    answers them within a test."""
    hourly = dataclasses.replace(settings, feed_poll_interval_s=3600)
    return create_app(hourly, clock=clock, database=clean_database)


@pytest.fixture
def parked(waking_app: Litestar, monkeypatch: pytest.MonkeyPatch) -> asyncio.Queue[None]:
    """One item each time a long-poll of `waking_app` starts to wait for a wake-up."""
    notifier = waking_app.state["vk"].notifier
    queue: asyncio.Queue[None] = asyncio.Queue()
    wait = notifier.wait

    async def observed_wait(*args: Any, **kwargs: Any) -> bool:
        queue.put_nowait(None)
        woken: bool = await wait(*args, **kwargs)
        return woken

    monkeypatch.setattr(notifier, "wait", observed_wait)
    return queue


async def signed_get(
    client: httpx.AsyncClient, clock: ManualClock, path_and_query: str
) -> httpx.Response:
    headers = signing.signed_headers(INTERNAL_SECRET, "GET", path_and_query, b"", clock.time())
    return await client.get(path_and_query, headers=headers)

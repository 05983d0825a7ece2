"""Each secret rolled across two control planes and three proxies, one replica at a time, while
requests flow through every proxy: not one request fails.

The replicas run in this process on the test's database and clock: each control plane behind a
round-robin balancer (as a Kubernetes Service), each proxy on a loopback port of its own. A
replica is rolled as Kubernetes rolls a pod: the new one starts, takes the traffic, and the old
one drains and stops. A new proxy starts with an empty key cache, so every roll makes the
proxies resolve their keys through the control planes again, and the traffic also creates keys
and uses them at once, so the internal API, the pepper and the credentials are used throughout.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import dataclasses
import itertools
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field

import httpx
import msgspec
from litestar import Litestar

from controlplane.app import create_app
from controlplane.db import Database
from controlplane.internal.resolve import verify_jwt
from controlplane.providers.reencrypt import reencrypt
from controlplane.security import Cipher
from controlplane.settings import ControlPlaneSettings
from proxy.settings import ProxySettings
from tests.conftest import serve_in_loop
from tests.proxy.conftest import (
    CHAT_ALIAS,
    RunningProxy,
    Tenant,
    add_key,
    make_tenant,
    proxy_settings,
    serve_proxy,
)
from tests.support.clock import ManualClock
from tests.support.env import ENCRYPTION_KEY, INTERNAL_SECRET, JWT_SECRET, KEY_PEPPER
from tests.support.fake_openai import FakeOpenAI
from vkgate.wire import ResolveKeyResponse

NEW_INTERNAL = "rolled-internal-secret-0123456789abcdef"
NEW_JWT = "rolled-jwt-secret-0123456789abcdef01234"
NEW_PEPPER = "rolled-key-pepper-0123456789abcdef0123"
NEW_KEY = bytes(range(64, 96))
MAX_REQUESTS = 3000
"""Bounds the traffic whatever happens: the rolls take far fewer requests than this."""
ROLL_TIMEOUT_S = 120.0
REQUESTS_BETWEEN_STEPS = 4
"""Requests every proxy answers between two steps of a roll, so each step is under traffic."""


class Balancer(httpx.AsyncBaseTransport):
    """The control planes' Service: each call to the next control plane in turn; records the
    JWTs that key resolutions hand out."""

    def __init__(self) -> None:
        self.backends: list[httpx.ASGITransport] = []
        self._turn = itertools.count()
        self.jwts: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        backend = self.backends[next(self._turn) % len(self.backends)]
        response = await backend.handle_async_request(request)
        if request.url.path.endswith("/resolve-key") and response.status_code == 200:
            body = await response.aread()
            self.jwts.append(msgspec.json.decode(body, type=ResolveKeyResponse).jwt)
            response = httpx.Response(response.status_code, headers=response.headers, content=body)
        return response


class Road(httpx.AsyncBaseTransport):
    """One proxy's road to the balancer: closing it (the proxy stopping) leaves the others'."""

    def __init__(self, balancer: Balancer) -> None:
        self._balancer = balancer

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._balancer.handle_async_request(request)

    async def aclose(self) -> None:
        pass


@dataclass
class Cluster:
    database: Database
    clock: ManualClock
    balancer: Balancer
    tenant: Tenant
    stack: AsyncExitStack
    controlplanes: list[tuple[Litestar, httpx.AsyncClient, AsyncExitStack]] = field(
        default_factory=list
    )
    proxies: list[tuple[RunningProxy, AsyncExitStack]] = field(default_factory=list)
    sending: collections.Counter[str] = field(default_factory=collections.Counter)
    """Requests on their way to each proxy's URL."""

    async def start_controlplane(self, settings: ControlPlaneSettings) -> None:
        replica = AsyncExitStack()
        app = create_app(settings, clock=self.clock, database=self.database)
        admin = await replica.enter_async_context(serve_in_loop(app, "http://controlplane.test"))
        self.controlplanes.append((app, admin, replica))
        self.balancer.backends.append(httpx.ASGITransport(app=app))

    async def roll_controlplane(self, index: int, settings: ControlPlaneSettings) -> None:
        _, _, old_replica = self.controlplanes[index]
        replica = AsyncExitStack()
        app = create_app(settings, clock=self.clock, database=self.database)
        admin = await replica.enter_async_context(serve_in_loop(app, "http://controlplane.test"))
        self.controlplanes[index] = (app, admin, replica)
        self.balancer.backends[index] = httpx.ASGITransport(app=app)
        await old_replica.aclose()

    async def start_proxy(self, settings: ProxySettings) -> None:
        replica = AsyncExitStack()
        running = await replica.enter_async_context(
            serve_proxy(None, self.clock, settings, control_transport=Road(self.balancer))
        )
        self.proxies.append((running, replica))

    async def roll_proxy(self, index: int, settings: ProxySettings) -> None:
        _, old_replica = self.proxies[index]
        replica = AsyncExitStack()
        running = await replica.enter_async_context(
            serve_proxy(None, self.clock, settings, control_transport=Road(self.balancer))
        )
        old, _ = self.proxies[index]
        self.proxies[index] = (running, replica)
        # As an endpoint leaves a Service before its pod is stopped (a preStop delay): nothing
        # is sent to the old proxy once no client is still on its way there.
        deadline = asyncio.get_running_loop().time() + ROLL_TIMEOUT_S
        while self.sending[old.url]:
            assert asyncio.get_running_loop().time() < deadline, "a request never came back"
            await asyncio.sleep(0.01)
        await old_replica.aclose()  # drains the requests it is answering, then stops

    def admin(self, turn: int) -> httpx.AsyncClient:
        return self.controlplanes[turn % len(self.controlplanes)][1]


@dataclass
class Traffic:
    """Requests through every proxy until stopped: known keys, and keys made on the way."""

    cluster: Cluster
    keys: list[str]
    answered: int = 0
    failures: list[str] = field(default_factory=list)
    stopped: bool = False
    _progress: asyncio.Event = field(default_factory=asyncio.Event)

    async def through(self, proxy_index: int) -> None:
        async with httpx.AsyncClient(timeout=10) as http:
            for turn in itertools.count():
                if self.stopped or self.answered >= MAX_REQUESTS:
                    return
                if turn % 10 == 9:
                    # A key made now, through either control plane with the admin token, and
                    # used at once: a resolution no cache can answer.
                    try:
                        _, key = await add_key(
                            self.cluster.admin(turn),
                            self.cluster.tenant,
                            name=f"k-{proxy_index}-{turn}",
                        )
                    except AssertionError as exc:
                        self.failures.append(f"creating a key: {exc}")
                        continue
                else:
                    key = self.keys[(turn + proxy_index) % len(self.keys)]
                # The proxy serving now: one being rolled stops taking connections once its
                # successor took its place (as an endpoint leaves a Service before its pod stops).
                running, _ = self.cluster.proxies[proxy_index]
                await self._ask(http, running, key)

    async def _ask(self, http: httpx.AsyncClient, running: RunningProxy, key: str) -> None:
        self.cluster.sending[running.url] += 1
        try:
            response = await http.post(
                f"{running.url}/chat/completions",
                # One connection per request: a kept-alive connection to a proxy that stops
                # would be a client's race with the server's close, not the rotation's.
                headers={"Authorization": f"Bearer {key}", "Connection": "close"},
                json={"model": CHAT_ALIAS, "messages": [{"role": "user", "content": "hi"}]},
            )
        except httpx.HTTPError as exc:
            self.failures.append(f"{type(exc).__name__}: {exc}")
        else:
            if response.status_code != 200:
                self.failures.append(f"{response.status_code}: {response.text[:300]}")
        finally:
            self.cluster.sending[running.url] -= 1
        self.answered += 1
        self._progress.set()

    async def flowing(self, requests: int = REQUESTS_BETWEEN_STEPS * 3) -> None:
        """Wait until `requests` more have been answered."""
        target = self.answered + requests
        while self.answered < target and self.answered < MAX_REQUESTS:
            self._progress.clear()
            await asyncio.wait_for(self._progress.wait(), timeout=ROLL_TIMEOUT_S)


def b64(key: bytes) -> str:
    return base64.urlsafe_b64encode(key).decode()


OLD_KEY = base64.urlsafe_b64decode(ENCRYPTION_KEY)


def accepting(settings: ControlPlaneSettings) -> ControlPlaneSettings:
    """The new pepper and encryption key accepted, not yet used: a control plane that already
    writes under them must not be followed by one that cannot read what it wrote."""
    return dataclasses.replace(
        settings, key_peppers_previous=(NEW_PEPPER,), encryption_keys_previous=(NEW_KEY,)
    )


def during(settings: ControlPlaneSettings) -> ControlPlaneSettings:
    """Every secret's new value current, the old one previous."""
    return dataclasses.replace(
        settings,
        internal_secret=NEW_INTERNAL,
        internal_secret_previous=INTERNAL_SECRET,
        jwt_secret=NEW_JWT,
        jwt_secret_previous=JWT_SECRET,
        key_pepper=NEW_PEPPER,
        key_peppers_previous=(KEY_PEPPER,),
        encryption_key=NEW_KEY,
        encryption_keys_previous=(OLD_KEY,),
    )


def after(settings: ControlPlaneSettings) -> ControlPlaneSettings:
    """The new values alone."""
    return dataclasses.replace(
        settings,
        internal_secret=NEW_INTERNAL,
        jwt_secret=NEW_JWT,
        key_pepper=NEW_PEPPER,
        encryption_key=NEW_KEY,
    )


def proxy_during() -> ProxySettings:
    return proxy_settings(internal_secret=NEW_INTERNAL, internal_secret_previous=INTERNAL_SECRET)


def proxy_after() -> ProxySettings:
    return proxy_settings(internal_secret=NEW_INTERNAL)


@asynccontextmanager
async def cluster_of(
    settings: ControlPlaneSettings,
    clock: ManualClock,
    database: Database,
    fake_openai: FakeOpenAI,
) -> AsyncIterator[Cluster]:
    async with AsyncExitStack() as stack:
        cluster = Cluster(database, clock, Balancer(), tenant=None, stack=stack)  # type: ignore[arg-type]
        for _ in range(2):
            await cluster.start_controlplane(settings)
        try:
            first = cluster.admin(0)
            cluster.tenant = await make_tenant(first, fake_openai.url, fake_openai.api_key)
            for _ in range(3):
                await cluster.start_proxy(proxy_settings())
            yield cluster
        finally:
            for _, replica in reversed(cluster.proxies):
                await replica.aclose()
            for _, _, replica in reversed(cluster.controlplanes):
                await replica.aclose()


WHOLE_ROLL_S = 300.0
"""The whole rotation takes 15-30 s; a step that never ends fails the test at its await point
instead of holding the suite."""


async def test_every_secret_rolled_replica_by_replica_under_traffic_fails_no_request(
    settings: ControlPlaneSettings,
    clock: ManualClock,
    clean_database: Database,
    fake_openai: FakeOpenAI,
) -> None:
    await asyncio.wait_for(
        _every_secret_rolled(settings, clock, clean_database, fake_openai), WHOLE_ROLL_S
    )


async def _every_secret_rolled(
    settings: ControlPlaneSettings,
    clock: ManualClock,
    clean_database: Database,
    fake_openai: FakeOpenAI,
) -> None:
    """The internal secret, the JWT secret, the key pepper and the encryption key, rolled
    together as README "Rotating secrets" says: the new pepper and key accepted by every
    control plane first, then every secret's new value made current, the old ones moved out,
    and last the old values taken away."""
    async with cluster_of(settings, clock, clean_database, fake_openai) as cluster:
        # Keys and the admin token the traffic uses, all made under the old secrets.
        keys = [(await add_key(cluster.admin(i), cluster.tenant))[1] for i in range(6)]
        traffic = Traffic(cluster, keys)
        runners = [asyncio.create_task(traffic.through(i)) for i in range(3)]
        try:
            await traffic.flowing()
            for index in (0, 1):
                await cluster.roll_controlplane(index, accepting(settings))
                await traffic.flowing()
            # A control plane first, then a proxy before the other control plane: replicas
            # may roll in either order.
            await cluster.roll_controlplane(0, during(settings))
            await traffic.flowing()
            await cluster.roll_proxy(0, proxy_during())
            await traffic.flowing()
            await cluster.roll_controlplane(1, during(settings))
            await traffic.flowing()
            for index in (1, 2):
                await cluster.roll_proxy(index, proxy_during())
                await traffic.flowing()
            # Every credential moved to the new key while requests use them.
            moved = await reencrypt(clean_database, Cipher(NEW_KEY, previous=[OLD_KEY]))
            assert (moved.moved, moved.unreadable) == (1, [])
            # Every key in use was presented since (each proxy restarted with an empty cache),
            # and so moved to the new pepper.
            await traffic.flowing(len(keys) * 3)
            # The old values taken away, replica by replica, a proxy first.
            await cluster.roll_proxy(0, proxy_after())
            await traffic.flowing()
            for index in (0, 1):
                await cluster.roll_controlplane(index, after(settings))
                await traffic.flowing()
            for index in (1, 2):
                await cluster.roll_proxy(index, proxy_after())
                await traffic.flowing()
        finally:
            traffic.stopped = True
            await asyncio.gather(*runners)
        assert not traffic.failures, traffic.failures[:5]
        assert traffic.answered >= REQUESTS_BETWEEN_STEPS * 3 * 10
        # Every JWT handed out verifies with the secrets in force at the end of the rotation,
        # and the last ones with the new secret alone.
        now = clock.now()
        assert cluster.balancer.jwts
        for token in cluster.balancer.jwts:
            assert verify_jwt(token, (NEW_JWT, JWT_SECRET), now=now)["iss"]
        assert verify_jwt(cluster.balancer.jwts[-1], (NEW_JWT,), now=now)

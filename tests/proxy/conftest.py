"""Fixtures: the proxy served on a real loopback port, against the real control plane and a fake
OpenAI-compatible provider, driven by the official `openai` SDK."""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import httpx
import openai
import pytest
import uvicorn
from litestar import Litestar

from proxy.app import create_app
from proxy.main import HTTP_OPTIONS
from proxy.settings import ProxySettings
from proxy.telemetry.metrics import ProxyMetrics
from tests.support.api import ANY, create
from tests.support.clock import ManualClock
from tests.support.env import INTERNAL_SECRET
from tests.support.fake_anthropic import FakeAnthropic, serve_fake_anthropic
from tests.support.fake_bedrock import FakeBedrock, serve_fake_bedrock
from tests.support.fake_gemini import FakeGemini, serve_fake_gemini
from tests.support.fake_openai import API_KEY, FakeOpenAI, serve_fake_openai
from tests.support.processes import free_port

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

CHAT_ALIAS = "chat"
EMBEDDING_ALIAS = "embed"
UPSTREAM_CHAT_MODEL = "gpt-4o-mini-2024-07-18"
UPSTREAM_EMBEDDING_MODEL = "text-embedding-3-small"
_serial = itertools.count(1)
_SPOOLS = tempfile.TemporaryDirectory(prefix="vkgate-test-spools-")
"""Every test proxy's spend spool lives under here, each in its own directory."""


@pytest.fixture
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    async with serve_fake_openai() as fake:
        yield fake


@pytest.fixture
async def fake_anthropic() -> AsyncIterator[FakeAnthropic]:
    async with serve_fake_anthropic() as fake:
        yield fake


@pytest.fixture
async def fake_bedrock() -> AsyncIterator[FakeBedrock]:
    async with serve_fake_bedrock() as fake:
        yield fake


@pytest.fixture
async def fake_gemini() -> AsyncIterator[FakeGemini]:
    async with serve_fake_gemini() as fake:
        yield fake


@dataclass
class RunningProxy:
    url: str
    """Base URL as the OpenAI SDK takes it, ending in /v1."""
    app: Litestar
    settings: ProxySettings

    def openai(self, key: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url, api_key=key, max_retries=0, timeout=10)

    def openai_sync(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url, api_key=key, max_retries=0, timeout=10)

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url.removesuffix("/v1"), timeout=10)

    @property
    def metrics(self) -> ProxyMetrics:
        metrics: ProxyMetrics = self.app.state["running"].metrics
        return metrics

    async def following_changes(self, within_s: float = 5.0) -> None:
        """Wait until the proxy's change-feed poller has a revision to follow changes from."""
        poller = self.app.state["running"].poller
        deadline = asyncio.get_running_loop().time() + within_s
        while poller is None or not poller.connected:
            assert asyncio.get_running_loop().time() < deadline, "the proxy never reached the feed"
            await asyncio.sleep(0.01)
            poller = self.app.state["running"].poller


def proxy_settings(**overrides: object) -> ProxySettings:
    values: dict[str, object] = {
        "internal_secret": INTERNAL_SECRET,
        "port": free_port(),
        "controlplane_url": "http://controlplane.test",
        "spool_dir": Path(tempfile.mkdtemp(dir=_SPOOLS.name)),
        # No metrics listener unless a test asks for one on a port of its own: the default
        # port is one per machine, and the suite's processes run side by side.
        "metrics_port": None,
        **overrides,
    }
    return ProxySettings(**values)  # type: ignore[arg-type]


class TappedTransport(httpx.AsyncBaseTransport):
    """The proxy's road to the control plane: records the path of every call, and can be cut."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner
        self.paths: list[str] = []
        self.cut = False
        """While set, every call fails as if the control plane were down."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        if self.cut:
            raise httpx.ConnectError("connection refused", request=request)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()

    def key_lookups(self) -> list[str]:
        """The calls that resolve a key or fetch its config (not the change feed's polls)."""
        return [p for p in self.paths if p.endswith("/resolve-key") or "/config/" in p]


@asynccontextmanager
async def serve_proxy(
    controlplane: Litestar | None,
    clock: ManualClock,
    settings: ProxySettings,
    *,
    control_transport: httpx.AsyncBaseTransport | None = None,
    span_exporter: SpanExporter | None = None,
) -> AsyncIterator[RunningProxy]:
    """The proxy under uvicorn on a loopback port, in the test's event loop.

    It reaches the control plane (already started by the `client` fixture) in-process, so both
    share the test's manual clock and database; `control_transport` replaces that road.
    """
    if control_transport is None:
        assert controlplane is not None, "give the control plane app or a transport to reach it"
        control_transport = httpx.ASGITransport(app=controlplane)
    app = create_app(
        settings, clock=clock, control_transport=control_transport, span_exporter=span_exporter
    )
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=settings.port,
            loop="none",
            lifespan="on",
            log_level="warning",
            access_log=False,
            **HTTP_OPTIONS,  # as `vkgate proxy` serves it
        )
    )
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
            raise AssertionError("the proxy stopped before it started")
        await asyncio.sleep(0.01)
    try:
        yield RunningProxy(f"http://127.0.0.1:{settings.port}/v1", app, settings)
    finally:
        server.should_exit = True
        await task


@pytest.fixture
async def proxy(
    app: Litestar, client: httpx.AsyncClient, clock: ManualClock
) -> AsyncIterator[RunningProxy]:
    async with serve_proxy(app, clock, proxy_settings()) as running:
        yield running


@dataclass
class Tenant:
    """An organization whose key routes `chat` and `embed` to the fake OpenAI provider."""

    org: str
    project: str
    provider: str
    policy: str
    key_id: str
    key: str


async def make_tenant(
    client: httpx.AsyncClient, upstream_url: str, api_key: str, name: str = "acme"
) -> Tenant:
    org = (await create(client, "/api/admin/organizations", {"name": name}))["id"]
    project = (
        await create(client, "/api/admin/projects", {"organization_id": org, "name": "chat"})
    )["id"]
    provider = await add_provider(client, org, "fake-openai", upstream_url, api_key)
    policy = await add_policy(
        client,
        org,
        {
            CHAT_ALIAS: [(provider, UPSTREAM_CHAT_MODEL)],
            EMBEDDING_ALIAS: [(provider, UPSTREAM_EMBEDDING_MODEL)],
        },
    )
    tenant = Tenant(org, project, provider, policy, "", "")
    tenant.key_id, tenant.key = await add_key(client, tenant)
    return tenant


async def add_provider(
    client: httpx.AsyncClient,
    org: str,
    name: str,
    base_url: str,
    api_key: str = API_KEY,
    *,
    kind: str = "openai_compatible",
    **fields: Any,
) -> str:
    body = {
        "organization_id": org,
        "name": name,
        "kind": kind,
        "base_url": base_url,
        "api_key": api_key,
        **fields,
    }
    return str((await create(client, "/api/admin/providers", body))["id"])


async def add_policy(
    client: httpx.AsyncClient, org: str, aliases: dict[str, list[tuple[str, str]]]
) -> str:
    """A routing policy; each alias names its chain as (provider id, upstream model) pairs."""
    chains = {
        alias: [{"provider_id": provider, "model": model} for provider, model in chain]
        for alias, chain in aliases.items()
    }
    body = {"organization_id": org, "name": f"policy-{next(_serial)}", "aliases": chains}
    return str((await create(client, "/api/admin/routing-policies", body))["id"])


async def add_key(
    client: httpx.AsyncClient, tenant: Tenant, *, policy: str | None = None, **fields: Any
) -> tuple[str, str]:
    """Another key of the tenant's project: (id, key)."""
    body = {
        "project_id": tenant.project,
        "name": f"key-{next(_serial)}",
        "routing_policy_id": policy or tenant.policy,
        **fields,
    }
    created = await create(client, "/api/admin/virtual-keys", body)
    return created["id"], created["key"]


@pytest.fixture
async def tenant(client: httpx.AsyncClient, fake_openai: FakeOpenAI) -> Tenant:
    return await make_tenant(client, fake_openai.url, fake_openai.api_key)


@pytest.fixture
async def failover(client: httpx.AsyncClient, fake_openai: FakeOpenAI) -> Tenant:
    """A key whose `chat` alias first tries a provider nobody listens for, then the fake."""
    org = (await create(client, "/api/admin/organizations", {"name": "observed"}))["id"]
    project = (await create(client, "/api/admin/projects", {"organization_id": org, "name": "p"}))[
        "id"
    ]
    dead = await add_provider(client, org, "dead", f"http://127.0.0.1:{free_port()}/v1")
    live = await add_provider(client, org, "live", fake_openai.url, fake_openai.api_key)
    policy = await add_policy(
        client, org, {CHAT_ALIAS: [(dead, UPSTREAM_CHAT_MODEL), (live, UPSTREAM_CHAT_MODEL)]}
    )
    tenant = Tenant(org, project, live, policy, "", "")
    tenant.key_id, tenant.key = await add_key(client, tenant)
    return tenant


class Answer(Protocol):
    """An HTTP response as httpx and the SDK's own client both give it."""

    @property
    def status_code(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def text(self) -> str: ...
    def json(self, **kwargs: Any) -> Any: ...


def openai_error(response: Answer, status: int, code: str, param: Any = ANY) -> dict[str, Any]:
    """The error object of a refusal, after checking its status, OpenAI shape, code and param."""
    assert response.status_code == status, response.text
    assert response.headers.get("x-request-id"), "every answer carries X-Request-ID"
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    # `attempts` is there when a chain gave no answer (the causes, one per credential).
    assert set(error) - {"attempts"} == {"message", "type", "code", "param"}, error
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert error["code"] == code, error
    if param is not ANY:
        assert error["param"] == param, error
    return error


async def refused_within(proxy: RunningProxy, key: str, status: int, within_s: float = 2.0) -> None:
    """Poll the proxy until `key` gets `status`: a change on the control plane reached it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    async with proxy.http() as http:
        while True:
            response = await http.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
            if response.status_code == status:
                return
            assert response.status_code == 200, response.text
            assert loop.time() < deadline, f"still {response.status_code} after {within_s} s"
            await asyncio.sleep(0.02)

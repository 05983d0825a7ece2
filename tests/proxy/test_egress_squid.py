"""Provider calls through squid, a forward proxy nobody here wrote: a CONNECT tunnel to nginx's
TLS in front of the fake provider, http forwarded, Basic credentials, and squid's refusals (407,
403, 503); then the gateway itself behind squid, called with the official OpenAI SDK."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from litestar import Litestar

from proxy.egress import egress_from_env
from proxy.providers import HttpClient, ProviderUnreachable, Timeouts
from proxy.settings import ProxySettings
from tests.proxy.conftest import CHAT_ALIAS, make_tenant, proxy_settings, serve_proxy
from tests.proxy.test_client_nginx import CHAT, HEADERS, STREAMED, locations
from tests.proxy.test_processes import admin_create, proxy_env
from tests.support.certificates import TestCA
from tests.support.clock import ManualClock
from tests.support.env import INTERNAL_SECRET, secrets_env
from tests.support.fake_openai import REPLY, FakeOpenAI, serve_fake_openai
from tests.support.packaged import Nginx, Squid, nginx_tls, squid_proxy
from tests.support.processes import clean_env, free_port, running

PROVIDER = "api.provider.test"
CONTROLPLANE = "controlplane.test"
USER, PASSWORD = "vk@corp", "s3cret:pa ss"
CREDENTIALS = "vk%40corp:s3cret%3Apa%20ss"
"""USER and PASSWORD as a proxy URL carries them."""
LOG_WAIT_S = 10.0


@dataclass
class Site:
    """nginx (TLS) in front of the fake provider, and squid in front of both."""

    ca: TestCA
    upstream: FakeOpenAI
    nginx: Nginx
    squid: Squid

    @property
    def upstream_port(self) -> int:
        return int(self.upstream.url.rsplit(":", 1)[1].split("/")[0])

    def proxy_url(self, credentials: str | None = CREDENTIALS) -> str:
        return (
            f"http://{credentials}@127.0.0.1:{self.squid.port}" if credentials else self.squid.url
        )

    def log_length(self) -> int:
        """Lines in squid's access log so far: a test counts only the lines after them (the
        module's tests share one squid, in an order pytest may change)."""
        return len(self.squid.access_log())

    def logged(self, expected: str, *, since: int = 0, count: int = 1) -> list[str]:
        """squid's access-log lines after the first `since` that start with `expected`, once
        there are `count` of them: squid logs a request as it ends, a tunnel as it closes
        (bounded wait)."""
        deadline = time.monotonic() + LOG_WAIT_S
        while True:
            lines = self.squid.access_log()[since:]
            found = [line for line in lines if line.startswith(expected)]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.02)  # another process's log, polled: nothing here can be injected


@pytest.fixture(scope="module")
async def upstream() -> AsyncIterator[FakeOpenAI]:
    async with serve_fake_openai() as fake:
        yield fake


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, upstream: FakeOpenAI) -> Iterator[Site]:
    ca = TestCA(tmp_path_factory.mktemp("squid-ca"))
    issued = ca.issue(PROVIDER)
    port = int(upstream.url.rsplit(":", 1)[1].split("/")[0])
    with (
        nginx_tls(issued.certificate, issued.key, locations(port)) as nginx,
        squid_proxy(
            {PROVIDER: "127.0.0.1", CONTROLPLANE: "127.0.0.1"},
            users={USER: PASSWORD},
            deny=[".forbidden.test"],
        ) as squid,
    ):
        yield Site(ca, upstream, nginx, squid)


def client(site: Site, **env: str) -> HttpClient:
    egress = egress_from_env({"VKGATE_PROVIDER_CA_BUNDLE": str(site.ca.bundle), **env})
    return HttpClient(
        Timeouts(connect_s=5, read_s=10, total_s=30),
        user_agent="vkgate/test",
        tls=egress.provider_tls(),
        egress=egress,
    )


BODY = json.dumps(CHAT).encode()


async def test_https_calls_go_through_one_squid_tunnel_to_nginx(site: Site) -> None:
    since = site.log_length()
    http = client(site, HTTPS_PROXY=site.proxy_url())
    url = f"https://{PROVIDER}:{site.nginx.port}/plain/v1/chat/completions"
    try:
        for _ in range(3):
            reply = await http.post(url, BODY, HEADERS)
            assert reply.status == 200
            assert json.loads(await reply.read())["choices"][0]["message"]["content"] == REPLY
        stream = await http.post(url, json.dumps({**CHAT, "stream": True}).encode(), HEADERS)
        received = b"".join([chunk async for chunk in stream.chunks()])
        assert received.rstrip().endswith(b"data: [DONE]")
    finally:
        await http.close()  # squid logs the tunnel as it ends
    # In a thread: the loop must turn for the closed connections to reach their sockets.
    connect = f"CONNECT {PROVIDER}:{site.nginx.port}"
    tunnels = await asyncio.to_thread(site.logged, connect, since=since)
    assert tunnels == [f"{connect} 200 {USER}"], site.squid.access_log()


async def test_http_calls_are_forwarded_by_squid(site: Site) -> None:
    since = site.log_length()
    http = client(site, HTTP_PROXY=site.proxy_url())
    url = f"http://{PROVIDER}:{site.upstream_port}/v1/chat/completions"
    try:
        for _ in range(2):
            reply = await http.post(url, BODY, HEADERS)
            assert json.loads(await reply.read())["choices"][0]["message"]["content"] == REPLY
    finally:
        await http.close()
    forwarded = await asyncio.to_thread(site.logged, f"POST {url}", since=since, count=2)
    assert forwarded == [f"POST {url} 200 {USER}"] * 2, site.squid.access_log()
    # squid passed the provider's own credential through, and none of the proxy's.
    last = site.upstream.received[-1]
    assert last.header("authorization") == HEADERS["Authorization"]
    assert last.header("proxy-authorization") is None


@pytest.mark.parametrize(
    ("scheme", "credentials", "host", "expected"),
    [
        ("https", None, PROVIDER, r"answered 407 .*check the user and password in HTTPS_PROXY"),
        ("https", "vk%40corp:wrong", PROVIDER, "answered 407"),
        ("http", None, PROVIDER, r"answered 407 .*check the user and password in HTTP_PROXY"),
        ("https", CREDENTIALS, "api.forbidden.test", r"answered 403 .*policy forbids"),
        ("https", CREDENTIALS, "down", r"answered 503 .*could not reach the provider"),
    ],
    ids=["407-none", "407-wrong", "407-forwarded", "403", "503"],
)
async def test_squid_refusing_a_call_fails_it_with_squids_answer(
    site: Site, scheme: str, credentials: str | None, host: str, expected: str
) -> None:
    variable = "HTTPS_PROXY" if scheme == "https" else "HTTP_PROXY"
    http = client(site, **{variable: site.proxy_url(credentials)})
    if host == "down":  # squid knows the name; nothing listens on the port
        host, port = PROVIDER, free_port()
    else:
        port = site.nginx.port if scheme == "https" else site.upstream_port
    try:
        with pytest.raises(ProviderUnreachable, match=expected) as failure:
            await http.post(f"{scheme}://{host}:{port}/plain/v1/chat/completions", BODY, HEADERS)
    finally:
        await http.close()
    assert "wrong" not in str(failure.value) and "s3cret" not in str(failure.value)


# -- the gateway behind squid ------------------------------------------------------------------


async def test_the_gateway_behind_squid_serves_the_openai_sdk(
    site: Site, client: httpx.AsyncClient, app: Litestar, clock: ManualClock
) -> None:
    """Settings read as `vkgate proxy` reads them: the proxy variables and the CA bundle."""
    from_env = ProxySettings.from_env(
        {
            "VKGATE_INTERNAL_SECRET": INTERNAL_SECRET,
            "HTTPS_PROXY": site.proxy_url(),
            "NO_PROXY": "controlplane.test",
            "VKGATE_PROVIDER_CA_BUNDLE": str(site.ca.bundle),
        }
    )
    settings = proxy_settings(egress=from_env.egress)
    since = site.log_length()
    # Through nginx's gzip: squid's tunnel carries nginx's compressed, chunked answers.
    base_url = f"https://{PROVIDER}:{site.nginx.port}/gzip/v1"
    tenant = await make_tenant(client, base_url, site.upstream.api_key)
    async with serve_proxy(app, clock, settings) as proxy:
        sdk = proxy.openai(tenant.key)
        answer = await sdk.chat.completions.create(model=CHAT_ALIAS, messages=CHAT["messages"])
        assert answer.choices[0].message.content == REPLY
        stream = await sdk.chat.completions.create(
            model=CHAT_ALIAS, messages=CHAT["messages"], stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == STREAMED
        await sdk.close()
    connect = f"CONNECT {PROVIDER}:{site.nginx.port} 200 {USER}"
    assert await asyncio.to_thread(site.logged, connect, since=since)


async def test_the_gateway_refused_by_squid_answers_502_and_logs_squids_reason(
    site: Site,
    client: httpx.AsyncClient,
    app: Litestar,
    clock: ManualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    egress = egress_from_env(
        {
            "HTTPS_PROXY": site.proxy_url("vk%40corp:hunter2"),
            "VKGATE_PROVIDER_CA_BUNDLE": str(site.ca.bundle),
        }
    )
    tenant = await make_tenant(
        client, f"https://{PROVIDER}:{site.nginx.port}/plain/v1", site.upstream.api_key
    )
    calls = len(site.upstream.received)
    caplog.set_level(logging.WARNING, logger="vkgate.proxy")
    async with serve_proxy(app, clock, proxy_settings(egress=egress)) as proxy:
        sdk = proxy.openai(tenant.key)
        with pytest.raises(openai.APIStatusError) as refused:
            await sdk.chat.completions.create(model=CHAT_ALIAS, messages=CHAT["messages"])
        await sdk.close()
    assert refused.value.status_code == 502
    [failed] = [r for r in caplog.records if r.getMessage().startswith("provider_attempt_failed")]
    reason = failed.vkgate_fields["reason"]  # type: ignore[attr-defined]
    assert f"the proxy 127.0.0.1:{site.squid.port} (HTTPS_PROXY) answered 407" in reason
    assert "hunter2" not in caplog.text
    assert len(site.upstream.received) == calls  # nothing reached the provider


async def test_vkgate_proxy_behind_squid_reaches_its_control_plane_and_providers_through_it(
    site: Site, tmp_path: Path
) -> None:
    """`vkgate proxy` as an operator runs it on a network whose only way out is squid: the
    control plane at a name only squid resolves, the provider behind TLS from the team's CA."""
    since = site.log_length()
    # In a thread: the fake provider behind nginx answers on this test's event loop.
    await asyncio.to_thread(_behind_squid, site, tmp_path, since)


def _behind_squid(site: Site, tmp_path: Path, since: int) -> None:
    port = free_port()
    env = clean_env(
        **secrets_env(f"sqlite:///{tmp_path / 'cp.db'}"),
        VKGATE_CONTROLPLANE_ADDR=f"127.0.0.1:{port}",
    )
    with running(
        ["controlplane", "--migrate"], env=env, port=port, log=tmp_path / "cp.log", cwd=tmp_path
    ) as controlplane:
        org = admin_create(controlplane, "/api/admin/organizations", {"name": "corp"})["id"]
        project = admin_create(
            controlplane, "/api/admin/projects", {"organization_id": org, "name": "p"}
        )["id"]
        provider = admin_create(
            controlplane,
            "/api/admin/providers",
            {
                "organization_id": org,
                "name": "behind-squid",
                "kind": "openai_compatible",
                "base_url": f"https://{PROVIDER}:{site.nginx.port}/plain/v1",
                "api_key": site.upstream.api_key,
            },
        )["id"]
        policy = admin_create(
            controlplane,
            "/api/admin/routing-policies",
            {
                "organization_id": org,
                "name": "p",
                "aliases": {CHAT_ALIAS: [{"provider_id": provider, "model": "gpt-4o-mini"}]},
            },
        )["id"]
        key = admin_create(
            controlplane,
            "/api/admin/virtual-keys",
            {"project_id": project, "name": "k", "routing_policy_id": policy},
        )["key"]
        proxy_port = free_port()
        extra = {
            "VKGATE_SPOOL_DIR": str(tmp_path / "spool"),
            "https_proxy": site.proxy_url(),
            "http_proxy": site.proxy_url(),
            "VKGATE_PROVIDER_CA_BUNDLE": str(site.ca.bundle),
            "VKGATE_LOG_FORMAT": "text",
        }
        cp_url = f"http://{CONTROLPLANE}:{port}"
        with running(
            ["proxy"],
            env=proxy_env(cp_url, proxy_port, **extra),
            port=proxy_port,
            log=tmp_path / "proxy.log",
            cwd=tmp_path,
        ) as proxy:
            with openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=key, max_retries=0) as sdk:
                answer = sdk.chat.completions.create(
                    model=CHAT_ALIAS, messages=[{"role": "user", "content": "hello"}]
                )
            assert answer.choices[0].message.content == REPLY
            assert httpx.get(f"{proxy.url}/health", timeout=10).json()["status"] == "ok"
    assert site.logged(f"POST {cp_url}/api/internal/gateway/resolve-key 200 {USER}", since=since)
    assert site.logged(f"CONNECT {PROVIDER}:{site.nginx.port} 200 {USER}", since=since)
    output = proxy.output()
    assert f"provider calls: https through 127.0.0.1:{site.squid.port} (https_proxy)" in output
    assert "s3cret" not in output and PASSWORD not in output

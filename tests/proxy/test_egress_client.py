"""The provider client through an HTTP proxy: CONNECT tunnels with TLS to the provider inside,
absolute-form forwarding for http, the proxy's credentials, its refusals, and what goes direct.

The proxies here are loopback servers that show what they were sent (`ConnectProxy`, and a
scripted server standing in for a forwarding proxy); squid does the same jobs in
test_egress_squid.py."""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import uvloop

from proxy.egress import Egress, egress_from_env
from proxy.providers import HttpClient, ProviderTimeout, ProviderUnreachable, Timeouts
from tests.proxy.test_provider_client import BODY, Scripted, json_answer
from tests.support.certificates import TestCA
from tests.support.connect_proxy import ConnectProxy
from tests.support.processes import free_port

PROVIDER = "api.provider.test"
"""A name only the proxies here resolve (to 127.0.0.1): calls to it must go through them."""
CREDENTIALS = "Basic " + base64.b64encode(b"vk@corp:p:ss w").decode()
"""What `vk%40corp:p%3Ass%20w@` in a proxy URL stands for."""


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("ca"))


def serving_tls(ca: TestCA, *names: str) -> ssl.SSLContext:
    issued = ca.issue(*names)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(issued.certificate, issued.key)
    return context


def client(egress: Egress, connect_s: float = 2.0) -> HttpClient:
    return HttpClient(
        Timeouts(connect_s=connect_s, read_s=5, total_s=30),
        user_agent="vkgate/test",
        tls=egress.provider_tls(),
        egress=egress,
    )


def egress(ca: TestCA, **env: str) -> Egress:
    return egress_from_env({"VKGATE_PROVIDER_CA_BUNDLE": str(ca.bundle), **env})


@pytest.fixture
async def provider(ca: TestCA) -> AsyncIterator[Scripted]:
    """A TLS provider on loopback, certified for `PROVIDER` by the test's CA."""
    async with Scripted(tls=serving_tls(ca, PROVIDER)) as server:
        yield server


def head_lines(head: bytes) -> list[str]:
    return head.decode().split("\r\n")


# -- CONNECT tunnels ---------------------------------------------------------------------------


async def test_an_https_call_goes_through_one_kept_tunnel_with_tls_to_the_provider_inside(
    ca: TestCA, provider: Scripted
) -> None:
    provider.answers += [json_answer(b'{"n":1}'), json_answer(b'{"n":2}')]
    async with ConnectProxy(hosts={PROVIDER: "127.0.0.1"}, credentials=CREDENTIALS) as proxy:
        url = f"http://vk%40corp:p%3Ass%20w@127.0.0.1:{proxy.port}"
        http = client(egress(ca, HTTPS_PROXY=url))
        try:
            for n in (1, 2):
                reply = await http.post(f"https://{PROVIDER}:{provider.port}/v1/chat", BODY, {})
                assert (reply.status, await reply.read()) == (200, b'{"n":%d}' % n)
        finally:
            await http.close()
    # One tunnel, asked for with the proxy's credentials, carried both calls.
    assert proxy.targets == [f"{PROVIDER}:{provider.port}"]
    connect = head_lines(proxy.requests[0])
    assert connect[0] == f"CONNECT {PROVIDER}:{provider.port} HTTP/1.1"
    assert f"proxy-authorization: {CREDENTIALS}" in connect
    assert provider.connections == 1
    # Inside the tunnel, the provider sees an ordinary request: origin form, its own host,
    # and nothing of the proxy's.
    for head, body in provider.requests:
        lines = head_lines(head)
        assert lines[0] == "POST /v1/chat HTTP/1.1"
        assert f"host: {PROVIDER}:{provider.port}" in lines
        assert not any(line.lower().startswith("proxy-") for line in lines)
        assert body == BODY


async def test_each_origin_gets_a_tunnel_of_its_own(ca: TestCA) -> None:
    other = "other.provider.test"
    async with (
        Scripted(*(json_answer() for _ in range(2)), tls=serving_tls(ca, PROVIDER)) as first,
        Scripted(*(json_answer() for _ in range(2)), tls=serving_tls(ca, other)) as second,
        ConnectProxy(hosts={PROVIDER: "127.0.0.1", other: "127.0.0.1"}) as proxy,
    ):
        http = client(egress(ca, https_proxy=proxy.url))
        try:
            for _ in range(2):
                for name, server in ((PROVIDER, first), (other, second)):
                    reply = await http.post(f"https://{name}:{server.port}/x", BODY, {})
                    assert await reply.read() == b'{"ok":true}'
        finally:
            await http.close()
    assert sorted(proxy.targets) == sorted([f"{PROVIDER}:{first.port}", f"{other}:{second.port}"])


async def test_the_provider_inside_the_tunnel_is_verified_for_its_name(ca: TestCA) -> None:
    async with (
        Scripted(json_answer(), tls=serving_tls(ca, "someone.else.test")) as impostor,
        ConnectProxy(hosts={PROVIDER: "127.0.0.1"}) as proxy,
    ):
        http = client(egress(ca, HTTPS_PROXY=proxy.url))
        try:
            with pytest.raises(ProviderUnreachable) as failure:
                await http.post(f"https://{PROVIDER}:{impostor.port}/x", BODY, {})
        finally:
            await http.close()
    message = str(failure.value)
    assert "CERTIFICATE_VERIFY_FAILED" in message
    assert f"through the proxy 127.0.0.1:{proxy.port} (HTTPS_PROXY)" in message
    assert impostor.requests == []


async def test_without_the_ca_bundle_the_providers_certificate_is_refused(
    ca: TestCA, provider: Scripted
) -> None:
    provider.answers.append(json_answer())
    async with ConnectProxy(hosts={PROVIDER: "127.0.0.1"}) as proxy:
        http = client(egress_from_env({"HTTPS_PROXY": proxy.url}))  # the system's store only
        try:
            with pytest.raises(ProviderUnreachable, match="CERTIFICATE_VERIFY_FAILED"):
                await http.post(f"https://{PROVIDER}:{provider.port}/x", BODY, {})
        finally:
            await http.close()
    assert provider.requests == []


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (
            None,  # credentials required, none given
            r"answered 407 Proxy Authentication Required for api\.provider\.test:\d+: the proxy "
            r"wants credentials: check the user and password in https_proxy",
        ),
        (
            b"HTTP/1.1 403 Forbidden\r\ncontent-length: 9\r\n\r\nforbidden",
            r"answered 403 Forbidden for .*: the proxy's policy forbids this destination",
        ),
        (
            b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n",
            r"answered 502 Bad Gateway for .*: the proxy could not reach the provider",
        ),
        (
            b"HTTP/1.0 418 \r\n\r\n",
            r"answered 418 for .*: the proxy refused the call",
        ),
    ],
    ids=["407", "403", "502", "other"],
)
async def test_a_proxy_refusing_the_tunnel_fails_the_call_with_its_answer_and_meaning(
    ca: TestCA, provider: Scripted, answer: bytes | None, expected: str
) -> None:
    refusing = ConnectProxy(
        hosts={PROVIDER: "127.0.0.1"},
        refuse=answer,
        credentials=CREDENTIALS if answer is None else None,
    )
    async with refusing as proxy:
        http = client(egress(ca, https_proxy=proxy.url))
        try:
            with pytest.raises(ProviderUnreachable, match=expected) as failure:
                await http.post(f"https://{PROVIDER}:{provider.port}/x", BODY, {})
        finally:
            await http.close()
    assert f"the proxy 127.0.0.1:{proxy.port} (https_proxy)" in str(failure.value)
    assert provider.connections == 0


async def test_wrong_proxy_credentials_are_a_407_and_never_appear_in_the_failure(
    ca: TestCA, provider: Scripted
) -> None:
    async with ConnectProxy(hosts={PROVIDER: "127.0.0.1"}, credentials=CREDENTIALS) as proxy:
        http = client(egress(ca, HTTPS_PROXY=f"http://vk:hunter2@127.0.0.1:{proxy.port}"))
        try:
            with pytest.raises(ProviderUnreachable, match="407") as failure:
                await http.post(f"https://{PROVIDER}:{provider.port}/x", BODY, {})
        finally:
            await http.close()
    assert "hunter2" not in str(failure.value)
    assert base64.b64encode(b"vk:hunter2").decode() not in str(failure.value)


async def test_a_proxy_that_never_answers_the_tunnel_request_is_a_connect_timeout(
    ca: TestCA,
) -> None:
    async with ConnectProxy(silent=True) as proxy:
        http = client(egress(ca, HTTPS_PROXY=proxy.url), connect_s=0.2)
        try:
            with pytest.raises(ProviderTimeout, match=r"no connection to .* through the proxy"):
                await http.post(f"https://{PROVIDER}:443/x", BODY, {})
        finally:
            await http.close()


async def test_a_proxy_that_hangs_up_on_the_tunnel_request_fails_the_call(ca: TestCA) -> None:
    async with ConnectProxy(hang_up=True) as proxy:
        http = client(egress(ca, HTTPS_PROXY=proxy.url))
        try:
            with pytest.raises(ProviderUnreachable, match="closed the connection before it"):
                await http.post(f"https://{PROVIDER}:443/x", BODY, {})
        finally:
            await http.close()


async def test_a_proxy_that_is_down_fails_the_call_naming_it(ca: TestCA) -> None:
    port = free_port()  # nothing listens there
    http = client(egress(ca, HTTPS_PROXY=f"127.0.0.1:{port}"))
    try:
        with pytest.raises(
            ProviderUnreachable,
            match=rf"cannot connect to {PROVIDER}:443 through the proxy 127\.0\.0\.1:{port} "
            r"\(HTTPS_PROXY\)",
        ):
            await http.post(f"https://{PROVIDER}/x", BODY, {})
    finally:
        await http.close()


async def test_an_answer_that_is_not_http_is_a_failure(ca: TestCA) -> None:
    async with ConnectProxy(refuse=b"SSH-2.0-OpenSSH_9.2\r\n\r\n") as proxy:
        http = client(egress(ca, HTTPS_PROXY=proxy.url))
        try:
            with pytest.raises(ProviderUnreachable, match="an answer that is not HTTP"):
                await http.post(f"https://{PROVIDER}/x", BODY, {})
        finally:
            await http.close()


def test_a_tunnel_works_on_uvloop_as_the_server_runs_it(ca: TestCA) -> None:
    async def call() -> bytes:
        async with (
            Scripted(json_answer(b'{"loop":"uvloop"}'), tls=serving_tls(ca, PROVIDER)) as server,
            ConnectProxy(hosts={PROVIDER: "127.0.0.1"}) as proxy,
        ):
            http = client(egress(ca, HTTPS_PROXY=proxy.url))
            try:
                reply = await http.post(f"https://{PROVIDER}:{server.port}/x", BODY, {})
                return await reply.read()
            finally:
                await http.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(asyncio.wait_for(call(), 10)) == b'{"loop":"uvloop"}'


# -- forwarding (http) ---------------------------------------------------------------------------


async def test_an_http_call_is_forwarded_in_absolute_form_with_the_proxys_credentials(
    ca: TestCA,
) -> None:
    # The scripted server plays the forwarding proxy: it is sent what a proxy would be.
    async with Scripted(json_answer(), json_answer()) as proxy:
        url = f"http://vk%40corp:p%3Ass%20w@127.0.0.1:{proxy.port}/"
        http = client(egress(ca, HTTP_PROXY=url))
        try:
            for _ in range(2):
                reply = await http.post(
                    f"http://{PROVIDER}:8080/v1/chat?api-version=1",
                    BODY,
                    {"Authorization": "Bearer sk-x", "Proxy-Authorization": "Basic bm9wZQ=="},
                )
                assert await reply.read() == b'{"ok":true}'
        finally:
            await http.close()
    assert proxy.connections == 1  # kept alive, per origin and proxy
    for head, body in proxy.requests:
        lines = head_lines(head)
        assert lines[0] == f"POST http://{PROVIDER}:8080/v1/chat?api-version=1 HTTP/1.1"
        # The egress's credentials, once; a credential's own header for the proxy is not sent.
        assert [line for line in lines if line.lower().startswith("proxy-")] == [
            f"proxy-authorization: {CREDENTIALS}"
        ]
        assert f"host: {PROVIDER}:8080" in lines
        assert "Authorization: Bearer sk-x" in lines
        assert body == BODY


async def test_a_forwarding_proxys_407_is_a_failure_not_the_providers_answer(ca: TestCA) -> None:
    refusal = b"HTTP/1.1 407 Proxy Authentication Required\r\ncontent-length: 0\r\n\r\n"
    async with Scripted(json_answer()) as proxy:
        proxy.answers.insert(0, lambda writer: _write(writer, refusal))
        http = client(egress(ca, HTTP_PROXY=f"127.0.0.1:{proxy.port}"))
        try:
            with pytest.raises(
                ProviderUnreachable, match=r"answered 407 .* check the user and password in HTTP_"
            ):
                await http.post(f"http://{PROVIDER}/v1/chat", BODY, {})
        finally:
            await http.close()


async def test_inside_a_tunnel_any_status_is_the_providers_own_answer(
    ca: TestCA, provider: Scripted
) -> None:
    answer = b"HTTP/1.1 407 Odd\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
    provider.answers.append(lambda writer: _write(writer, answer))
    async with ConnectProxy(hosts={PROVIDER: "127.0.0.1"}) as proxy:
        http = client(egress(ca, HTTPS_PROXY=proxy.url))
        try:
            reply = await http.post(f"https://{PROVIDER}:{provider.port}/x", BODY, {})
            assert (reply.status, await reply.read()) == (407, b"{}")
        finally:
            await http.close()


async def _write(writer: asyncio.StreamWriter, data: bytes) -> bool:
    writer.write(data)
    await writer.drain()
    return True


# -- what goes direct -----------------------------------------------------------------------------


async def test_no_proxy_hosts_and_loopback_are_called_directly(ca: TestCA, tmp_path: Path) -> None:
    async with (
        Scripted(*(json_answer() for _ in range(3)), tls=serving_tls(ca, "127.0.0.1")) as tls,
        Scripted(json_answer()) as plain,
        ConnectProxy() as proxy,
    ):
        http = client(
            egress(ca, HTTPS_PROXY=proxy.url, HTTP_PROXY=proxy.url, NO_PROXY="10.0.0.0/8")
        )
        try:
            # Loopback is never sent to a proxy, NO_PROXY or not.
            for url in (f"https://127.0.0.1:{tls.port}/x", f"http://localhost:{plain.port}/x"):
                reply = await http.post(url, BODY, {})
                assert await reply.read() == b'{"ok":true}'
        finally:
            await http.close()
        assert proxy.requests == []


async def test_a_no_proxy_name_covers_its_subdomains_and_skips_the_proxy(ca: TestCA) -> None:
    egress_ = egress(
        ca,
        https_proxy="http://proxy.corp:3128",
        no_proxy=".internal.test, api.vendor.test:8443",
    )
    assert egress_.proxy_for("https", "llm.internal.test", 443) is None
    assert egress_.proxy_for("https", "internal.test", 443) is None
    assert egress_.proxy_for("https", "api.vendor.test", 8443) is None
    proxied = egress_.proxy_for("https", "api.vendor.test", 443)
    assert proxied is not None and proxied.address == "proxy.corp:3128"
    assert egress_.proxy_for("http", "llm.vendor.test", 80) is None  # no http proxy set

"""`vkgate proxy` as an operator runs it: real processes beside a real control plane.

Two proxy processes share one control plane on PostgreSQL, as in production; an admin call that
revokes, disables or rotates a key must reach both within the one second the product promises.
"""

from __future__ import annotations

import asyncio
import secrets
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from proxy.providers.mock import REPLY
from tests.support.api import ADMIN
from tests.support.databases import postgres_database
from tests.support.env import INTERNAL_SECRET, secrets_env
from tests.support.processes import (
    EXIT_TIMEOUT_S,
    READY_TIMEOUT_S,
    Service,
    clean_env,
    free_port,
    running,
    stop,
    vkgate,
    wait_until_closed,
)

CHAT_ALIAS = "chat"
CHAT = {"model": CHAT_ALIAS, "messages": [{"role": "user", "content": "hello"}]}
PROPAGATION_BOUND_S = 1.0
"""The product requirement: an admin change is in force on every proxy within this long."""
REFUSAL_WAIT_S = 10.0
"""How long to keep asking before concluding a proxy never refuses (far above the bound)."""
REFUSAL_POLL_S = 0.005


@dataclass
class Deployment:
    controlplane: Service
    proxies: list[Service]
    workdir: Path


def proxy_env(controlplane_url: str, port: int, **extra: str) -> dict[str, str]:
    return clean_env(
        **{
            "VKGATE_INTERNAL_SECRET": INTERNAL_SECRET,
            "VKGATE_CONTROLPLANE_URL": controlplane_url,
            "VKGATE_PROXY_ADDR": f"127.0.0.1:{port}",
            **extra,
        }
    )


@contextmanager
def proxy_process(controlplane_url: str, log: Path, cwd: Path, **extra: str) -> Iterator[Service]:
    port = free_port()
    env = proxy_env(controlplane_url, port, **extra)
    with running(["proxy"], env=env, port=port, log=log, cwd=cwd) as service:
        yield service


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """One control plane on a fresh PostgreSQL database, and two proxies pointed at it."""
    workdir = tmp_path_factory.mktemp("deployment")
    with postgres_database() as url, ExitStack() as stack:
        port = free_port()
        env = clean_env(**secrets_env(url), VKGATE_CONTROLPLANE_ADDR=f"127.0.0.1:{port}")
        controlplane = stack.enter_context(
            running(
                ["controlplane", "--migrate"],
                env=env,
                port=port,
                log=workdir / "controlplane.log",
                cwd=workdir,
            )
        )
        proxies = [
            stack.enter_context(
                proxy_process(controlplane.url, workdir / f"proxy-{n}.log", workdir)
            )
            for n in (1, 2)
        ]
        yield Deployment(controlplane, proxies, workdir)


@dataclass
class Tenant:
    """An organization whose `chat` alias routes to the offline `mock` provider."""

    project: str
    policy: str
    org: str = ""


def admin_create(controlplane: Service, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{controlplane.url}{path}", json=body, headers=ADMIN, timeout=10)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


def make_tenant(controlplane: Service) -> Tenant:
    org = admin_create(
        controlplane, "/api/admin/organizations", {"name": f"acme-{secrets.token_hex(4)}"}
    )["id"]
    project = admin_create(
        controlplane, "/api/admin/projects", {"organization_id": org, "name": "chat"}
    )["id"]
    provider = admin_create(
        controlplane,
        "/api/admin/providers",
        {"organization_id": org, "name": "offline", "kind": "mock"},
    )["id"]
    policy = admin_create(
        controlplane,
        "/api/admin/routing-policies",
        {
            "organization_id": org,
            "name": "default",
            "aliases": {CHAT_ALIAS: [{"provider_id": provider, "model": "mock-chat"}]},
        },
    )["id"]
    return Tenant(project, policy, org)


@pytest.fixture(scope="module")
def tenant(deployment: Deployment) -> Tenant:
    return make_tenant(deployment.controlplane)


@dataclass
class Key:
    id: str
    key: str


def new_key(controlplane: Service, tenant: Tenant) -> Key:
    created = admin_create(
        controlplane,
        "/api/admin/virtual-keys",
        {
            "project_id": tenant.project,
            "name": f"app-{secrets.token_hex(4)}",
            "routing_policy_id": tenant.policy,
        },
    )
    return Key(created["id"], created["key"])


def sdk(proxy: Service, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=key, max_retries=0, timeout=10)


def assert_completes(proxy: Service, key: str) -> None:
    """The official SDK gets the mock provider's answer through `proxy` with `key`."""
    with sdk(proxy, key) as client:
        reply = client.chat.completions.create(
            model=CHAT_ALIAS, messages=[{"role": "user", "content": "hello"}]
        )
    assert reply.choices[0].message.content == REPLY


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def seconds_until_refused(
    http: httpx.AsyncClient, proxy: Service, key: str, since: float, status: int, code: str
) -> float:
    """Ask `proxy` with `key` again and again; seconds from `since` to its first refusal."""
    while True:
        response = await http.post(
            f"{proxy.url}/v1/chat/completions", json=CHAT, headers=bearer(key)
        )
        elapsed = time.monotonic() - since
        if response.status_code != 200:
            assert response.status_code == status, response.text
            assert response.json()["error"]["code"] == code, response.text
            return elapsed
        if elapsed > REFUSAL_WAIT_S:
            raise AssertionError(
                f"{proxy.url} still served the key {elapsed:.1f} s after the change"
            )
        await asyncio.sleep(REFUSAL_POLL_S)


@dataclass
class Propagation:
    answer: httpx.Response
    """The admin call's answer."""
    answered_after: float
    refused_after: list[float]
    """Per proxy: seconds from sending the admin call to that proxy's first refusal."""

    def report(self, change: str) -> None:
        figures = ", ".join(
            f"proxy {n} after {seconds * 1000:.0f} ms"
            for n, seconds in enumerate(self.refused_after, 1)
        )
        print(
            f"\n{change}: admin call answered after {self.answered_after * 1000:.0f} ms; "
            f"key refused by {figures}"
        )


async def propagate(
    deployment: Deployment, key: str, admin_path: str, body: Any, status: int, code: str
) -> Propagation:
    """Make the admin call and, from the moment it is sent, poll every proxy at once."""
    async with httpx.AsyncClient(timeout=10) as http:
        since = time.monotonic()

        async def admin_call() -> tuple[httpx.Response, float]:
            url = f"{deployment.controlplane.url}{admin_path}"
            answer = await http.post(url, json=body, headers=ADMIN)
            return answer, time.monotonic() - since

        (answer, answered_after), *refused_after = await asyncio.gather(
            admin_call(),
            *(
                seconds_until_refused(http, proxy, key, since, status, code)
                for proxy in deployment.proxies
            ),
        )
    assert answer.status_code == 200, answer.text
    return Propagation(answer, answered_after, refused_after)


def cached_everywhere(deployment: Deployment, tenant: Tenant) -> Key:
    """A new key that every proxy has used once, so each holds it in its auth cache."""
    key = new_key(deployment.controlplane, tenant)
    for proxy in deployment.proxies:
        assert_completes(proxy, key.key)
    return key


def assert_within_bound(propagation: Propagation) -> None:
    assert len(propagation.refused_after) == 2
    assert all(seconds < PROPAGATION_BOUND_S for seconds in propagation.refused_after), (
        propagation.refused_after
    )


async def test_revoked_key_is_refused_by_every_proxy_within_one_second(
    deployment: Deployment, tenant: Tenant
) -> None:
    key = cached_everywhere(deployment, tenant)

    revoked = await propagate(
        deployment,
        key.key,
        f"/api/admin/virtual-keys/{key.id}/revoke",
        None,
        403,
        "virtual_key_revoked",
    )

    revoked.report("revoke")
    assert_within_bound(revoked)


async def test_disabled_key_is_refused_by_every_proxy_within_one_second(
    deployment: Deployment, tenant: Tenant
) -> None:
    key = cached_everywhere(deployment, tenant)

    disabled = await propagate(
        deployment,
        key.key,
        f"/api/admin/virtual-keys/{key.id}/disable",
        None,
        403,
        "virtual_key_disabled",
    )

    disabled.report("disable")
    assert_within_bound(disabled)


async def test_key_rotated_without_grace_is_refused_by_every_proxy_within_one_second(
    deployment: Deployment, tenant: Tenant
) -> None:
    key = cached_everywhere(deployment, tenant)

    rotated = await propagate(
        deployment,
        key.key,
        f"/api/admin/virtual-keys/{key.id}/rotate",
        {"grace_seconds": 0},
        401,
        "invalid_api_key",
    )

    rotated.report("rotate (grace 0)")
    assert_within_bound(rotated)
    new = rotated.answer.json()["key"]
    assert new != key.key
    for proxy in deployment.proxies:
        assert_completes(proxy, new)


def test_proxy_health_reports_the_control_plane(deployment: Deployment) -> None:
    for proxy in deployment.proxies:
        ready = eventually_status(f"{proxy.url}/readyz", 200)
        assert ready.json()["controlplane"] is True

        health = httpx.get(f"{proxy.url}/health", timeout=5)
        assert health.status_code == 200, health.text
        body = health.json()
        assert body["status"] == "ok"
        assert isinstance(body["controlplane"]["revision"], int)


def test_proxy_with_two_workers_answers_requests_and_exits_0_on_sigterm(
    deployment: Deployment, tenant: Tenant
) -> None:
    key = new_key(deployment.controlplane, tenant)
    with proxy_process(
        deployment.controlplane.url,
        deployment.workdir / "proxy-workers.log",
        deployment.workdir,
        # Each worker on a socket of its own; the SDK's clients land on either.
        VKGATE_PROXY_WORKERS="2",
    ) as proxy:
        assert httpx.get(f"{proxy.url}/healthz", timeout=5).status_code == 200
        for _ in range(4):
            assert_completes(proxy, key.key)
        proxy.process.send_signal(signal.SIGTERM)
        # Each worker drains, then the parent that stopped them exits: cleanly, so with 0.
        code = proxy.process.wait(timeout=3 * EXIT_TIMEOUT_S)
    assert code == 0, proxy.output()
    wait_until_closed(proxy.url)  # the worker processes went with it


def test_proxy_refuses_to_start_without_the_internal_secret(tmp_path: Path) -> None:
    env = clean_env(VKGATE_PROXY_ADDR=f"127.0.0.1:{free_port()}")
    result = vkgate("proxy", env=env, cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "configuration: VKGATE_INTERNAL_SECRET is required" in result.stderr
    assert "Traceback" not in result.stderr


def test_proxy_refuses_to_start_on_an_unknown_setting(tmp_path: Path) -> None:
    env = proxy_env("http://127.0.0.1:9", free_port(), VKGATE_PROXY_WORKRES="2")
    result = vkgate("proxy", env=env, cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        "VKGATE_PROXY_WORKRES is not a vkgate setting; did you mean VKGATE_PROXY_WORKERS?"
        in result.stderr
    )
    assert "Traceback" not in result.stderr


def test_proxy_without_its_control_plane_is_unready_unless_it_has_keys_cached(
    tmp_path: Path,
) -> None:
    port = free_port()
    env = clean_env(
        **secrets_env(f"sqlite:///{tmp_path / 'controlplane.db'}"),
        VKGATE_CONTROLPLANE_ADDR=f"127.0.0.1:{port}",
    )
    with (
        running(
            ["controlplane", "--migrate"], env=env, port=port, log=tmp_path / "cp.log", cwd=tmp_path
        ) as controlplane,
        proxy_process(controlplane.url, tmp_path / "warm.log", tmp_path) as warm,
        proxy_process(controlplane.url, tmp_path / "cold.log", tmp_path) as cold,
    ):
        key = new_key(controlplane, make_tenant(controlplane))
        assert_completes(warm, key.key)
        for proxy in (warm, cold):
            assert eventually_status(f"{proxy.url}/readyz", 200).json()["controlplane"] is True

        stop(controlplane.process)

        unready = eventually_status(f"{cold.url}/readyz", 503)
        assert unready.json() == {
            "status": "unavailable",
            "controlplane": False,
            "cached_keys": 0,
            "spend_spool": {"writable": True, "full": False},
            "limits": "in-process",
        }
        health = httpx.get(f"{cold.url}/health", timeout=10)
        assert health.status_code == 503, health.text
        assert health.json()["status"] == "unavailable"

        # The warm proxy goes on serving the key it holds.
        ready = httpx.get(f"{warm.url}/readyz", timeout=5)
        assert ready.status_code == 200, ready.text
        assert ready.json()["cached_keys"] == 1
        assert_completes(warm, key.key)


def eventually_status(url: str, status: int, timeout: float = READY_TIMEOUT_S) -> httpx.Response:
    """GET `url` until it answers `status`; the last answer fails the test if it never does."""
    deadline = time.monotonic() + timeout
    while (response := httpx.get(url, timeout=5)).status_code != status:
        assert time.monotonic() < deadline, (
            f"{url} answered {response.status_code}: {response.text}"
        )
        time.sleep(0.05)  # waiting on another process to notice, bounded by the deadline
    return response

"""The change-feed poller against the real control plane: no event is lost to a late start."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from litestar import Litestar

from proxy.auth import AuthCache
from proxy.control import ControlPlaneClient, Unreachable
from proxy.errors import ProxyError
from proxy.feed import ChangeFeedPoller
from proxy.providers import HttpClient, Timeouts, registry
from tests.proxy.conftest import TappedTransport, Tenant
from tests.support.api import ADMIN
from tests.support.clock import ManualClock
from tests.support.env import INTERNAL_SECRET
from vkgate.errors import ErrorCode


@dataclass
class ProxyParts:
    """The parts of one proxy process that the feed touches, on a road that can be cut."""

    road: TappedTransport
    cache: AuthCache
    poller: ChangeFeedPoller


@pytest.fixture
async def proxy_parts(
    app: Litestar, client: httpx.AsyncClient, clock: ManualClock
) -> AsyncIterator[ProxyParts]:
    road = TappedTransport(httpx.ASGITransport(app=app))
    control = ControlPlaneClient("http://controlplane.test", INTERNAL_SECRET, clock, transport=road)
    providers = HttpClient(Timeouts(connect_s=2, read_s=10, total_s=30), user_agent="vkgate-test")
    cache = AuthCache(control, registry(providers, clock), clock)
    # timeout 0: each poll answers at once, so the test drives the feed step by step.
    yield ProxyParts(road, cache, ChangeFeedPoller(control, cache, timeout_s=0))
    await cache.close()
    await providers.close()
    await control.close()


async def test_key_cached_before_the_feed_first_answers_is_evicted_by_a_later_revocation(
    proxy_parts: ProxyParts, client: httpx.AsyncClient, tenant: Tenant
) -> None:
    # The proxy came up before the control plane (as under `vkgate up`): its first poll fails.
    proxy_parts.road.cut = True
    with pytest.raises(Unreachable):
        await proxy_parts.poller.poll_once()
    proxy_parts.road.cut = False

    # The control plane is back; a request caches the key before the feed's next attempt.
    await proxy_parts.cache.authenticate(tenant.key)
    revoked = await client.post(f"/api/admin/virtual-keys/{tenant.key_id}/revoke", headers=ADMIN)
    assert revoked.status_code == 200, revoked.text

    # The feed starts from the revision after the revocation, so it never sees that event.
    await proxy_parts.poller.poll_once()
    await proxy_parts.poller.poll_once()

    with pytest.raises(ProxyError) as refused:
        await proxy_parts.cache.authenticate(tenant.key)
    assert refused.value.code is ErrorCode.VIRTUAL_KEY_REVOKED

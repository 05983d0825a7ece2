"""Cloud credentials a proxy finds for itself: the AWS chain (environment variables, a web identity
token exchanged at STS) and Google's application default credentials; temporary ones refreshed
before they expire, in a thread, while requests go on with the ones they have."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from proxy.providers._refresh import FAILED_RETRY_S, Freshness, Loaded, Refreshing
from proxy.providers.base import ProviderUnreachable
from tests.proxy.cloud_support import BEDROCK, HELLO, VERTEX, Clouds, make_clouds
from tests.proxy.conftest import RunningProxy
from tests.support import fake_bedrock as FB
from tests.support.clock import ManualClock
from tests.support.fake_bedrock import FakeBedrock
from tests.support.fake_gemini import FakeGemini


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No AWS setting of the machine's: no config files, no instance metadata service."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return monkeypatch


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait (bounded) for a refresh running in a thread to be done."""
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def ask(clouds: Clouds, alias: str) -> None:
    async with clouds.openai() as sdk:
        reply = await sdk.chat.completions.create(model=alias, messages=HELLO)
    assert reply.choices[0].message.content


@pytest.fixture
async def workload_clouds(
    client: httpx.AsyncClient,
    proxy: RunningProxy,
    fake_bedrock: FakeBedrock,
    fake_gemini: FakeGemini,
) -> Clouds:
    return await make_clouds(client, proxy, fake_bedrock, fake_gemini, stored=False)


async def test_bedrock_without_stored_keys_signs_with_the_environments_keys(
    aws_env: pytest.MonkeyPatch, workload_clouds: Clouds
) -> None:
    aws_env.setenv("AWS_ACCESS_KEY_ID", FB.ACCESS_KEY_ID)
    aws_env.setenv("AWS_SECRET_ACCESS_KEY", FB.SECRET_ACCESS_KEY)
    await ask(workload_clouds, BEDROCK)
    assert workload_clouds.bedrock.signed_by == [FB.ACCESS_KEY_ID]


async def test_web_identity_credentials_come_from_sts_and_are_refreshed_before_they_expire(
    aws_env: pytest.MonkeyPatch, workload_clouds: Clouds, clock: ManualClock, tmp_path: Path
) -> None:
    fake = workload_clouds.bedrock
    fake.web_identity_token = "eyJhbGciOiJSUzI1NiJ9.fake-service-account-token.sig"
    fake.sts_lifetime_s = 300  # inside botocore's refresh window: each check brings new keys
    token_file = tmp_path / "token"
    token_file.write_text(fake.web_identity_token)
    aws_env.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token_file))
    aws_env.setenv("AWS_ROLE_ARN", FB.ROLE_ARN)
    aws_env.setenv("AWS_ENDPOINT_URL_STS", fake.sts_url)

    await ask(workload_clouds, BEDROCK)
    await ask(workload_clouds, BEDROCK)
    assert len(fake.issued) == 1, "the keys are reused, not fetched per request"
    first = fake.issued[0]
    assert fake.signed_by == [first, first]

    clock.elapse(Freshness().recheck_s + 1)
    await ask(workload_clouds, BEDROCK)  # due for a check: served at once, checked behind it
    assert fake.signed_by[-1] == first
    await until(lambda: len(fake.issued) == 2, "STS issued the next keys")
    fake.keys[first].expired = True
    await ask(workload_clouds, BEDROCK)
    assert fake.signed_by[-1] == fake.issued[1]

    clock.elapse(Freshness().max_age_s + 1)  # idle past the keys' usable age: a request waits
    fake.keys[fake.issued[1]].expired = True
    await ask(workload_clouds, BEDROCK)
    assert len(fake.issued) == 3 and fake.signed_by[-1] == fake.issued[2]


async def test_a_stored_service_accounts_token_is_refreshed_before_it_expires(
    client: httpx.AsyncClient,
    proxy: RunningProxy,
    fake_bedrock: FakeBedrock,
    fake_gemini: FakeGemini,
    clock: ManualClock,
) -> None:
    clouds = await make_clouds(client, proxy, fake_bedrock, fake_gemini)
    await ask(clouds, VERTEX)
    await ask(clouds, VERTEX)
    assert fake_gemini.grants == 1
    lifetime = fake_gemini.token_lifetime_s
    clock.elapse(lifetime - Freshness().early_s + 1)
    await ask(clouds, VERTEX)
    await until(lambda: fake_gemini.grants == 2, "a new token was granted")
    fake_gemini.expire_tokens(but_the_last=True)  # the first one is no good any more
    await ask(clouds, VERTEX)
    clock.elapse(lifetime)
    fake_gemini.expire_tokens()
    await ask(clouds, VERTEX)
    assert fake_gemini.grants == 3


async def test_vertex_without_a_stored_account_uses_the_application_default_credentials(
    monkeypatch: pytest.MonkeyPatch, workload_clouds: Clouds, tmp_path: Path
) -> None:
    key_file = tmp_path / "service-account.json"
    key_file.write_text(json.dumps(workload_clouds.gemini.service_account()))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key_file))
    await ask(workload_clouds, VERTEX)
    assert workload_clouds.gemini.grants == 1


# -- the refresh, by itself -----------------------------------------------------------------------


class Loader:
    def __init__(self) -> None:
        self.calls = 0
        self.fail = False

    def __call__(self) -> Loaded[str]:
        self.calls += 1
        if self.fail:
            raise RuntimeError("the token endpoint is down")
        return Loaded(f"token-{self.calls}", 3600.0)


async def test_concurrent_first_requests_share_one_load() -> None:
    loader = Loader()
    tokens = Refreshing(loader, ManualClock(), what="test token", provider_id="prov_1")
    got = await asyncio.gather(*(tokens.get() for _ in range(20)))
    assert set(got) == {"token-1"} and loader.calls == 1


async def test_a_failed_background_refresh_keeps_the_token_and_a_failed_first_load_is_named() -> (
    None
):
    clock, loader = ManualClock(), Loader()
    tokens = Refreshing(loader, clock, what="test token", provider_id="prov_1")
    assert await tokens.get() == "token-1"
    clock.elapse(3600 - Freshness().early_s + 1)
    loader.fail = True
    assert await tokens.get() == "token-1"
    await until(lambda: loader.calls == 2, "the refresh was tried")
    assert await tokens.get() == "token-1", "still usable: no second try at once"
    fresh = Refreshing(Loader(), clock, what="test token", provider_id="prov_2")
    broken = Refreshing(loader, clock, what="test token", provider_id="prov_3")
    assert await fresh.get() == "token-1"
    with pytest.raises(
        ProviderUnreachable, match=re.escape("no test token could be had (RuntimeError)")
    ):
        await broken.get()


async def test_a_failed_first_load_refuses_at_once_until_it_is_tried_again() -> None:
    clock, loader = ManualClock(), Loader()
    loader.fail = True
    tokens = Refreshing(loader, clock, what="test token", provider_id="prov_1")
    for _ in range(3):
        with pytest.raises(ProviderUnreachable):
            await tokens.get()
    assert loader.calls == 1, "refused at once, not loaded again per request"
    loader.fail = False
    clock.elapse(FAILED_RETRY_S + 0.1)
    assert await tokens.get() == "token-2"

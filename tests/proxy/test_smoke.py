"""The shortest path through the proxy: the OpenAI SDK, a key, a completion."""

from __future__ import annotations

from tests.proxy.conftest import CHAT_ALIAS, UPSTREAM_CHAT_MODEL, RunningProxy, Tenant
from tests.support.fake_openai import REPLY, FakeOpenAI


async def test_openai_sdk_gets_a_completion_through_the_proxy(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    client = proxy.openai(tenant.key)
    reply = await client.chat.completions.create(
        model=CHAT_ALIAS, messages=[{"role": "user", "content": "hello"}]
    )
    assert reply.choices[0].message.content == REPLY
    assert reply.model == UPSTREAM_CHAT_MODEL
    assert fake_openai.received[-1].json()["model"] == UPSTREAM_CHAT_MODEL
    await client.close()

"""The shortest path through the proxy: the OpenAI SDK, a key, a completion."""

from __future__ import annotations

import gc
from typing import Any

import openai
import pytest

from proxy.dispatch import Outcome
from proxy.gateway import Prepared
from proxy.spend.records import Ticket
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


async def test_a_request_leaves_nothing_for_the_garbage_collector(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    # A request's objects are freed as soon as it ends, not by the cycle collector: a cycle per
    # request made the collector run three times as often under load.
    client = proxy.openai(tenant.key)
    messages: Any = [{"role": "user", "content": "hello"}]
    await client.chat.completions.create(model=CHAT_ALIAS, messages=messages)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        await client.chat.completions.create(model=CHAT_ALIAS, messages=messages)
        stream = await client.chat.completions.create(
            model=CHAT_ALIAS, messages=messages, stream=True
        )
        assert [chunk async for chunk in stream]
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="no-such-model", messages=messages)
        stranger = proxy.openai("vk-not-a-key-of-this-gateway")
        with pytest.raises(openai.AuthenticationError):
            await stranger.chat.completions.create(model=CHAT_ALIAS, messages=messages)
        await stranger.close()
        gc.collect()
        left = [o for o in gc.garbage if isinstance(o, Outcome | Ticket | Prepared)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    await client.close()
    assert left == []

"""The official `anthropic` and `openai` SDKs through the proxy, to an Anthropic provider and to
an OpenAI-format one: plain, streaming and tool use, with errors in the client's own format."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.proxy.conftest import RunningProxy, Tenant, add_key, add_policy, add_provider
from tests.support import fake_anthropic as FA
from tests.support import fake_openai as FO
from tests.support.api import create
from tests.support.fake_anthropic import FakeAnthropic
from tests.support.fake_openai import FakeOpenAI

CLAUDE = "claude"
"""An alias routed to the Anthropic provider."""
GPT = "gpt"
"""An alias routed to the OpenAI-format provider."""
AZURE = "azure"
EITHER = "either"
"""An alias whose chain is the Anthropic provider, then the OpenAI-format one."""
CLAUDE_MODEL = "claude-sonnet-4-5"
GPT_MODEL = "gpt-4o-mini-2024-07-18"
HELLO: Any = [{"role": "user", "content": "hello"}]
OPENAI_STREAMED = "Hi there!"
"""What the fake OpenAI provider streams (its plain answer is longer)."""
WEATHER_TOOL_ANTHROPIC: Any = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
WEATHER_TOOL_OPENAI: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@dataclass
class Both:
    proxy: RunningProxy
    key: str
    claude: FakeAnthropic
    gpt: FakeOpenAI

    def anthropic(self) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(
            base_url=self.proxy.url.removesuffix("/v1"), api_key=self.key, max_retries=0, timeout=10
        )

    def openai(self) -> openai.AsyncOpenAI:
        return self.proxy.openai(self.key)


@pytest.fixture
async def both(
    client: httpx.AsyncClient,
    proxy: RunningProxy,
    fake_anthropic: FakeAnthropic,
    fake_openai: FakeOpenAI,
) -> AsyncIterator[Both]:
    org = (await create(client, "/api/admin/organizations", {"name": "formats"}))["id"]
    project = (await create(client, "/api/admin/projects", {"organization_id": org, "name": "p"}))[
        "id"
    ]
    claude = await add_provider(
        client, org, "claude", fake_anthropic.url, fake_anthropic.api_key, kind="anthropic"
    )
    gpt = await add_provider(client, org, "gpt", fake_openai.url, fake_openai.api_key)
    azure = await add_provider(
        client,
        org,
        "azure",
        fake_openai.azure_endpoint,
        fake_openai.api_key,
        kind="azure_openai",
        api_version="2024-10-21",
    )
    policy = await add_policy(
        client,
        org,
        {
            CLAUDE: [(claude, CLAUDE_MODEL)],
            GPT: [(gpt, GPT_MODEL)],
            AZURE: [(azure, "prod-4o")],
            EITHER: [(claude, CLAUDE_MODEL), (gpt, GPT_MODEL)],
        },
    )
    tenant = Tenant(org, project, claude, policy, "", "")
    _, key = await add_key(client, tenant)
    yield Both(proxy, key, fake_anthropic, fake_openai)


# -- the Anthropic SDK ---------------------------------------------------------------------------


async def test_anthropic_sdk_to_an_anthropic_provider_passes_the_body_through(both: Both) -> None:
    async with both.anthropic() as sdk:
        message = await sdk.messages.create(model=CLAUDE, max_tokens=64, messages=HELLO)
    assert message.content[0].type == "text" and message.content[0].text == FA.REPLY
    assert message.usage.input_tokens == both.claude.input_tokens
    assert message.usage.output_tokens == both.claude.output_tokens
    sent = both.claude.received[-1]
    assert sent.json() == {"model": CLAUDE_MODEL, "max_tokens": 64, "messages": HELLO}
    assert sent.header("x-api-key") == both.claude.api_key
    assert sent.header("anthropic-version"), "the client's API version travels with its body"


async def test_anthropic_sdk_streams_from_an_anthropic_provider(both: Both) -> None:
    async with (
        both.anthropic() as sdk,
        sdk.messages.stream(model=CLAUDE, max_tokens=64, messages=HELLO) as stream,
    ):
        text = "".join([piece async for piece in stream.text_stream])
        final = await stream.get_final_message()
    assert text == FA.REPLY
    assert final.usage.output_tokens == both.claude.output_tokens
    assert final.stop_reason == "end_turn"


async def test_anthropic_sdk_tool_use_with_an_anthropic_provider(both: Both) -> None:
    async with both.anthropic() as sdk:
        first = await sdk.messages.create(
            model=CLAUDE, max_tokens=64, messages=HELLO, tools=[WEATHER_TOOL_ANTHROPIC]
        )
        call = next(block for block in first.content if block.type == "tool_use")
        assert first.stop_reason == "tool_use"
        assert call.input == FA.TOOL_INPUT
        second = await sdk.messages.create(
            model=CLAUDE,
            max_tokens=64,
            tools=[WEATHER_TOOL_ANTHROPIC],
            messages=[
                *HELLO,
                {"role": "assistant", "content": [block.model_dump() for block in first.content]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}
                    ],
                },
            ],
        )
    assert second.content[0].type == "text"


async def test_anthropic_sdk_to_an_openai_format_provider(both: Both) -> None:
    async with both.anthropic() as sdk:
        message = await sdk.messages.create(
            model=GPT, max_tokens=64, system="be brief", messages=HELLO
        )
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "text" and message.content[0].text == FO.REPLY
    assert message.stop_reason == "end_turn"
    assert message.model == GPT_MODEL
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    sent = both.gpt.received[-1].json()
    assert sent["model"] == GPT_MODEL
    assert sent["messages"][0] == {"role": "system", "content": "be brief"}
    assert sent["max_tokens"] == 64


async def test_anthropic_sdk_streams_from_an_openai_format_provider(both: Both) -> None:
    async with (
        both.anthropic() as sdk,
        sdk.messages.stream(model=GPT, max_tokens=64, messages=HELLO) as stream,
    ):
        text = "".join([piece async for piece in stream.text_stream])
        final = await stream.get_final_message()
    assert text == OPENAI_STREAMED
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens > 0
    sent = both.gpt.received[-1].json()
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


async def test_anthropic_sdk_tool_use_with_an_openai_format_provider(both: Both) -> None:
    async with both.anthropic() as sdk:
        message = await sdk.messages.create(
            model=GPT, max_tokens=64, messages=HELLO, tools=[WEATHER_TOOL_ANTHROPIC]
        )
        call = next(block for block in message.content if block.type == "tool_use")
        assert message.stop_reason == "tool_use"
        assert call.name == "get_weather" and call.input == {"city": "Paris"}
        async with sdk.messages.stream(
            model=GPT, max_tokens=64, messages=HELLO, tools=[WEATHER_TOOL_ANTHROPIC]
        ) as stream:
            final = await stream.get_final_message()
    streamed = next(block for block in final.content if block.type == "tool_use")
    assert streamed.input == {"city": "Paris"}
    sent = both.gpt.received[-1].json()
    assert sent["tools"][0]["function"]["name"] == "get_weather"


async def test_anthropic_sdk_gets_errors_in_anthropics_shape(both: Both) -> None:
    async with anthropic.AsyncAnthropic(
        base_url=both.proxy.url.removesuffix("/v1"), api_key="vk-nope", max_retries=0
    ) as sdk:
        with pytest.raises(anthropic.AuthenticationError) as refused:
            await sdk.messages.create(model=CLAUDE, max_tokens=8, messages=HELLO)
    body = refused.value.response.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == "authentication_error"
    assert body["error"]["code"] == "invalid_api_key"


async def test_an_openai_format_providers_error_reaches_an_anthropic_client_translated(
    both: Both,
) -> None:
    both.gpt.fail_next(400, "bad request upstream")
    async with both.anthropic() as sdk:
        with pytest.raises(anthropic.BadRequestError) as refused:
            await sdk.messages.create(model=GPT, max_tokens=8, messages=HELLO)
    body = refused.value.response.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "bad request upstream" in body["error"]["message"]


async def test_a_field_openai_cannot_take_is_refused_by_name(both: Both) -> None:
    async with both.anthropic() as sdk:
        with pytest.raises(anthropic.BadRequestError) as refused:
            await sdk.messages.create(
                model=GPT, max_tokens=8, messages=HELLO, extra_body={"top_k": 5}
            )
    assert "top_k" in refused.value.response.json()["error"]["message"]
    assert both.gpt.received == []


# -- the OpenAI SDK to an Anthropic provider -----------------------------------------------------


async def test_openai_sdk_to_an_anthropic_provider(both: Both) -> None:
    async with both.openai() as sdk:
        reply = await sdk.chat.completions.create(
            model=CLAUDE,
            messages=[{"role": "system", "content": "be brief"}, *HELLO],
            max_tokens=64,
        )
    assert reply.choices[0].message.content == FA.REPLY
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model == CLAUDE_MODEL
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == both.claude.input_tokens
    assert reply.usage.completion_tokens == both.claude.output_tokens
    sent = both.claude.received[-1].json()
    assert sent["system"] == "be brief"
    assert sent["messages"] == HELLO
    assert sent["max_tokens"] == 64


async def test_openai_sdk_streams_from_an_anthropic_provider(both: Both) -> None:
    async with both.openai() as sdk:
        stream = await sdk.chat.completions.create(
            model=CLAUDE, messages=HELLO, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == FA.REPLY
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop"
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == both.claude.output_tokens


async def test_openai_sdk_tool_calls_with_an_anthropic_provider(both: Both) -> None:
    async with both.openai() as sdk:
        reply = await sdk.chat.completions.create(
            model=CLAUDE, messages=HELLO, tools=[WEATHER_TOOL_OPENAI]
        )
        call = reply.choices[0].message.tool_calls[0]  # type: ignore[index]
        assert reply.choices[0].finish_reason == "tool_calls"
        assert call.function.name == "get_weather"
        assert (
            call.function.arguments
            and __import__("json").loads(call.function.arguments) == FA.TOOL_INPUT
        )
        stream = await sdk.chat.completions.create(
            model=CLAUDE, messages=HELLO, tools=[WEATHER_TOOL_OPENAI], stream=True
        )
        arguments = ""
        async for chunk in stream:
            for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                arguments += delta.function.arguments or "" if delta.function else ""
        assert __import__("json").loads(arguments) == FA.TOOL_INPUT
        follow_up = await sdk.chat.completions.create(
            model=CLAUDE,
            tools=[WEATHER_TOOL_OPENAI],
            messages=[
                *HELLO,
                reply.choices[0].message.model_dump(exclude_none=True),  # type: ignore[list-item]
                {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
            ],
        )
    assert follow_up.choices[0].message.content == FA.REPLY
    last = both.claude.received[-1].json()["messages"][-1]
    assert last["role"] == "user"
    assert last["content"][0]["type"] == "tool_result"
    assert last["content"][0]["tool_use_id"] == call.id


async def test_an_anthropic_providers_error_reaches_an_openai_client_translated(
    both: Both,
) -> None:
    both.claude.fail_next(400, "messages: roles must alternate")
    async with both.openai() as sdk:
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.chat.completions.create(model=CLAUDE, messages=HELLO)
    error = refused.value.response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "roles must alternate" in error["message"]


async def test_a_field_anthropic_cannot_take_is_refused_by_name(both: Both) -> None:
    async with both.openai() as sdk:
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.chat.completions.create(model=CLAUDE, messages=HELLO, n=2)
    assert refused.value.response.json()["error"]["param"] == "n"
    assert both.claude.received == []


async def test_embeddings_skip_a_credential_that_cannot_embed(both: Both) -> None:
    async with both.openai() as sdk:
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.embeddings.create(model=CLAUDE, input="hello")
    error = refused.value.response.json()["error"]
    assert error["attempts"][0]["code"] == "unsupported_operation"
    assert both.claude.received == []


# -- Azure ---------------------------------------------------------------------------------------


async def test_openai_sdk_through_an_azure_deployment(both: Both) -> None:
    async with both.openai() as sdk:
        reply = await sdk.chat.completions.create(model=AZURE, messages=HELLO)
        stream = await sdk.chat.completions.create(model=AZURE, messages=HELLO, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert reply.choices[0].message.content == FO.REPLY
    assert text == OPENAI_STREAMED
    sent = both.gpt.received[-1]
    assert sent.path == "/openai/deployments/prod-4o/chat/completions"
    assert sent.query["api-version"] == "2024-10-21"
    assert sent.header("api-key") == both.gpt.api_key
    assert sent.header("authorization") is None


async def test_a_request_the_first_credential_cannot_take_goes_to_one_that_can(
    both: Both,
) -> None:
    async with both.openai() as sdk:
        reply = await sdk.chat.completions.with_raw_response.create(
            model=EITHER, messages=HELLO, n=2
        )
    assert reply.status_code == 200
    assert reply.headers["x-vkgate-provider"] == "gpt"
    assert reply.headers["x-vkgate-fallback-count"] == "1"
    assert both.claude.received == []

"""The official OpenAI SDK against the proxy: each call an application makes, what it gets back,
and what the provider receives (the client's bytes, with only `model` changed)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai

from tests.proxy.conftest import (
    CHAT_ALIAS,
    EMBEDDING_ALIAS,
    UPSTREAM_CHAT_MODEL,
    UPSTREAM_EMBEDDING_MODEL,
    RunningProxy,
    Tenant,
    add_key,
)
from tests.support.fake_openai import API_KEY, REPLY, FakeOpenAI

HELLO: Any = [{"role": "user", "content": "hello"}]
WEATHER_TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "e.g. Paris"}},
                "required": ["city"],
                "additionalProperties": False,
            },
            "strict": True,
        },
    }
]
# A 1x1 transparent PNG.
PIXEL = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="


def recording_client(proxy: RunningProxy, key: str) -> tuple[openai.AsyncOpenAI, list[bytes]]:
    """An SDK client that also keeps each request body exactly as it left the client."""
    sent: list[bytes] = []

    async def keep(request: httpx.Request) -> None:
        sent.append(request.content)

    http = httpx.AsyncClient(timeout=10, event_hooks={"request": [keep]})
    client = openai.AsyncOpenAI(base_url=proxy.url, api_key=key, max_retries=0, http_client=http)
    return client, sent


def assert_passed_through(sent: bytes, received: bytes, requested: str, upstream: str) -> None:
    """The provider got the client's body with only the top-level `model` changed."""
    client_document, provider_document = json.loads(sent), json.loads(received)
    assert client_document.pop("model") == requested
    assert provider_document.pop("model") == upstream
    assert provider_document == client_document
    # And byte for byte: the SDK writes compact JSON, so the model is one exact run of bytes.
    before = b'"model":' + json.dumps(requested).encode()
    assert sent.count(before) == 1
    assert received == sent.replace(before, b'"model":' + json.dumps(upstream).encode())


async def test_async_client_gets_the_providers_completion_and_usage(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    async with proxy.openai(tenant.key) as client:
        reply = await client.chat.completions.create(model=CHAT_ALIAS, messages=HELLO)
    assert reply.choices[0].message.content == REPLY
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model == UPSTREAM_CHAT_MODEL
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (11, 7)
    assert reply._request_id  # the SDK reads it from X-Request-ID
    [received] = fake_openai.received
    assert received.path == "/v1/chat/completions"
    # The provider sees the provider's credential, never the virtual key.
    assert received.header("Authorization") == f"Bearer {API_KEY}"
    assert tenant.key not in json.dumps(received.headers)
    assert tenant.key.encode() not in received.body


async def test_sync_client_gets_a_completion_and_a_stream(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    client = proxy.openai_sync(tenant.key)

    def stream_text() -> str:
        with client.chat.completions.create(
            model=CHAT_ALIAS, messages=HELLO, stream=True
        ) as stream:
            return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    try:
        reply = await asyncio.to_thread(
            client.chat.completions.create, model=CHAT_ALIAS, messages=HELLO
        )
        streamed = await asyncio.to_thread(stream_text)
    finally:
        await asyncio.to_thread(client.close)
    assert reply.choices[0].message.content == REPLY
    assert reply.model == UPSTREAM_CHAT_MODEL
    assert streamed == "Hi there!"
    assert len(fake_openai.received) == 2


async def test_stream_hides_the_usage_chunk_the_client_did_not_ask_for(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    async with proxy.openai(tenant.key) as client:
        stream = await client.chat.completions.create(model=CHAT_ALIAS, messages=HELLO, stream=True)
        chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hi there!"
    assert len(chunks) == 5  # role, three words, finish
    assert all(chunk.choices and chunk.usage is None for chunk in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert {chunk.model for chunk in chunks} == {UPSTREAM_CHAT_MODEL}
    upstream = fake_openai.received[-1].json()
    assert upstream["stream"] is True
    assert upstream["stream_options"] == {"include_usage": True}


async def test_stream_with_include_usage_false_is_still_metered_and_stripped(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    async with proxy.openai(tenant.key) as client:
        stream = await client.chat.completions.create(
            model=CHAT_ALIAS,
            messages=HELLO,
            stream=True,
            stream_options={"include_usage": False},
        )
        chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hi there!"
    assert all(chunk.choices and chunk.usage is None for chunk in chunks)
    assert fake_openai.received[-1].json()["stream_options"] == {"include_usage": True}


async def test_stream_gives_the_usage_chunk_to_a_client_that_asked(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    client, sent = recording_client(proxy, tenant.key)
    async with client:
        stream = await client.chat.completions.create(
            model=CHAT_ALIAS,
            messages=HELLO,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hi there!"
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (11, 4)
    assert_passed_through(sent[-1], fake_openai.received[-1].body, CHAT_ALIAS, UPSTREAM_CHAT_MODEL)


async def test_tool_calls_come_back_and_tools_reach_the_provider_byte_identical(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    client, sent = recording_client(proxy, tenant.key)
    async with client:
        reply = await client.chat.completions.create(
            model=CHAT_ALIAS,
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=WEATHER_TOOLS,
            tool_choice="auto",
            parallel_tool_calls=False,
        )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    [call] = choice.message.tool_calls
    assert call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert fake_openai.received[-1].json()["tools"] == WEATHER_TOOLS
    assert_passed_through(sent[-1], fake_openai.received[-1].body, CHAT_ALIAS, UPSTREAM_CHAT_MODEL)


async def test_streamed_tool_call_reaches_the_client(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    async with proxy.openai(tenant.key) as client:
        stream = await client.chat.completions.create(
            model=CHAT_ALIAS, messages=HELLO, tools=WEATHER_TOOLS, stream=True
        )
        chunks = [chunk async for chunk in stream]
    calls = [call for c in chunks for call in (c.choices[0].delta.tool_calls or [])]
    assert [call.function.name for call in calls if call.function] == ["get_weather"]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert fake_openai.received[-1].json()["tools"] == WEATHER_TOOLS


async def test_tool_result_turn_reaches_the_provider_untouched(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    client, sent = recording_client(proxy, tenant.key)
    async with client:
        reply = await client.chat.completions.create(
            model=CHAT_ALIAS,
            messages=[
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 18}'},
            ],
            tools=WEATHER_TOOLS,
            tool_choice="none",
        )
    assert reply.choices[0].message.content == REPLY
    assert_passed_through(sent[-1], fake_openai.received[-1].body, CHAT_ALIAS, UPSTREAM_CHAT_MODEL)


async def test_images_and_json_mode_pass_through_untouched(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    client, sent = recording_client(proxy, tenant.key)
    async with client:
        reply = await client.chat.completions.create(
            model=CHAT_ALIAS,
            messages=[
                {"role": "system", "content": "Answer in JSON."},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Qu'y a-t-il sur l'image ? 🌍"},
                        {"type": "image_url", "image_url": {"url": PIXEL, "detail": "low"}},
                    ],
                },
            ],
            response_format={"type": "json_object"},
        )
    assert reply.choices[0].message.content == REPLY
    upstream = fake_openai.received[-1].json()
    assert upstream["messages"][1]["content"][1]["image_url"] == {"url": PIXEL, "detail": "low"}
    assert upstream["response_format"] == {"type": "json_object"}
    assert_passed_through(sent[-1], fake_openai.received[-1].body, CHAT_ALIAS, UPSTREAM_CHAT_MODEL)


async def test_json_schema_sampling_options_and_unknown_fields_pass_through(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    schema: Any = {
        "type": "json_schema",
        "json_schema": {
            "name": "answer",
            "strict": True,
            # A nested "model" key must not be mistaken for the request's own.
            "schema": {
                "type": "object",
                "properties": {"model": {"type": "string"}},
                "required": ["model"],
                "additionalProperties": False,
            },
        },
    }
    client, sent = recording_client(proxy, tenant.key)
    async with client:
        await client.chat.completions.create(
            model=CHAT_ALIAS,
            messages=HELLO,
            response_format=schema,
            temperature=0.2,
            seed=7,
            max_completion_tokens=64,
            user="end-user-42",
            extra_body={"vendor_option": {"beam": [1, 2, 3]}},
        )
    client_document = json.loads(sent[-1])
    upstream = fake_openai.received[-1].json()
    assert upstream["model"] == UPSTREAM_CHAT_MODEL
    assert upstream["response_format"] == schema
    assert {k: v for k, v in upstream.items() if k != "model"} == {
        k: v for k, v in client_document.items() if k != "model"
    }
    assert upstream["vendor_option"] == {"beam": [1, 2, 3]}


async def test_float_embeddings_come_back_and_the_body_passes_through(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    client, sent = recording_client(proxy, tenant.key)
    async with client:
        reply = await client.embeddings.create(
            model=EMBEDDING_ALIAS,
            input=["first", "second"],
            encoding_format="float",
            dimensions=3,
        )
    assert [item.embedding for item in reply.data] == [[0.25, -0.5, 0.125], [0.5, -0.5, 0.125]]
    assert reply.model == UPSTREAM_EMBEDDING_MODEL
    assert reply.usage.prompt_tokens == 8
    received = fake_openai.received[-1]
    assert received.path == "/v1/embeddings"
    assert received.json()["encoding_format"] == "float"
    assert_passed_through(sent[-1], received.body, EMBEDDING_ALIAS, UPSTREAM_EMBEDDING_MODEL)


async def test_base64_embeddings_the_sdk_asks_for_by_default_decode_to_floats(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    async with proxy.openai(tenant.key) as client:
        reply = await client.embeddings.create(model=EMBEDDING_ALIAS, input="just one")
    assert fake_openai.received[-1].json()["encoding_format"] == "base64"
    assert [list(item.embedding) for item in reply.data] == [[0.25, -0.5, 0.125]]
    assert reply.model == UPSTREAM_EMBEDDING_MODEL


async def test_model_list_is_exactly_the_keys_aliases(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    async with proxy.openai(tenant.key) as client:
        page = await client.models.list()
    assert sorted(model.id for model in page.data) == [CHAT_ALIAS, EMBEDDING_ALIAS]
    assert {model.object for model in page.data} == {"model"}
    assert fake_openai.received == []  # answered by the proxy, not the provider


async def test_model_list_of_a_key_with_allowed_models_is_only_those(
    proxy: RunningProxy, tenant: Tenant, client: httpx.AsyncClient
) -> None:
    _, key = await add_key(client, tenant, allowed_models=[EMBEDDING_ALIAS])
    async with proxy.openai(key) as sdk:
        page = await sdk.models.list()
        embedded = await sdk.embeddings.create(model=EMBEDDING_ALIAS, input="x")
    assert [model.id for model in page.data] == [EMBEDDING_ALIAS]
    assert embedded.model == UPSTREAM_EMBEDDING_MODEL

"""The official OpenAI SDK's Responses API against the proxy, to providers without it: Anthropic,
an OpenAI-compatible server that serves only chat completions, and the built-in `mock`. Each is
translated both ways, plain and streamed; nothing is stored, and the ids say so."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from litestar import Litestar

from proxy.providers.mock import REPLY as MOCK_REPLY
from tests.proxy.conftest import (
    RunningProxy,
    Tenant,
    add_key,
    add_policy,
    add_provider,
    openai_error,
    proxy_settings,
    serve_proxy,
)
from tests.proxy.test_responses import WEATHER_FORMAT, WEATHER_TOOL
from tests.support.api import create
from tests.support.clock import ManualClock
from tests.support.fake_anthropic import (
    JSON_REPLY,
    MESSAGE_ID,
    REPLY_PIECES,
    TOOL_INPUT,
    TOOL_USE_ID,
    FakeAnthropic,
)
from tests.support.fake_anthropic import REPLY as CLAUDE_REPLY
from tests.support.fake_openai import REPLY as CHAT_REPLY
from tests.support.fake_openai import FakeOpenAI

CLAUDE = "claude"
CLAUDE_MODEL = "claude-sonnet-4-5-20250929"
COMPAT = "compat"
COMPAT_MODEL = "llama-3.1-8b"
DEMO = "demo"


@dataclass
class Translated:
    proxy: RunningProxy
    tenant: Tenant


@pytest.fixture
async def translated(
    client: httpx.AsyncClient,
    app: Litestar,
    clock: ManualClock,
    fake_openai: FakeOpenAI,
    fake_anthropic: FakeAnthropic,
) -> AsyncIterator[Translated]:
    org = (await create(client, "/api/admin/organizations", {"name": "translated"}))["id"]
    project = (await create(client, "/api/admin/projects", {"organization_id": org, "name": "p"}))[
        "id"
    ]
    claude = await add_provider(
        client, org, "claude", fake_anthropic.url, fake_anthropic.api_key, kind="anthropic"
    )
    compat = await add_provider(
        client, org, "vllm", fake_openai.url, fake_openai.api_key, responses_api=False
    )
    mock = (
        await create(
            client,
            "/api/admin/providers",
            {"organization_id": org, "name": "mock", "kind": "mock"},
        )
    )["id"]
    policy = await add_policy(
        client,
        org,
        {
            CLAUDE: [(claude, CLAUDE_MODEL)],
            COMPAT: [(compat, COMPAT_MODEL)],
            DEMO: [(mock, "mock-small")],
        },
    )
    tenant = Tenant(org, project, claude, policy, "", "")
    tenant.key_id, tenant.key = await add_key(client, tenant)
    async with serve_proxy(app, clock, proxy_settings()) as proxy:
        yield Translated(proxy, tenant)


async def test_anthropic_answers_a_plain_response_translated_both_ways(
    translated: Translated, fake_anthropic: FakeAnthropic
) -> None:
    async with translated.proxy.openai(translated.tenant.key) as client:
        response = await client.responses.create(
            model=CLAUDE,
            instructions="Be brief.",
            input=[{"role": "user", "content": [{"type": "input_text", "text": "hello"}]}],
            max_output_tokens=128,
            temperature=0.5,
            metadata={"ticket": "42"},
        )
    assert response.output_text == CLAUDE_REPLY
    assert response.model == CLAUDE_MODEL
    assert response.status == "completed"
    assert response.store is False  # a translated response is not stored
    assert response.metadata == {"ticket": "42"}
    assert response.id.startswith("resp_") and MESSAGE_ID not in response.id
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (11, 7)
    sent = fake_anthropic.received[-1].json()
    assert sent == {
        "model": CLAUDE_MODEL,
        "max_tokens": 128,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
        "temperature": 0.5,
    }


async def test_anthropic_stream_arrives_as_typed_events_with_one_id(
    translated: Translated,
) -> None:
    async with translated.proxy.openai(translated.tenant.key) as client:
        stream = await client.responses.create(model=CLAUDE, input="hello", stream=True)
        events = [event async for event in stream]
    kinds = [event.type for event in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(REPLY_PIECES),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    ids = {event.response.id for event in events if hasattr(event, "response")}
    assert len(ids) == 1
    item_ids = {event.item_id for event in events if hasattr(event, "item_id")}
    assert len(item_ids) == 1
    completed = events[-1].response  # type: ignore[union-attr]
    assert completed.output_text == CLAUDE_REPLY
    assert completed.usage is not None and completed.usage.output_tokens == 7


async def test_anthropic_calls_a_function_and_takes_its_result(
    translated: Translated, fake_anthropic: FakeAnthropic
) -> None:
    async with translated.proxy.openai(translated.tenant.key) as client:
        first = await client.responses.create(
            model=CLAUDE, input="Weather in Paris?", tools=[WEATHER_TOOL], tool_choice="required"
        )
        [call] = first.output
        assert call.type == "function_call"
        assert call.call_id == TOOL_USE_ID
        assert json.loads(call.arguments) == TOOL_INPUT
        history: Any = [
            {"role": "user", "content": "Weather in Paris?"},
            call.model_dump(exclude_unset=True),
        ]
        second = await client.responses.create(
            model=CLAUDE,
            input=[
                *history,
                {"type": "function_call_output", "call_id": call.call_id, "output": "21 C"},
            ],
            tools=[WEATHER_TOOL],
        )
    assert second.output_text == CLAUDE_REPLY
    first_sent, second_sent = (r.json() for r in fake_anthropic.received)
    assert first_sent["tool_choice"] == {"type": "any"}
    assert first_sent["tools"] == [
        {
            "name": "get_weather",
            "description": "Current weather for a city",
            "input_schema": WEATHER_TOOL["parameters"],
            "strict": True,
        }
    ]
    assert second_sent["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": TOOL_USE_ID, "name": "get_weather", "input": TOOL_INPUT}
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": TOOL_USE_ID, "content": "21 C"}],
        },
    ]


async def test_anthropic_streams_a_function_call_with_argument_deltas(
    translated: Translated,
) -> None:
    async with translated.proxy.openai(translated.tenant.key) as client:
        stream = await client.responses.create(
            model=CLAUDE, input="Weather?", tools=[WEATHER_TOOL], stream=True
        )
        events = [event async for event in stream]
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert json.loads("".join(deltas)) == TOOL_INPUT
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads(done.arguments) == TOOL_INPUT and done.name == "get_weather"
    [call] = events[-1].response.output  # type: ignore[union-attr]
    assert call.type == "function_call" and call.call_id == TOOL_USE_ID


async def test_a_json_schema_output_becomes_anthropics_structured_output(
    translated: Translated, fake_anthropic: FakeAnthropic
) -> None:
    async with translated.proxy.openai(translated.tenant.key) as client:
        response = await client.responses.create(
            model=CLAUDE, input="Weather in Paris?", text=WEATHER_FORMAT
        )
    assert json.loads(response.output_text) == json.loads(JSON_REPLY)
    assert response.text is not None and response.text.format is not None
    assert response.text.format.type == "json_schema"
    sent = fake_anthropic.received[-1].json()
    assert sent["output_config"] == {
        "format": {"type": "json_schema", "schema": WEATHER_FORMAT["format"]["schema"]}
    }


async def test_nothing_translated_is_stored_and_the_gateway_says_so(
    translated: Translated, fake_anthropic: FakeAnthropic
) -> None:
    key = translated.tenant.key
    async with translated.proxy.openai(key) as client:
        response = await client.responses.create(model=CLAUDE, input="hello")
    calls = len(fake_anthropic.received)
    async with translated.proxy.http() as http:
        auth = {"Authorization": f"Bearer {key}"}
        got = await http.get(f"/v1/responses/{response.id}", headers=auth)
        error = openai_error(got, 404, "not_found", param="response_id")
        assert "not stored" in error["message"]
        continued = await http.post(
            "/v1/responses",
            headers=auth,
            json={"model": CLAUDE, "input": "more", "previous_response_id": response.id},
        )
        error = openai_error(continued, 400, "invalid_request", param="previous_response_id")
        assert "not stored" in error["message"]
        stored = await http.post(
            "/v1/responses", headers=auth, json={"model": CLAUDE, "input": "x", "store": True}
        )
        openai_error(stored, 400, "invalid_request", param="store")
    assert len(fake_anthropic.received) == calls


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        (
            {"tools": [WEATHER_TOOL, {"type": "file_search", "vector_store_ids": ["vs"]}]},
            "tools[1].type",
        ),
        ({"text": {"format": {"type": "json_object"}}}, "text.format"),
        ({"include": ["message.output_text.logprobs"]}, "include[0]"),
        ({"truncation": "auto"}, "truncation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"temperature": 1.5}, "temperature"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        ({"frobnicate": True}, "frobnicate"),
    ],
)
async def test_a_field_with_no_anthropic_equivalent_is_refused_naming_it(
    translated: Translated, fake_anthropic: FakeAnthropic, fields: dict[str, Any], param: str
) -> None:
    async with translated.proxy.http() as http:
        answer = await http.post(
            "/v1/responses",
            headers={"Authorization": f"Bearer {translated.tenant.key}"},
            json={"model": CLAUDE, "input": "hello", **fields},
        )
    openai_error(answer, 400, "invalid_request", param=param)
    assert fake_anthropic.received == []


async def test_anthropic_errors_come_back_in_openais_shape(
    translated: Translated, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.fail_next(400, "messages: roles must alternate")
    async with translated.proxy.openai(translated.tenant.key) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(model=CLAUDE, input="hello")
    assert caught.value.body == {
        "message": "messages: roles must alternate",
        "type": "invalid_request_error",
        "code": "invalid_request_error",
        "param": None,
    }


async def test_a_chat_only_provider_answers_plain_streamed_and_with_tools(
    translated: Translated, fake_openai: FakeOpenAI
) -> None:
    async with translated.proxy.openai(translated.tenant.key) as client:
        plain = await client.responses.create(
            model=COMPAT, input="hello", instructions="Be brief.", max_output_tokens=50
        )
        stream = await client.responses.create(model=COMPAT, input="hello", stream=True)
        events = [event async for event in stream]
        called = await client.responses.create(
            model=COMPAT, input="Weather?", tools=[WEATHER_TOOL], text={"verbosity": "low"}
        )
    assert plain.output_text == CHAT_REPLY
    assert plain.usage is not None and plain.usage.input_tokens == 11
    assert [r.path for r in fake_openai.received] == ["/v1/chat/completions"] * 3
    first, streamed, with_tools = (r.json() for r in fake_openai.received)
    assert first == {
        "model": COMPAT_MODEL,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hello"},
        ],
        "max_tokens": 50,
    }
    assert streamed["stream"] is True and streamed["stream_options"] == {"include_usage": True}
    completed = events[-1]
    assert completed.type == "response.completed"
    assert completed.response.output_text == "Hi there!"
    assert completed.response.usage is not None and completed.response.usage.output_tokens == 4
    assert with_tools["tools"][0]["function"]["name"] == "get_weather"
    assert with_tools["verbosity"] == "low"
    [call] = called.output
    assert call.type == "function_call" and call.name == "get_weather"


async def test_the_mock_provider_serves_the_responses_api(translated: Translated) -> None:
    async with translated.proxy.openai(translated.tenant.key) as client:
        plain = await client.responses.create(model=DEMO, input="hello")
        stream = await client.responses.create(model=DEMO, input="hello", stream=True)
        events = [event async for event in stream]
    assert plain.output_text == MOCK_REPLY
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == MOCK_REPLY  # type: ignore[union-attr]
    assert plain.usage is not None and plain.usage.output_tokens > 0

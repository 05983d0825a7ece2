"""The official OpenAI SDK's Responses API against the proxy, to a provider that serves it: the
client's bytes go through with only `model` changed, and every id the client sees is sealed."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.proxy.conftest import (
    CHAT_ALIAS,
    UPSTREAM_CHAT_MODEL,
    RunningProxy,
    Tenant,
    add_key,
    add_policy,
    add_provider,
    make_tenant,
    openai_error,
)
from tests.proxy.test_limits import budget
from tests.proxy.test_limits import priced as priced  # the fixture
from tests.proxy.test_openai_sdk import assert_passed_through, recording_client
from tests.proxy.test_telemetry import value
from tests.support.fake_openai import (
    JSON_REPLY,
    REPLY,
    TOOL_ARGUMENTS,
    FakeOpenAI,
)

WEATHER_TOOL: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
WEATHER_FORMAT: Any = {
    "format": {
        "type": "json_schema",
        "name": "weather",
        "schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "temperature_c": {"type": "number"}},
            "required": ["city", "temperature_c"],
            "additionalProperties": False,
        },
        "strict": True,
    }
}


def upstream_ids(fake: FakeOpenAI) -> list[str]:
    return list(fake.responses)


async def test_a_plain_response_passes_through_with_its_id_sealed(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    client, sent = recording_client(proxy, tenant.key)
    async with client:
        response = await client.responses.create(
            model=CHAT_ALIAS, input="hello", instructions="Be brief.", max_output_tokens=64
        )
    assert response.output_text == REPLY
    assert response.model == UPSTREAM_CHAT_MODEL
    assert response.status == "completed"
    assert response.usage is not None
    assert response.usage.input_tokens_details.cached_tokens == 5
    assert response.usage.output_tokens_details.reasoning_tokens == 2
    [upstream_id] = upstream_ids(fake_openai)
    assert response.id.startswith("resp_") and response.id != upstream_id
    assert upstream_id not in response.model_dump_json()
    [received] = fake_openai.received
    assert received.path == "/v1/responses"
    assert_passed_through(sent[-1], received.body, CHAT_ALIAS, UPSTREAM_CHAT_MODEL)


async def test_every_event_of_a_stream_carries_the_id_the_plain_answer_would(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    async with proxy.openai(tenant.key) as client:
        stream = await client.responses.create(model=CHAT_ALIAS, input="hello", stream=True)
        events = [event async for event in stream]
        [upstream_id] = upstream_ids(fake_openai)
        retrieved = await client.responses.retrieve(events[0].response.id)  # type: ignore[union-attr]
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    ids = {event.response.id for event in events if hasattr(event, "response")}
    assert ids == {retrieved.id}
    assert upstream_id not in ids
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert "".join(deltas) == REPLY
    assert [event.sequence_number for event in events] == list(range(len(events)))
    completed = events[-1].response  # type: ignore[union-attr]
    assert completed.usage is not None and completed.usage.output_tokens == 9
    assert retrieved.output_text == REPLY


async def test_function_tools_call_and_take_their_result(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    async with proxy.openai(tenant.key) as client:
        first = await client.responses.create(
            model=CHAT_ALIAS, input="Weather in Paris?", tools=[WEATHER_TOOL]
        )
        [call] = first.output
        assert call.type == "function_call"
        assert (call.name, call.arguments) == ("get_weather", TOOL_ARGUMENTS)
        second = await client.responses.create(
            model=CHAT_ALIAS,
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "21 C"}],
            tools=[WEATHER_TOOL],
        )
    assert second.output_text == REPLY
    assert second.previous_response_id == first.id
    # The provider got its own id back, never the sealed one.
    first_upstream = next(iter(fake_openai.responses))
    assert fake_openai.received[-1].json()["previous_response_id"] == first_upstream
    assert fake_openai.received[0].json()["tools"] == [WEATHER_TOOL]


async def test_a_json_schema_output_passes_through(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    async with proxy.openai(tenant.key) as client:
        response = await client.responses.create(
            model=CHAT_ALIAS, input="Weather in Paris?", text=WEATHER_FORMAT
        )
    assert json.loads(response.output_text) == json.loads(JSON_REPLY)
    assert fake_openai.received[-1].json()["text"] == WEATHER_FORMAT


async def test_a_stored_response_is_retrieved_listed_and_deleted_by_its_sealed_id(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    async with proxy.openai(tenant.key) as client:
        created = await client.responses.create(model=CHAT_ALIAS, input="hello")
        [upstream_id] = upstream_ids(fake_openai)
        retrieved = await client.responses.retrieve(created.id)
        items = await client.responses.input_items.list(created.id)
        with pytest.raises(openai.BadRequestError, match="background"):
            await client.responses.cancel(created.id)
        await client.responses.delete(created.id)
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(created.id)
    assert retrieved.id == created.id and retrieved.output_text == REPLY
    assert [item.type for item in items.data] == ["message"]
    paths = [(r.method, r.path) for r in fake_openai.received[1:]]
    assert paths == [
        ("GET", f"/v1/responses/{upstream_id}"),
        ("GET", f"/v1/responses/{upstream_id}/input_items"),
        ("POST", f"/v1/responses/{upstream_id}/cancel"),
        ("DELETE", f"/v1/responses/{upstream_id}"),
        ("GET", f"/v1/responses/{upstream_id}"),
    ]
    assert fake_openai.responses == {}


async def test_a_forged_or_foreign_id_is_not_found_in_openais_shape(
    proxy: RunningProxy,
    tenant: Tenant,
    fake_openai: FakeOpenAI,
    client: httpx.AsyncClient,
) -> None:
    other = await make_tenant(client, fake_openai.url, fake_openai.api_key, name="other")
    async with proxy.openai(tenant.key) as sdk:
        created = await sdk.responses.create(model=CHAT_ALIAS, input="hello")
    calls = len(fake_openai.received)
    async with proxy.http() as http:
        for key, response_id in (
            (other.key, created.id),
            (tenant.key, "resp_" + created.id[5:][::-1]),
            (tenant.key, upstream_ids(fake_openai)[0]),
        ):
            auth = {"Authorization": f"Bearer {key}"}
            for method, path in (
                ("GET", f"/v1/responses/{response_id}"),
                ("DELETE", f"/v1/responses/{response_id}"),
                ("GET", f"/v1/responses/{response_id}/input_items"),
            ):
                answer = await http.request(method, path, headers=auth)
                openai_error(answer, 404, "not_found", param="response_id")
            continued = await http.post(
                "/v1/responses",
                headers=auth,
                json={"model": CHAT_ALIAS, "input": "more", "previous_response_id": response_id},
            )
            openai_error(continued, 404, "not_found", param="previous_response_id")
    # None of it reached the provider.
    assert len(fake_openai.received) == calls


async def test_background_responses_are_refused_naming_the_field(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    async with proxy.http() as http:
        answer = await http.post(
            "/v1/responses",
            headers={"Authorization": f"Bearer {tenant.key}"},
            json={"model": CHAT_ALIAS, "input": "hello", "background": True},
        )
        wrong = await http.put(
            "/v1/responses/resp_abc", headers={"Authorization": f"Bearer {tenant.key}"}
        )
    openai_error(answer, 400, "invalid_request", param="background")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "GET, DELETE"
    assert fake_openai.received == []


async def test_a_budget_reserves_max_output_tokens_and_refuses_before_the_provider(
    priced: Tenant, client: httpx.AsyncClient, proxy: RunningProxy, fake_openai: FakeOpenAI
) -> None:
    key_id, key = await add_key(client, priced)
    await budget(client, priced, scope={"kind": "virtual_key", "id": key_id}, limit_usd="5")
    async with proxy.http() as http:
        auth = {"Authorization": f"Bearer {key}"}
        body = {"model": CHAT_ALIAS, "input": "hello"}
        # 0.1 USD a token: 100 output tokens alone are worth 10 USD.
        refused = await http.post(
            "/v1/responses", headers=auth, json={**body, "max_output_tokens": 100}
        )
        assert fake_openai.received == []
        served = await http.post(
            "/v1/responses", headers=auth, json={**body, "max_output_tokens": 10}
        )
    assert refused.status_code == 402
    error = refused.json()["error"]
    assert (error["code"], error["budget_scope"]) == ("budget_exceeded", "virtual_key")
    assert served.status_code == 200, served.text


async def test_stored_response_calls_count_against_the_keys_rate_limit(
    priced: Tenant, client: httpx.AsyncClient, proxy: RunningProxy, fake_openai: FakeOpenAI
) -> None:
    _, key = await add_key(client, priced, limits={"rpm": 2})
    async with proxy.openai(key) as sdk:
        created = await sdk.responses.create(model=CHAT_ALIAS, input="hello")
    async with proxy.http() as http:
        auth = {"Authorization": f"Bearer {key}"}
        first = await http.get(f"/v1/responses/{created.id}", headers=auth)
        second = await http.get(f"/v1/responses/{created.id}", headers=auth)
    assert first.status_code == 200 and first.headers["x-ratelimit-remaining-requests"] == "0"
    openai_error(second, 429, "rate_limited")
    assert len(fake_openai.received) == 2


async def test_azure_gets_its_responses_path_and_an_api_version_that_serves_it(
    client: httpx.AsyncClient, proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    azure = await add_provider(
        client,
        tenant.org,
        "azure",
        fake_openai.azure_endpoint,
        fake_openai.api_key,
        kind="azure_openai",
        api_version="2024-10-21",
    )
    policy = await add_policy(client, tenant.org, {"azure": [(azure, "gpt-4o-deployment")]})
    _, key = await add_key(client, tenant, policy=policy)
    async with proxy.openai(key) as sdk:
        created = await sdk.responses.create(model="azure", input="hello")
        retrieved = await sdk.responses.retrieve(created.id)
    assert retrieved.id == created.id and created.output_text == REPLY
    posted, got = fake_openai.received
    assert (posted.method, posted.path, posted.query) == (
        "POST",
        "/openai/responses",
        {"api-version": "2025-04-01-preview"},
    )
    assert posted.json()["model"] == "gpt-4o-deployment"
    assert posted.header("api-key") == fake_openai.api_key
    assert (got.method, got.query) == ("GET", {"api-version": "2025-04-01-preview"})
    assert got.path == f"/openai/responses/{next(iter(fake_openai.responses))}"


async def test_the_providers_own_refusal_names_the_id_the_client_sent(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    async with proxy.openai(tenant.key) as sdk:
        created = await sdk.responses.create(model=CHAT_ALIAS, input="hello")
        upstream_id = next(iter(fake_openai.responses))
        await sdk.responses.delete(created.id)
        with pytest.raises(openai.BadRequestError) as continued:
            await sdk.responses.create(
                model=CHAT_ALIAS, input="more", previous_response_id=created.id
            )
        with pytest.raises(openai.NotFoundError) as read:
            await sdk.responses.retrieve(created.id)
    for refusal in (continued.value, read.value):
        assert created.id in refusal.message
        assert upstream_id not in refusal.response.text


async def test_a_response_made_with_store_false_says_it_was_not_stored(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    async with proxy.openai(tenant.key) as sdk:
        created = await sdk.responses.create(model=CHAT_ALIAS, input="hello", store=False)
        with pytest.raises(openai.NotFoundError, match="not stored"):
            await sdk.responses.retrieve(created.id)
    assert fake_openai.responses == {}
    assert len(fake_openai.received) == 1


async def test_metrics_name_the_stored_response_routes_by_template_never_the_id(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    async with proxy.openai(tenant.key) as sdk:
        created = await sdk.responses.create(model=CHAT_ALIAS, input="hello")
        await sdk.responses.retrieve(created.id)
        await sdk.responses.input_items.list(created.id)
        await sdk.responses.delete(created.id)
    text = proxy.metrics.render().decode()
    assert value(text, "vkgate_requests_total", route="/v1/responses", status="200") == 1
    assert value(text, "vkgate_requests_total", route="/v1/responses/{id}", status="200") == 2
    assert (
        value(text, "vkgate_requests_total", route="/v1/responses/{id}/input_items", status="200")
        == 1
    )
    assert created.id not in text

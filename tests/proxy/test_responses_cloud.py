"""The official OpenAI SDK's Responses API through the proxy to Bedrock, Google AI Studio and
Vertex AI credentials (fakes that speak each wire format and check each credential): plain,
streamed, with function tools and a JSON schema; nothing is stored; spend rows exact; and the
OpenAI Agents SDK running a tool-using agent on a Bedrock and an AI Studio credential."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import httpx
import openai
import pytest
from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled
from agents.models.default_models import get_default_model
from agents.models.openai_provider import OpenAIProvider
from litestar import Litestar

from tests.proxy.cloud_support import (
    BEDROCK,
    BEDROCK_MODEL,
    FAILOVER,
    GEMINI,
    GEMINI_MODEL,
    TIMEOUT_S,
    VERTEX,
    Clouds,
    make_clouds,
)
from tests.proxy.conftest import (
    RunningProxy,
    Tenant,
    add_key,
    add_policy,
    openai_error,
    proxy_settings,
    serve_proxy,
)
from tests.proxy.test_cloud_spend import nanos
from tests.proxy.test_responses import WEATHER_FORMAT, WEATHER_TOOL
from tests.proxy.test_spend_ledger import NANO, drained, report
from tests.support import fake_bedrock as FB
from tests.support import fake_gemini as FG
from tests.support.clock import ManualClock
from tests.support.fake_bedrock import FakeBedrock
from tests.support.fake_gemini import FakeGemini

GOOGLE = [GEMINI, VERTEX]


@pytest.fixture
async def clouds(
    client: httpx.AsyncClient,
    proxy: RunningProxy,
    fake_bedrock: FakeBedrock,
    fake_gemini: FakeGemini,
) -> Clouds:
    return await make_clouds(client, proxy, fake_bedrock, fake_gemini)


async def test_bedrock_answers_a_plain_response_translated_both_ways(clouds: Clouds) -> None:
    async with clouds.openai() as sdk:
        response = await sdk.responses.create(
            model=BEDROCK,
            instructions="Be brief.",
            input=[{"role": "user", "content": [{"type": "input_text", "text": "hello"}]}],
            max_output_tokens=128,
            temperature=0.5,
            metadata={"ticket": "42"},
        )
    assert response.output_text == FB.REPLY
    assert response.model == BEDROCK_MODEL
    assert response.status == "completed"
    assert response.store is False
    assert response.metadata == {"ticket": "42"}
    assert response.id.startswith("resp_")
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (13, 8)
    sent = clouds.bedrock.received[-1]
    assert sent.path == f"/model/{BEDROCK_MODEL}/converse"
    assert sent.json() == {
        "messages": [{"role": "user", "content": [{"text": "hello"}]}],
        "system": [{"text": "Be brief."}],
        "inferenceConfig": {"maxTokens": 128, "temperature": 0.5},
    }
    assert clouds.bedrock.signed_by == [FB.ACCESS_KEY_ID]


async def test_bedrock_streams_a_response_as_typed_events(clouds: Clouds) -> None:
    async with clouds.openai() as sdk:
        stream = await sdk.responses.create(model=BEDROCK, input="hello", stream=True)
        events = [event async for event in stream]
    assert [event.type for event in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(FB.REPLY_PIECES),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert len({event.response.id for event in events if hasattr(event, "response")}) == 1
    completed = events[-1].response  # type: ignore[union-attr]
    assert completed.output_text == FB.REPLY
    assert completed.usage is not None and completed.usage.input_tokens == 13
    assert clouds.bedrock.received[-1].path.endswith("/converse-stream")


@pytest.mark.parametrize("streamed", [False, True])
async def test_bedrock_calls_a_function_and_takes_its_result(
    clouds: Clouds, streamed: bool
) -> None:
    async with clouds.openai() as sdk:
        if streamed:
            stream = await sdk.responses.create(
                model=BEDROCK, input="Weather in Paris?", tools=[WEATHER_TOOL], stream=True
            )
            events = [event async for event in stream]
            deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
            assert json.loads("".join(deltas)) == FB.TOOL_INPUT
            first = events[-1].response  # type: ignore[union-attr]
        else:
            first = await sdk.responses.create(
                model=BEDROCK,
                input="Weather in Paris?",
                tools=[WEATHER_TOOL],
                tool_choice="required",
            )
        [call] = first.output
        assert call.type == "function_call"
        assert call.call_id == FB.TOOL_USE_ID and call.name == "get_weather"
        assert json.loads(call.arguments) == FB.TOOL_INPUT
        second = await sdk.responses.create(
            model=BEDROCK,
            input=[
                {"role": "user", "content": "Weather in Paris?"},
                call.model_dump(exclude_unset=True),  # type: ignore[list-item]
                {"type": "function_call_output", "call_id": call.call_id, "output": "21 C"},
            ],
            tools=[WEATHER_TOOL],
        )
    assert second.output_text == FB.REPLY
    first_sent, second_sent = (r.json() for r in clouds.bedrock.received)
    assert first_sent["toolConfig"]["tools"][0]["toolSpec"]["name"] == "get_weather"
    if not streamed:
        assert first_sent["toolConfig"]["toolChoice"] == {"any": {}}
    assert second_sent["messages"] == [
        {"role": "user", "content": [{"text": "Weather in Paris?"}]},
        {
            "role": "assistant",
            "content": [
                {
                    "toolUse": {
                        "toolUseId": FB.TOOL_USE_ID,
                        "name": "get_weather",
                        "input": FB.TOOL_INPUT,
                    }
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {"toolResult": {"toolUseId": FB.TOOL_USE_ID, "content": [{"text": "21 C"}]}}
            ],
        },
    ]


async def test_a_json_schema_output_becomes_conveses_text_format(clouds: Clouds) -> None:
    async with clouds.openai() as sdk:
        response = await sdk.responses.create(model=BEDROCK, input="hello", text=WEATHER_FORMAT)
    assert response.text is not None and response.text.format is not None
    assert response.text.format.type == "json_schema"
    sent = clouds.bedrock.received[-1].json()
    definition = sent["outputConfig"]["textFormat"]["structure"]["jsonSchema"]
    assert json.loads(definition["schema"]) == WEATHER_FORMAT["format"]["schema"]
    assert definition["name"] == WEATHER_FORMAT["format"]["name"]


@pytest.mark.parametrize("alias", GOOGLE)
async def test_gemini_and_vertex_answer_plain_and_streamed_responses(
    clouds: Clouds, alias: str
) -> None:
    clouds.gemini.thoughts_tokens = 6
    async with clouds.openai() as sdk:
        plain = await sdk.responses.create(
            model=alias, input="hello", reasoning={"effort": "low", "summary": "auto"}
        )
        stream = await sdk.responses.create(model=alias, input="hello", stream=True)
        events = [event async for event in stream]
    assert plain.output_text == FG.REPLY
    assert plain.model == f"{GEMINI_MODEL}-001"  # the modelVersion Gemini names
    reasoning, message = plain.output
    assert reasoning.type == "reasoning" and message.type == "message"
    assert reasoning.summary[0].text == "Let me think."
    assert plain.usage is not None
    assert plain.usage.output_tokens_details.reasoning_tokens == 6
    assert plain.usage.output_tokens == clouds.gemini.candidates_tokens + 6
    first, second = (r.json() for r in clouds.gemini.received)
    assert first["generationConfig"] == {
        "thinkingConfig": {"thinkingLevel": "low", "includeThoughts": True}
    }
    assert clouds.gemini.received[-1].path.endswith(":streamGenerateContent")
    completed = events[-1]
    assert completed.type == "response.completed"
    assert completed.response.output_text == FG.REPLY
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "contents" in second and "stream" not in second


@pytest.mark.parametrize("alias", GOOGLE)
async def test_gemini_calls_a_function_and_gets_its_thought_signature_back(
    clouds: Clouds, alias: str
) -> None:
    clouds.gemini.sign_calls = True
    async with clouds.openai() as sdk:
        stream = await sdk.responses.create(
            model=alias, input="Weather in Paris?", tools=[WEATHER_TOOL], stream=True
        )
        events = [event async for event in stream]
        [call] = events[-1].response.output  # type: ignore[union-attr]
        assert call.type == "function_call" and json.loads(call.arguments) == FG.TOOL_ARGS
        second = await sdk.responses.create(
            model=alias,
            input=[
                {"role": "user", "content": "Weather in Paris?"},
                call.model_dump(exclude_unset=True),  # type: ignore[list-item]
                {"type": "function_call_output", "call_id": call.call_id, "output": "21 C"},
            ],
            tools=[WEATHER_TOOL],
        )
    assert second.output_text == FG.REPLY
    contents = clouds.gemini.received[-1].json()["contents"]
    assert contents[1] == {
        "role": "model",
        "parts": [
            {
                "functionCall": {"name": "get_weather", "args": FG.TOOL_ARGS},
                "thoughtSignature": FG.THOUGHT_SIGNATURE,
            }
        ],
    }
    assert contents[2]["parts"] == [
        {"functionResponse": {"name": "get_weather", "response": {"content": "21 C"}}}
    ]


@pytest.mark.parametrize("alias", [BEDROCK, GEMINI, VERTEX])
async def test_nothing_is_stored_with_a_cloud_credential_and_the_gateway_says_so(
    clouds: Clouds, alias: str
) -> None:
    async with clouds.openai() as sdk:
        response = await sdk.responses.create(model=alias, input="hello")
    calls = len(clouds.bedrock.received) + len(clouds.gemini.received)
    async with clouds.proxy.http() as http:
        auth = {"Authorization": f"Bearer {clouds.key}"}
        continued = await http.post(
            "/v1/responses",
            headers=auth,
            json={"model": alias, "input": "more", "previous_response_id": response.id},
        )
        error = openai_error(continued, 400, "invalid_request", param="previous_response_id")
        assert "not stored" in error["message"]
        refused = await http.post(
            "/v1/responses",
            headers=auth,
            json={"model": alias, "input": "x", "tools": [{"type": "web_search"}]},
        )
        openai_error(refused, 400, "invalid_request", param="tools[0].type")
    assert len(clouds.bedrock.received) + len(clouds.gemini.received) == calls


async def test_bedrock_and_gemini_errors_come_back_in_openais_shape(clouds: Clouds) -> None:
    clouds.bedrock.fail_next(400, "The model returned the following errors: bad input")
    clouds.gemini.fail_next(400, "Invalid JSON payload received.")
    async with clouds.openai() as sdk:
        with pytest.raises(openai.BadRequestError) as bedrock:
            await sdk.responses.create(model=BEDROCK, input="hello")
        with pytest.raises(openai.BadRequestError) as gemini:
            await sdk.responses.create(model=GEMINI, input="hello")
    assert bedrock.value.body == {
        "message": "The model returned the following errors: bad input",
        "type": "invalid_request_error",
        "code": "provider_error",
        "param": None,
    }
    assert isinstance(gemini.value.body, dict)
    assert gemini.value.body["message"] == "Invalid JSON payload received."


async def test_responses_on_cloud_credentials_land_in_the_ledger_exactly(
    client: httpx.AsyncClient,
    app: Litestar,
    clock: ManualClock,
    fake_bedrock: FakeBedrock,
    fake_gemini: FakeGemini,
) -> None:
    fake_bedrock.cache_read_tokens, fake_bedrock.cache_write_tokens = 40, 5
    fake_gemini.thoughts_tokens, fake_gemini.cached_tokens = 6, 4
    async with serve_proxy(app, clock, proxy_settings()) as proxy:
        clouds = await make_clouds(client, proxy, fake_bedrock, fake_gemini)
        async with clouds.openai() as sdk:
            for alias in (BEDROCK, GEMINI, VERTEX):
                await sdk.responses.create(model=alias, input="hello")
                stream = await sdk.responses.create(model=alias, input="hello", stream=True)
                async for _ in stream:
                    pass
        await drained(proxy, records=2 * 6)
    converse = {"input": 13 + 40 + 5, "output": 8, "cache_read": 40, "cache_write": 5}
    google = {"input": 12, "output": 9 + 6, "cache_read": 4, "reasoning": 6}
    expected = {
        "bedrock": ("aws", BEDROCK_MODEL, converse),
        "gemini": ("google", GEMINI_MODEL, google),
        "vertex_ai": ("google", GEMINI_MODEL, google),
    }
    rows = {
        row["provider_id"]: row
        for row in (await report(client, clouds.tenant.org, "provider"))["rows"]
    }
    for kind, (provider, model, tokens) in expected.items():
        row: dict[str, Any] = rows[clouds.providers[kind]]
        assert row["requests"] == 2, kind
        assert row["failed"] == 0 and row["refused"] == 0
        for field, name in (
            ("input_tokens", "input"),
            ("output_tokens", "output"),
            ("cache_read_tokens", "cache_read"),
            ("cache_write_tokens", "cache_write"),
            ("reasoning_tokens", "reasoning"),
        ):
            assert row[field] == 2 * tokens.get(name, 0), (kind, field)
        assert Decimal(row["cost_usd"]) * NANO == 2 * nanos(provider, model, tokens), kind


looked_up: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    looked_up.append(city)
    return f"21 C and clear in {city}"


@pytest.mark.parametrize("kind", ["bedrock", "gemini"])
@pytest.mark.parametrize("streamed", [False, True])
async def test_a_tool_using_agent_runs_on_a_cloud_credential(
    client: httpx.AsyncClient, clouds: Clouds, streamed: bool, kind: str
) -> None:
    set_tracing_disabled(True)  # the SDK would export its traces to OpenAI
    tenant, provider = clouds.tenant, clouds.providers[kind]
    model = BEDROCK_MODEL if kind == "bedrock" else GEMINI_MODEL
    policy = await add_policy(client, tenant.org, {get_default_model(): [(provider, model)]})
    _, key = await add_key(client, Tenant(tenant.org, tenant.project, provider, policy, "", ""))
    looked_up.clear()
    agent = Agent(name="weather", instructions="Answer briefly.", tools=[get_weather])
    sdk = openai.AsyncOpenAI(
        base_url=clouds.proxy.url, api_key=key, max_retries=0, timeout=TIMEOUT_S
    )
    async with sdk:
        config = RunConfig(model_provider=OpenAIProvider(openai_client=sdk))
        if streamed:
            run = Runner.run_streamed(agent, "Weather in Paris?", run_config=config)
            async for _ in run.stream_events():
                pass
            output = run.final_output
        else:
            output = (await Runner.run(agent, "Weather in Paris?", run_config=config)).final_output
    assert looked_up == ["Paris"]
    if kind == "gemini":
        assert output == FG.REPLY
        first, second = (r.json() for r in clouds.gemini.received)
        assert first["systemInstruction"] == {"parts": [{"text": "Answer briefly."}]}
        assert first["tools"][0]["functionDeclarations"][0]["name"] == "get_weather"
        assert second["contents"][-1]["parts"] == [
            {
                "functionResponse": {
                    "name": "get_weather",
                    "response": {"content": "21 C and clear in Paris"},
                }
            }
        ]
        return
    assert output == FB.REPLY
    first, second = (r.json() for r in clouds.bedrock.received)
    assert first["system"] == [{"text": "Answer briefly."}]
    assert first["toolConfig"]["tools"][0]["toolSpec"]["name"] == "get_weather"
    result = second["messages"][-1]["content"][-1]["toolResult"]
    assert result == {"toolUseId": FB.TOOL_USE_ID, "content": [{"text": "21 C and clear in Paris"}]}


async def test_a_prompt_gemini_blocks_is_a_400_naming_the_input(clouds: Clouds) -> None:
    clouds.gemini.block_prompt = "SAFETY"
    async with clouds.openai() as sdk:
        with pytest.raises(openai.BadRequestError) as blocked:
            await sdk.responses.create(model=GEMINI, input="hello")
    assert "safety filters blocked the prompt (SAFETY)" in blocked.value.message
    assert blocked.value.body["param"] == "input"  # type: ignore[index]


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_throttled_bedrock_credential_fails_over_to_gemini_for_a_responses_client(
    clouds: Clouds, streamed: bool
) -> None:
    if streamed:
        clouds.bedrock.open_with_exception = "throttlingException"
    else:
        clouds.bedrock.fail_next(429, "Too many requests, please wait before trying again.")
    async with clouds.openai() as sdk:
        raw = await sdk.responses.with_raw_response.create(
            model=FAILOVER, input="hello", stream=streamed
        )
        assert raw.headers["x-vkgate-provider"] == "studio"
        assert raw.headers["x-vkgate-fallback-count"] == "1"
        parsed: Any = raw.parse()
        if streamed:
            events = [event async for event in parsed]
            response = events[-1].response
        else:
            response = parsed
    assert response.output_text == FG.REPLY
    assert response.model == f"{GEMINI_MODEL}-001"
    assert len(clouds.bedrock.received) == 1 and len(clouds.gemini.received) == 1

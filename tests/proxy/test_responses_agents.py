"""The OpenAI Agents SDK, with its default model (which calls the Responses API), runs a
tool-using agent through the proxy: to a provider that serves the API, and translated to
Anthropic, plain and streamed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled
from agents.models.default_models import get_default_model
from agents.models.openai_provider import OpenAIProvider
from litestar import Litestar

from tests.proxy.conftest import (
    RunningProxy,
    Tenant,
    add_key,
    add_policy,
    add_provider,
    proxy_settings,
    serve_proxy,
)
from tests.support.api import create
from tests.support.clock import ManualClock
from tests.support.fake_anthropic import REPLY as CLAUDE_REPLY
from tests.support.fake_anthropic import TOOL_INPUT, FakeAnthropic
from tests.support.fake_openai import REPLY as GPT_REPLY
from tests.support.fake_openai import FakeOpenAI

DEFAULT_MODEL = get_default_model()


@dataclass
class Deployment:
    proxy: RunningProxy
    keys: dict[str, str]
    """The key whose policy sends the default model to each provider kind."""


@pytest.fixture
async def deployment(
    client: httpx.AsyncClient,
    app: Litestar,
    clock: ManualClock,
    fake_openai: FakeOpenAI,
    fake_anthropic: FakeAnthropic,
) -> AsyncIterator[Deployment]:
    set_tracing_disabled(True)  # the SDK would export its traces to OpenAI
    org = (await create(client, "/api/admin/organizations", {"name": "agents"}))["id"]
    project = (await create(client, "/api/admin/projects", {"organization_id": org, "name": "p"}))[
        "id"
    ]
    gpt = await add_provider(client, org, "gpt", fake_openai.url, fake_openai.api_key)
    claude = await add_provider(
        client, org, "claude", fake_anthropic.url, fake_anthropic.api_key, kind="anthropic"
    )
    keys = {}
    for kind, provider, model in (
        ("openai", gpt, "gpt-5-mini"),
        ("anthropic", claude, "claude-sonnet-4-5"),
    ):
        policy = await add_policy(client, org, {DEFAULT_MODEL: [(provider, model)]})
        _, keys[kind] = await add_key(client, Tenant(org, project, provider, policy, "", ""))
    async with serve_proxy(app, clock, proxy_settings()) as proxy:
        yield Deployment(proxy, keys)


looked_up: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    looked_up.append(city)
    return f"21 C and clear in {city}"


@pytest.mark.parametrize(("kind", "reply"), [("openai", GPT_REPLY), ("anthropic", CLAUDE_REPLY)])
@pytest.mark.parametrize("streamed", [False, True])
async def test_a_tool_using_agent_runs_with_the_default_model(
    deployment: Deployment,
    fake_openai: FakeOpenAI,
    fake_anthropic: FakeAnthropic,
    kind: str,
    reply: str,
    streamed: bool,
) -> None:
    looked_up.clear()
    agent = Agent(name="weather", instructions="Answer briefly.", tools=[get_weather])
    async with deployment.proxy.openai(deployment.keys[kind]) as client:
        config = RunConfig(model_provider=OpenAIProvider(openai_client=client))
        if streamed:
            run = Runner.run_streamed(agent, "Weather in Paris?", run_config=config)
            async for _ in run.stream_events():
                pass
            output = run.final_output
        else:
            result = await Runner.run(agent, "Weather in Paris?", run_config=config)
            output = result.final_output
    assert output == reply
    assert looked_up == [TOOL_INPUT["city"]]
    fake = fake_openai if kind == "openai" else fake_anthropic
    assert len(fake.received) == 2  # the tool call, then the answer with its result
    first, second = (r.json() for r in fake.received)
    if kind == "openai":
        assert first["model"] == "gpt-5-mini"
        assert first["tools"][0]["name"] == "get_weather"
        assert [i["type"] for i in second["input"][-2:]] == [
            "function_call",
            "function_call_output",
        ]
    else:
        assert first["system"] == "Answer briefly."
        assert first["tools"][0]["name"] == "get_weather"
        result_block = second["messages"][-1]["content"][-1]
        assert result_block["type"] == "tool_result"
        assert result_block["content"] == "21 C and clear in Paris"

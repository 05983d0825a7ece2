"""A routing policy's rules, through the official SDKs: each kind refuses with 403
`policy_violation` in the route's own format, naming the rule and the field, before any
provider is called, and leaves a `fail` record that names the rule."""

from __future__ import annotations

import asyncio
import io
import itertools
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from tests.proxy.conftest import (
    CHAT_ALIAS,
    EMBEDDING_ALIAS,
    UPSTREAM_CHAT_MODEL,
    UPSTREAM_EMBEDDING_MODEL,
    RunningProxy,
    Tenant,
    add_key,
    add_provider,
    make_tenant,
)
from tests.proxy.outcome_support import outcomes
from tests.support.api import ADMIN, create
from tests.support.fake_gemini import FakeGemini
from tests.support.fake_openai import FakeOpenAI
from vkgate.spend import SpendRecord

HELLO: Any = [{"role": "user", "content": "hello"}]
GEMINI_ALIAS = "gemini"
_names = itertools.count(1)


def tool(name: str) -> Any:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


@dataclass
class Ruled:
    proxy: RunningProxy
    tenant: Tenant
    client: httpx.AsyncClient
    fake: FakeOpenAI
    gemini: FakeGemini
    gemini_provider: str

    async def key(self, *rules: dict[str, Any]) -> str:
        """A key of a policy routing `chat`, `embed` and `gemini` under `rules`."""
        aliases = {
            CHAT_ALIAS: [{"provider_id": self.tenant.provider, "model": UPSTREAM_CHAT_MODEL}],
            EMBEDDING_ALIAS: [
                {"provider_id": self.tenant.provider, "model": UPSTREAM_EMBEDDING_MODEL}
            ],
            GEMINI_ALIAS: [{"provider_id": self.gemini_provider, "model": "gemini-2.5-flash"}],
        }
        policy = await create(
            self.client,
            "/api/admin/routing-policies",
            {
                "organization_id": self.tenant.org,
                "name": f"ruled-{next(_names)}",
                "aliases": aliases,
                "rules": list(rules),
            },
        )
        return (await add_key(self.client, self.tenant, policy=policy["id"]))[1]

    def openai(self, key: str) -> openai.AsyncOpenAI:
        return self.proxy.openai(key)

    def anthropic(self, key: str) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(
            base_url=self.proxy.url.removesuffix("/v1"), api_key=key, max_retries=0, timeout=10
        )

    def gemini_client(self, key: str) -> genai.Client:
        return genai.Client(
            api_key=key,
            http_options=types.HttpOptions(
                base_url=self.proxy.url.removesuffix("/v1"),
                api_version="v1beta",
                timeout=30_000,
                retry_options=types.HttpRetryOptions(attempts=1),
            ),
        )

    async def outcomes(self) -> list[SpendRecord]:
        """The outcome records the proxy wrote, through the ledger."""
        return await outcomes(self.proxy, self.client, self.tenant.org)


@pytest.fixture
async def ruled(
    client: httpx.AsyncClient, proxy: RunningProxy, fake_openai: FakeOpenAI, fake_gemini: FakeGemini
) -> Ruled:
    tenant = await make_tenant(client, fake_openai.url, fake_openai.api_key)
    gemini = await add_provider(
        client, tenant.org, "studio", fake_gemini.url, fake_gemini.api_key, kind="gemini"
    )
    return Ruled(proxy, tenant, client, fake_openai, fake_gemini, gemini)


def violation(exc: openai.APIStatusError, rule: str, param: str) -> dict[str, Any]:
    assert exc.status_code == 403, exc.response.text
    error: dict[str, Any] = exc.response.json()["error"]
    assert error["code"] == "policy_violation"
    assert error["type"] == "permission_error"
    assert (error["rule"], error["param"]) == (rule, param), error
    assert rule in error["message"]
    return error


async def test_deny_models_refuses_the_alias_and_hides_it_from_the_models_list(
    ruled: Ruled,
) -> None:
    key = await ruled.key(
        {"name": "no-gpt4o", "kind": "deny_models", "values": ["gpt-4o-mini*"]},
    )
    async with ruled.openai(key) as sdk:
        with pytest.raises(openai.PermissionDeniedError) as refused:
            await sdk.chat.completions.create(model=CHAT_ALIAS, messages=HELLO)
        listed = [m.id async for m in sdk.models.list()]
        # The embedding alias's upstream model is not denied: it still serves.
        await sdk.embeddings.create(model=EMBEDDING_ALIAS, input="hi")
    violation(refused.value, "no-gpt4o", "model")
    assert CHAT_ALIAS not in listed and EMBEDDING_ALIAS in listed
    assert [r.path for r in ruled.fake.received] == ["/v1/embeddings"]
    fail = next(r for r in await ruled.outcomes() if r.kind == "fail")
    assert (fail.status, fail.error_code, fail.policy_rule) == (403, "policy_violation", "no-gpt4o")
    assert fail.refused and fail.attempts == 0 and fail.model == CHAT_ALIAS


async def test_deny_models_by_alias_glob(ruled: Ruled) -> None:
    key = await ruled.key({"name": "no-embeddings", "kind": "deny_models", "values": ["emb*"]})
    async with ruled.openai(key) as sdk:
        with pytest.raises(openai.PermissionDeniedError) as refused:
            await sdk.embeddings.create(model=EMBEDDING_ALIAS, input="hi")
        await sdk.chat.completions.create(model=CHAT_ALIAS, messages=HELLO)
    violation(refused.value, "no-embeddings", "model")


async def test_allow_tools_and_deny_tools_on_chat(ruled: Ruled) -> None:
    key = await ruled.key(
        {"name": "only-lookups", "kind": "allow_tools", "values": ["get_*", "search"]},
        {"name": "no-secrets", "kind": "deny_tools", "values": ["get_secret*"]},
    )
    async with ruled.openai(key) as sdk:
        await sdk.chat.completions.create(
            model=CHAT_ALIAS, messages=HELLO, tools=[tool("get_weather"), tool("search")]
        )
        with pytest.raises(openai.PermissionDeniedError) as outside:
            await sdk.chat.completions.create(
                model=CHAT_ALIAS, messages=HELLO, tools=[tool("get_weather"), tool("rm_rf")]
            )
        with pytest.raises(openai.PermissionDeniedError) as denied:
            await sdk.chat.completions.create(
                model=CHAT_ALIAS, messages=HELLO, tools=[tool("get_secret_key")]
            )
    assert "'rm_rf'" in violation(outside.value, "only-lookups", "tools")["message"]
    violation(denied.value, "no-secrets", "tools")
    assert len(ruled.fake.received) == 1


async def test_deny_tools_on_messages_answers_in_anthropics_shape(ruled: Ruled) -> None:
    key = await ruled.key({"name": "no-shell", "kind": "deny_tools", "values": ["bash*"]})
    async with ruled.anthropic(key) as sdk:
        with pytest.raises(anthropic.PermissionDeniedError) as refused:
            await sdk.messages.create(
                model=CHAT_ALIAS,
                max_tokens=50,
                messages=HELLO,
                tools=[{"name": "bash_exec", "input_schema": {"type": "object"}}],
            )
    body = refused.value.response.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == "permission_error"
    assert body["error"]["code"] == "policy_violation"
    assert (body["error"]["rule"], body["error"]["param"]) == ("no-shell", "tools")
    assert ruled.fake.received == []


async def test_deny_tools_on_responses(ruled: Ruled) -> None:
    key = await ruled.key({"name": "no-search", "kind": "deny_tools", "values": ["web_search*"]})
    async with ruled.openai(key) as sdk:
        with pytest.raises(openai.PermissionDeniedError) as refused:
            await sdk.responses.create(
                model=CHAT_ALIAS, input="news?", tools=[{"type": "web_search_preview"}]
            )
    violation(refused.value, "no-search", "tools")
    assert ruled.fake.received == []


async def test_url_domains_in_image_parts_and_in_text(ruled: Ruled) -> None:
    key = await ruled.key(
        {"name": "our-cdn", "kind": "allow_url_domains", "values": ["cdn.example.com"]},
        {"name": "no-pastebins", "kind": "deny_url_domains", "values": ["*.paste.example.com"]},
    )

    def image(url: str) -> Any:
        return [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": url}},
                ],
            }
        ]

    async with ruled.openai(key) as sdk:
        await sdk.chat.completions.create(
            model=CHAT_ALIAS, messages=image("https://img.cdn.example.com/a.png")
        )
        with pytest.raises(openai.PermissionDeniedError) as elsewhere:
            await sdk.chat.completions.create(
                model=CHAT_ALIAS, messages=image("https://evil.test/a.png")
            )
        with pytest.raises(openai.PermissionDeniedError) as in_text:
            await sdk.chat.completions.create(
                model=CHAT_ALIAS,
                messages=[{"role": "user", "content": "summarise https://x.paste.example.com/1"}],
            )
        with pytest.raises(openai.PermissionDeniedError) as embedded:
            await sdk.embeddings.create(model=EMBEDDING_ALIAS, input=["see http://evil.test/"])
    violation(elsewhere.value, "our-cdn", "messages")
    # Outside the allowed domains and inside the denied ones: the first rule refuses.
    violation(in_text.value, "our-cdn", "messages")
    violation(embedded.value, "our-cdn", "input")
    assert len(ruled.fake.received) == 1


async def test_deny_url_domains_alone(ruled: Ruled) -> None:
    key = await ruled.key(
        {"name": "no-pastebins", "kind": "deny_url_domains", "values": ["paste.example.com"]}
    )
    async with ruled.openai(key) as sdk:
        await sdk.chat.completions.create(
            model=CHAT_ALIAS, messages=[{"role": "user", "content": "see https://example.com/"}]
        )
        with pytest.raises(openai.PermissionDeniedError) as refused:
            await sdk.chat.completions.create(
                model=CHAT_ALIAS,
                messages=[{"role": "user", "content": "see https://A.Paste.Example.com/raw/9"}],
            )
    assert (
        "'a.paste.example.com'" in violation(refused.value, "no-pastebins", "messages")["message"]
    )


async def test_deny_params_on_json_and_multipart_routes(ruled: Ruled) -> None:
    key = await ruled.key(
        {
            "name": "no-steering",
            "kind": "deny_params",
            "values": ["logit_bias", "style", "timestamp_granularities"],
        }
    )
    async with ruled.openai(key) as sdk:
        with pytest.raises(openai.PermissionDeniedError) as chat:
            await sdk.chat.completions.create(
                model=CHAT_ALIAS, messages=HELLO, logit_bias={"50256": -100}
            )
        with pytest.raises(openai.PermissionDeniedError) as image:
            await sdk.images.generate(model=CHAT_ALIAS, prompt="a cat", style="vivid")
        with pytest.raises(openai.PermissionDeniedError) as upload:
            await sdk.audio.transcriptions.create(
                model=CHAT_ALIAS,
                file=("a.wav", io.BytesIO(b"RIFF0000WAVE"), "audio/wav"),
                response_format="verbose_json",
                timestamp_granularities=["word"],
            )
    violation(chat.value, "no-steering", "logit_bias")
    violation(image.value, "no-steering", "style")
    violation(upload.value, "no-steering", "timestamp_granularities")
    assert ruled.fake.received == []


async def test_max_output_tokens_caps_what_a_request_asks(ruled: Ruled) -> None:
    key = await ruled.key(
        {"name": "short", "kind": "max_output_tokens", "values": {"limit": 64, "action": "cap"}}
    )
    async with ruled.openai(key) as sdk:
        await sdk.chat.completions.create(model=CHAT_ALIAS, messages=HELLO, max_tokens=5000)
        await sdk.chat.completions.create(model=CHAT_ALIAS, messages=HELLO)
        await sdk.chat.completions.create(model=CHAT_ALIAS, messages=HELLO, max_tokens=10)
    over, none, under = (r.json() for r in ruled.fake.received)
    assert over["max_tokens"] == 64
    assert none["max_completion_tokens"] == 64 and "max_tokens" not in none
    assert under["max_tokens"] == 10
    assert over["messages"] == HELLO, "the rest of the body is as the client sent it"


async def test_max_output_tokens_refuses_when_told_to(ruled: Ruled) -> None:
    key = await ruled.key(
        {"name": "short", "kind": "max_output_tokens", "values": {"limit": 64, "action": "refuse"}}
    )
    async with ruled.openai(key) as sdk:
        with pytest.raises(openai.PermissionDeniedError) as over:
            await sdk.chat.completions.create(
                model=CHAT_ALIAS, messages=HELLO, max_completion_tokens=65
            )
        with pytest.raises(openai.PermissionDeniedError) as none:
            await sdk.responses.create(model=CHAT_ALIAS, input="hi")
        await sdk.chat.completions.create(model=CHAT_ALIAS, messages=HELLO, max_tokens=64)
    violation(over.value, "short", "max_completion_tokens")
    assert "names no limit" in violation(none.value, "short", "max_output_tokens")["message"]
    assert len(ruled.fake.received) == 1


async def test_rules_on_the_gemini_api_answer_in_googles_shape(ruled: Ruled) -> None:
    key = await ruled.key(
        {"name": "no-exec", "kind": "deny_tools", "values": ["run_*"]},
        {"name": "short", "kind": "max_output_tokens", "values": {"limit": 32, "action": "cap"}},
    )
    client = ruled.gemini_client(key)
    try:
        with pytest.raises(genai_errors.ClientError) as refused:
            await client.aio.models.generate_content(
                model=GEMINI_ALIAS,
                contents="hello",
                config=types.GenerateContentConfig(
                    tools=[
                        types.Tool(
                            function_declarations=[types.FunctionDeclaration(name="run_shell")]
                        )
                    ]
                ),
            )
        await client.aio.models.generate_content(
            model=GEMINI_ALIAS,
            contents="hello",
            config=types.GenerateContentConfig(max_output_tokens=4000),
        )
    finally:
        await client.aio.aclose()
    assert refused.value.code == 403
    details = refused.value.details["error"]["details"][0]
    assert details["reason"] == "POLICY_VIOLATION"
    assert details["metadata"]["rule"] == "no-exec"
    [sent] = ruled.gemini.received
    assert sent.json()["generationConfig"]["maxOutputTokens"] == 32


async def test_a_rule_change_reaches_the_proxy_through_the_change_feed(ruled: Ruled) -> None:
    key = await ruled.key({"name": "no-bias", "kind": "deny_params", "values": ["seed"]})
    async with ruled.openai(key) as sdk:
        with pytest.raises(openai.PermissionDeniedError):
            await sdk.chat.completions.create(model=CHAT_ALIAS, messages=HELLO, seed=1)
    await ruled.proxy.following_changes()
    policies = (
        await ruled.client.get(
            "/api/admin/routing-policies",
            params={"organization_id": ruled.tenant.org},
            headers=ADMIN,
        )
    ).json()["data"]
    policy = next(p for p in policies if p["rules"])
    changed = await ruled.client.patch(
        f"/api/admin/routing-policies/{policy['id']}", json={"rules": []}, headers=ADMIN
    )
    assert changed.status_code == 200, changed.text
    assert changed.json()["rules"] == []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5.0
    async with ruled.openai(key) as sdk:
        while True:
            try:
                await sdk.chat.completions.create(model=CHAT_ALIAS, messages=HELLO, seed=1)
                break
            except openai.PermissionDeniedError:
                assert loop.time() < deadline, "the rule's removal never reached the proxy"
                await asyncio.sleep(0.02)

"""An organization whose aliases reach the fake Bedrock, Gemini and Vertex AI providers: what the
cloud providers' tests share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai

from tests.proxy.conftest import RunningProxy, Tenant, add_key, add_policy
from tests.support import fake_bedrock as FB
from tests.support import fake_gemini as FG
from tests.support.api import create
from tests.support.fake_bedrock import FakeBedrock
from tests.support.fake_gemini import FakeGemini

TIMEOUT_S = 30
"""A proxy's first call to a cloud kind loads botocore or google-auth (in a thread) and a first
token: on a loaded machine that can take seconds, which the SDKs' wait must cover."""
BEDROCK = "bedrock-claude"
"""An alias routed to the Bedrock credential."""
GEMINI = "gemini-flash"
"""An alias routed to the AI Studio credential."""
VERTEX = "vertex-flash"
"""An alias routed to the Vertex AI credential."""
FAILOVER = "either"
"""Bedrock first, then AI Studio."""
TITAN = "titan"
COHERE = "cohere"
GOOGLE_EMBED = "google-embed"
BEDROCK_MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
GEMINI_MODEL = "gemini-2.5-flash"
HELLO: Any = [{"role": "user", "content": "hello"}]
WEATHER_TOOL_OPENAI: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
WEATHER_TOOL_ANTHROPIC: Any = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


async def add_cloud_provider(
    client: httpx.AsyncClient, org: str, name: str, kind: str, **fields: Any
) -> str:
    body = {"organization_id": org, "name": name, "kind": kind, **fields}
    return str((await create(client, "/api/admin/providers", body))["id"])


@dataclass
class Clouds:
    proxy: RunningProxy
    tenant: Tenant
    bedrock: FakeBedrock
    gemini: FakeGemini
    providers: dict[str, str]
    """Provider id by kind."""

    @property
    def key(self) -> str:
        return self.tenant.key

    def openai(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self.proxy.url, api_key=self.tenant.key, max_retries=0, timeout=TIMEOUT_S
        )

    def anthropic(self) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(
            base_url=self.proxy.url.removesuffix("/v1"),
            api_key=self.tenant.key,
            max_retries=0,
            timeout=TIMEOUT_S,
        )


async def make_clouds(
    client: httpx.AsyncClient,
    proxy: RunningProxy,
    fake_bedrock: FakeBedrock,
    fake_gemini: FakeGemini,
    *,
    stored: bool = True,
) -> Clouds:
    """An organization with a Bedrock, an AI Studio and a Vertex AI credential (stored keys and a
    stored service account, or, with `stored=False`, the proxy's own credentials)."""
    org = (await create(client, "/api/admin/organizations", {"name": "clouds"}))["id"]
    project = (await create(client, "/api/admin/projects", {"organization_id": org, "name": "p"}))[
        "id"
    ]
    aws: dict[str, Any] = (
        {"aws_access_key_id": FB.ACCESS_KEY_ID, "aws_secret_access_key": FB.SECRET_ACCESS_KEY}
        if stored
        else {}
    )
    bedrock = await add_cloud_provider(
        client, org, "bedrock", "bedrock", region=FB.REGION, base_url=fake_bedrock.url, **aws
    )
    gemini = await add_cloud_provider(
        client, org, "studio", "gemini", base_url=fake_gemini.url, api_key=fake_gemini.api_key
    )
    google: dict[str, Any] = (
        {"service_account_json": fake_gemini.service_account()} if stored else {}
    )
    vertex = await add_cloud_provider(
        client,
        org,
        "vertex",
        "vertex_ai",
        project=FG.PROJECT,
        location=FG.LOCATION,
        base_url=fake_gemini.url,
        **google,
    )
    policy = await add_policy(
        client,
        org,
        {
            BEDROCK: [(bedrock, BEDROCK_MODEL)],
            GEMINI: [(gemini, GEMINI_MODEL)],
            VERTEX: [(vertex, GEMINI_MODEL)],
            FAILOVER: [(bedrock, BEDROCK_MODEL), (gemini, GEMINI_MODEL)],
            TITAN: [(bedrock, "amazon.titan-embed-text-v2:0")],
            COHERE: [(bedrock, "cohere.embed-english-v3")],
            GOOGLE_EMBED: [(gemini, "gemini-embedding-001")],
        },
    )
    tenant = Tenant(org, project, bedrock, policy, "", "")
    tenant.key_id, tenant.key = await add_key(client, tenant)
    return Clouds(
        proxy,
        tenant,
        fake_bedrock,
        fake_gemini,
        {"bedrock": bedrock, "gemini": gemini, "vertex_ai": vertex},
    )

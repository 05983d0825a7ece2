"""Google's Gemini API under `/v1beta`, driven by Google's own `google-genai` SDK: passed through to
AI Studio and Vertex AI credentials, governed like every route, errors in Google's shape."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from google import genai
from google.genai import errors, types

from tests.proxy.cloud_support import (
    BEDROCK,
    GEMINI,
    GEMINI_MODEL,
    GOOGLE_EMBED,
    VERTEX,
    Clouds,
    make_clouds,
)
from tests.proxy.conftest import RunningProxy, add_key
from tests.support import fake_gemini as FG
from tests.support.api import create
from tests.support.fake_bedrock import FakeBedrock
from tests.support.fake_gemini import FakeGemini


@pytest.fixture
async def clouds(
    client: httpx.AsyncClient,
    proxy: RunningProxy,
    fake_bedrock: FakeBedrock,
    fake_gemini: FakeGemini,
) -> Clouds:
    return await make_clouds(client, proxy, fake_bedrock, fake_gemini)


def gemini_client(clouds: Clouds, key: str | None = None) -> genai.Client:
    """google-genai pointed at the proxy, as its documentation says to reach a gateway."""
    return genai.Client(
        api_key=key or clouds.key,
        http_options=types.HttpOptions(
            base_url=clouds.proxy.url.removesuffix("/v1"),
            api_version="v1beta",
            timeout=30_000,
            retry_options=types.HttpRetryOptions(attempts=1),
        ),
    )


@pytest.fixture
async def sdk(clouds: Clouds) -> AsyncIterator[genai.client.AsyncClient]:
    client = gemini_client(clouds)
    yield client.aio
    await client.aio.aclose()


@pytest.mark.parametrize("alias", [GEMINI, VERTEX])
async def test_google_genai_generates_through_the_proxy_plain_and_streamed(
    clouds: Clouds, sdk: genai.client.AsyncClient, alias: str
) -> None:
    config = types.GenerateContentConfig(max_output_tokens=40, temperature=0.3)
    answer = await sdk.models.generate_content(model=alias, contents="hello", config=config)
    assert answer.text == FG.REPLY
    assert answer.usage_metadata is not None
    assert answer.usage_metadata.prompt_token_count == clouds.gemini.prompt_tokens
    sent = clouds.gemini.received[-1]
    assert sent.json() == {
        "contents": [{"parts": [{"text": "hello"}], "role": "user"}],
        "generationConfig": {"maxOutputTokens": 40, "temperature": 0.3},
    }, "the body passes through as the SDK wrote it"
    if alias == VERTEX:
        assert sent.path.startswith(f"/v1/projects/{FG.PROJECT}/")
        assert sent.header(
            "authorization",
        ).startswith("Bearer ya29.fake-")  # type: ignore[union-attr]
        assert sent.header("x-goog-api-key") is None
    else:
        assert sent.path == f"/v1beta/models/{GEMINI_MODEL}:generateContent"
        assert sent.header("x-goog-api-key") == clouds.gemini.api_key, "the credential, not vk-"

    pieces = [
        chunk.text
        async for chunk in await sdk.models.generate_content_stream(model=alias, contents="hello")
    ]
    assert "".join(p or "" for p in pieces) == FG.REPLY
    assert len(pieces) == len(FG.REPLY_PIECES)
    assert clouds.gemini.received[-1].query == {"alt": "sse"}


async def test_count_tokens_and_embeddings_pass_through_with_the_credentials_model(
    clouds: Clouds, sdk: genai.client.AsyncClient
) -> None:
    counted = await sdk.models.count_tokens(model=GEMINI, contents="one two three")
    assert counted.total_tokens == 3
    embedded = await sdk.models.embed_content(model=GOOGLE_EMBED, contents=["a", "b c"])
    assert embedded.embeddings is not None and len(embedded.embeddings) == 2
    batch = clouds.gemini.received[-1].json()
    assert {r["model"] for r in batch["requests"]} == {"models/gemini-embedding-001"}


async def test_the_model_list_holds_the_aliases_a_gemini_credential_serves(
    clouds: Clouds, sdk: genai.client.AsyncClient
) -> None:
    names = [model.name async for model in await sdk.models.list()]
    assert names == [f"models/{a}" for a in sorted((GEMINI, GOOGLE_EMBED, VERTEX, "either"))]
    one = await sdk.models.get(model=GEMINI)
    assert one.name == f"models/{GEMINI}"
    with pytest.raises(errors.ClientError) as missing:
        await sdk.models.get(model=BEDROCK)
    assert missing.value.code == 404


async def test_an_alias_no_gemini_credential_serves_is_refused_in_googles_shape(
    clouds: Clouds,
) -> None:
    async with clouds.proxy.http() as http:
        response = await http.post(
            f"/v1beta/models/{BEDROCK}:generateContent",
            headers={"x-goog-api-key": clouds.key},
            json={"contents": [{"role": "user", "parts": [{"text": "hello"}]}]},
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT" and error["code"] == 400
    assert error["details"][0]["reason"] == "INVALID_REQUEST"
    assert clouds.bedrock.received == []


async def test_the_key_may_come_as_a_query_parameter_and_bad_keys_get_googles_401(
    clouds: Clouds,
) -> None:
    body = {"contents": [{"role": "user", "parts": [{"text": "hello"}]}]}
    async with clouds.proxy.http() as http:
        by_query = await http.post(
            f"/v1beta/models/{GEMINI}:generateContent", params={"key": clouds.key}, json=body
        )
        wrong = await http.post(
            f"/v1beta/models/{GEMINI}:generateContent", params={"key": "vk-nope"}, json=body
        )
        none = await http.post(f"/v1beta/models/{GEMINI}:generateContent", json=body)
        unknown = await http.post(
            "/v1beta/models/nope:generateContent", params={"key": clouds.key}, json=body
        )
        not_sse = await http.post(
            f"/v1beta/models/{GEMINI}:streamGenerateContent", params={"key": clouds.key}, json=body
        )
    assert by_query.status_code == 200, by_query.text
    assert by_query.json()["candidates"][0]["content"]["parts"][0]["text"] == FG.REPLY
    for refused, status, kind in (
        (wrong, 401, "UNAUTHENTICATED"),
        (none, 401, "UNAUTHENTICATED"),
        (unknown, 404, "NOT_FOUND"),
        (not_sse, 400, "INVALID_ARGUMENT"),
    ):
        assert refused.status_code == status, refused.text
        assert refused.json()["error"]["status"] == kind
        assert refused.headers["x-request-id"]


async def test_rate_limits_govern_the_gemini_api_too(
    client: httpx.AsyncClient, clouds: Clouds
) -> None:
    _, limited = await add_key(client, clouds.tenant, limits={"rpm": 1})
    async with gemini_client(clouds, limited).aio as sdk:
        await sdk.models.generate_content(model=GEMINI, contents="hello")
        with pytest.raises(errors.ClientError) as refused:
            await sdk.models.generate_content(model=GEMINI, contents="hello")
    assert refused.value.code == 429
    assert refused.value.status == "RESOURCE_EXHAUSTED"


@pytest.mark.parametrize("alias", [GEMINI, VERTEX])
async def test_embed_content_passes_through_to_studio_and_vertex(
    clouds: Clouds, alias: str
) -> None:
    body = {"content": {"parts": [{"text": "embed me"}]}, "outputDimensionality": 4}
    async with clouds.proxy.http() as http:
        response = await http.post(
            f"/v1beta/models/{alias}:embedContent",
            headers={"x-goog-api-key": clouds.key},
            json=body,
        )
    assert response.status_code == 200, response.text
    assert len(response.json()["embedding"]["values"]) == 4
    assert clouds.gemini.received[-1].json() == body


async def test_a_budget_refuses_a_gemini_request_in_googles_shape(
    client: httpx.AsyncClient, clouds: Clouds
) -> None:
    await create(
        client,
        "/api/admin/budgets",
        {
            "organization_id": clouds.tenant.org,
            "scope": {"kind": "virtual_key", "id": clouds.tenant.key_id},
            "window": "month",
            "limit_usd": "0.0001",
        },
    )
    async with clouds.proxy.http() as http:
        response = await http.post(
            f"/v1beta/models/{GEMINI}:generateContent",
            headers={"x-goog-api-key": clouds.key},
            json={
                "contents": [{"role": "user", "parts": [{"text": "hello"}]}],
                "generationConfig": {"maxOutputTokens": 1_000_000},
            },
        )
    assert response.status_code == 402, response.text
    error = response.json()["error"]
    assert error["status"] == "RESOURCE_EXHAUSTED"
    info = error["details"][0]
    assert info["reason"] == "BUDGET_EXCEEDED" and info["metadata"]["limit_usd"] == "0.0001"
    assert clouds.gemini.received == []

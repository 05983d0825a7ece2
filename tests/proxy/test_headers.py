"""Headers on the way through: X-Request-ID on every answer, W3C trace context to the provider,
and which provider served the request."""

from __future__ import annotations

import re
from typing import Any

import openai
import pytest

from tests.proxy.conftest import (
    CHAT_ALIAS,
    EMBEDDING_ALIAS,
    RunningProxy,
    Tenant,
    openai_error,
)
from tests.support.fake_openai import FakeOpenAI

HELLO: Any = [{"role": "user", "content": "hello"}]
GENERATED_ID = re.compile(r"[0-9a-f]{32}")
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def bearer(key: str, **more: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **more}


async def test_success_carries_a_request_id_and_the_serving_provider(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    async with proxy.http() as http:
        answers = [
            await http.post(
                "/v1/chat/completions",
                json={"model": CHAT_ALIAS, "messages": HELLO},
                headers=bearer(tenant.key),
            ),
            await http.post(
                "/v1/chat/completions",
                json={"model": CHAT_ALIAS, "messages": HELLO, "stream": True},
                headers=bearer(tenant.key),
            ),
            await http.post(
                "/v1/embeddings",
                json={"model": EMBEDDING_ALIAS, "input": "x"},
                headers=bearer(tenant.key),
            ),
        ]
        models = await http.get("/v1/models", headers=bearer(tenant.key))
    for answer in answers:
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-vkgate-provider"] == "fake-openai"
    ids = [answer.headers["x-request-id"] for answer in [*answers, models]]
    assert all(GENERATED_ID.fullmatch(request_id) for request_id in ids)
    assert len(set(ids)) == len(ids)
    # The id the client saw is the one the provider was given.
    assert [r.header("X-Request-ID") for r in fake_openai.received] == ids[:3]


async def test_stream_answers_as_server_sent_events_ending_in_done(
    proxy: RunningProxy, tenant: Tenant
) -> None:
    async with proxy.http() as http:
        response = await http.post(
            "/v1/chat/completions",
            json={"model": CHAT_ALIAS, "messages": HELLO, "stream": True},
            headers=bearer(tenant.key),
        )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    events = response.text.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    assert all(event.startswith("data: ") for event in events[:-1])
    assert '"usage":{' not in response.text.replace(" ", "")


async def test_incoming_request_id_is_echoed_and_forwarded_to_the_provider(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    request_id = "req_2026-03-10.checkout:42"
    async with proxy.openai(tenant.key) as client:
        reply = await client.chat.completions.with_raw_response.create(
            model=CHAT_ALIAS, messages=HELLO, extra_headers={"X-Request-ID": request_id}
        )
        stream = await client.chat.completions.with_raw_response.create(
            model=CHAT_ALIAS,
            messages=HELLO,
            stream=True,
            extra_headers={"X-Request-ID": request_id},
        )
        await stream.parse().close()
    assert reply.headers["x-request-id"] == request_id
    assert reply.parse()._request_id == request_id
    assert stream.headers["x-request-id"] == request_id
    assert [r.header("X-Request-ID") for r in fake_openai.received] == [request_id] * 2


async def test_incoming_request_id_is_echoed_on_an_error(
    proxy: RunningProxy, tenant: Tenant
) -> None:
    async with proxy.openai(tenant.key) as client:
        with pytest.raises(openai.NotFoundError) as refused:
            await client.chat.completions.create(
                model="no-such-alias", messages=HELLO, extra_headers={"X-Request-ID": "abc-123"}
            )
    assert refused.value.response.headers["x-request-id"] == "abc-123"
    assert refused.value.request_id == "abc-123"


@pytest.mark.parametrize(
    "unusable", ["has spaces in it", "x" * 129, "semi;colon", ""], ids=str.__len__
)
async def test_unusable_request_id_is_replaced_by_a_fresh_one(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI, unusable: str
) -> None:
    async with proxy.http() as http:
        response = await http.post(
            "/v1/chat/completions",
            json={"model": CHAT_ALIAS, "messages": HELLO},
            headers=bearer(tenant.key, **{"X-Request-ID": unusable}),
        )
    assert response.status_code == 200
    assert GENERATED_ID.fullmatch(response.headers["x-request-id"])
    assert fake_openai.received[-1].header("X-Request-ID") == response.headers["x-request-id"]


async def test_traceparent_reaches_the_provider_unchanged(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    async with proxy.openai(tenant.key) as client:
        await client.chat.completions.create(
            model=CHAT_ALIAS, messages=HELLO, extra_headers={"traceparent": TRACEPARENT}
        )
        await client.embeddings.create(
            model=EMBEDDING_ALIAS, input="x", extra_headers={"traceparent": TRACEPARENT}
        )
    assert [r.header("traceparent") for r in fake_openai.received] == [TRACEPARENT] * 2


@pytest.mark.parametrize(
    "malformed",
    [
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "not a traceparent",
    ],
    ids=["upper-case", "no-flags", "garbage"],
)
async def test_malformed_traceparent_is_not_forwarded(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI, malformed: str
) -> None:
    async with proxy.openai(tenant.key) as client:
        reply = await client.chat.completions.create(
            model=CHAT_ALIAS, messages=HELLO, extra_headers={"traceparent": malformed}
        )
    assert reply.choices
    assert fake_openai.received[-1].header("traceparent") is None


async def test_virtual_key_and_client_headers_do_not_reach_the_provider(
    proxy: RunningProxy, tenant: Tenant, fake_openai: FakeOpenAI
) -> None:
    async with proxy.http() as http:
        response = await http.post(
            "/v1/chat/completions",
            json={"model": CHAT_ALIAS, "messages": HELLO},
            headers={"x-api-key": tenant.key, "Cookie": "session=secret", "X-Custom": "private"},
        )
    assert response.status_code == 200
    sent = {name.lower(): value for name, value in fake_openai.received[-1].headers.items()}
    assert tenant.key not in " ".join(sent.values())
    assert "cookie" not in sent
    assert "x-custom" not in sent
    assert "x-api-key" not in sent


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/healthz", 200),
        ("GET", "/startupz", 200),
        ("GET", "/v1/models", 401),
        ("GET", "/v1/nope", 404),
        ("DELETE", "/v1/embeddings", 405),
        ("GET", "/elsewhere", 404),
        ("POST", "/healthz", 405),
    ],
)
async def test_every_answer_carries_a_request_id(
    proxy: RunningProxy, method: str, path: str, status: int
) -> None:
    async with proxy.http() as http:
        response = await http.request(method, path)
    assert response.status_code == status, response.text
    assert GENERATED_ID.fullmatch(response.headers["x-request-id"])
    if status >= 400:
        openai_error(response, status, response.json()["error"]["code"])


async def test_litestar_405_names_the_allowed_methods(proxy: RunningProxy) -> None:
    async with proxy.http() as http:
        response = await http.post("/healthz")
    openai_error(response, 405, "method_not_allowed")
    assert "GET" in response.headers["allow"]

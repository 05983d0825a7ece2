"""One suite for every HTTP provider adapter, each run against a fake of its provider on loopback."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import msgspec
import openai
import pytest

import vkgate
from proxy.providers import (
    HttpClient,
    Operation,
    Provider,
    ProviderMisconfigured,
    ProviderTimeout,
    ProviderUnreachable,
    Timeouts,
    Upstream,
    WireFormat,
    registry,
)
from proxy.providers.base import Reply
from tests.support import fake_anthropic as fa
from tests.support.clock import ManualClock
from tests.support.fake_anthropic import FakeAnthropic, serve_fake_anthropic
from tests.support.fake_openai import API_KEY as OPENAI_KEY
from tests.support.fake_openai import Failure, FakeOpenAI, FakeProvider, serve_fake_openai
from tests.support.processes import free_port
from vkgate.wire import ChainTarget

HTTP_KINDS = ["openai", "openai_compatible", "azure_openai", "anthropic"]
HELLO: Any = [{"role": "user", "content": "hello"}]
AZURE_DEPLOYMENT = "gpt-4o-mini-prod"
AZURE_VERSION = "2024-10-21"


def client_like_the_proxys(first_byte_timeout_s: float) -> HttpClient:
    """Built as `proxy.app._provider_client` builds the proxy's, with short timeouts."""
    return HttpClient(
        Timeouts(connect_s=2, read_s=first_byte_timeout_s, total_s=30),
        user_agent=f"vkgate/{vkgate.__version__}",
    )


@pytest.fixture
async def http_client() -> AsyncIterator[HttpClient]:
    client = client_like_the_proxys(first_byte_timeout_s=10)
    yield client
    await client.close()


@pytest.fixture
async def impatient_client() -> AsyncIterator[HttpClient]:
    client = client_like_the_proxys(first_byte_timeout_s=0.2)
    yield client
    await client.close()


def adapter(kind: str, http_client: HttpClient) -> Provider:
    return registry(http_client, ManualClock())[kind]


@dataclass
class Subject:
    """One adapter compiled against a fake of its provider, and what it should send there."""

    kind: str
    fake: FakeProvider
    target: ChainTarget
    upstream: Upstream
    operation: Operation
    url: str
    credential: tuple[str, str]
    """The header carrying the provider key, as the provider expects it."""
    request: dict[str, Any]
    """A plain request in the provider's wire format."""
    http_client: HttpClient

    def body(self, **fields: Any) -> bytes:
        return json.dumps({**self.request, **fields}).encode()

    async def send(self, upstream: Upstream | None = None, **fields: Any) -> Reply:
        upstream = upstream or self.upstream
        return await upstream.adapter.send(
            upstream, self.operation, self.body(**fields), upstream.headers
        )

    def recompiled(self, http_client: HttpClient, **target: Any) -> Upstream:
        """This credential compiled again, on another client or with other target fields."""
        return adapter(self.kind, http_client).compile(
            msgspec.structs.replace(self.target, **target)
        )


def target(kind: str, base_url: str | None, model: str, api_key: str, **more: Any) -> ChainTarget:
    return ChainTarget(
        provider_id=f"prov-{kind}",
        provider_name=f"fake-{kind}",
        kind=kind,
        base_url=base_url,
        model=model,
        api_key=api_key,
        **more,
    )


def subject_for(kind: str, fake: FakeProvider, http_client: HttpClient) -> Subject:
    if kind == "anthropic":
        model = "claude-3-5-haiku-20241022"
        chain_target = target(kind, fake.url, model, fake.api_key)
        operation, url = Operation.MESSAGES, fake.url + "/v1/messages"
        credential = ("x-api-key", fake.api_key)
        request = {"model": model, "max_tokens": 64, "messages": HELLO}
    elif kind == "azure_openai":
        assert isinstance(fake, FakeOpenAI)
        endpoint = fake.azure_endpoint
        chain_target = target(
            kind, endpoint, AZURE_DEPLOYMENT, fake.api_key, api_version=AZURE_VERSION
        )
        operation = Operation.CHAT
        url = (
            f"{endpoint}/openai/deployments/{AZURE_DEPLOYMENT}/chat/completions"
            f"?api-version={AZURE_VERSION}"
        )
        credential = ("api-key", fake.api_key)
        request = {"model": AZURE_DEPLOYMENT, "messages": HELLO}
    else:
        model = "gpt-4o-mini-2024-07-18"
        chain_target = target(kind, fake.url, model, fake.api_key)
        operation, url = Operation.CHAT, fake.url + "/chat/completions"
        credential = ("Authorization", f"Bearer {fake.api_key}")
        request = {"model": model, "messages": HELLO}
    upstream = adapter(kind, http_client).compile(chain_target)
    return Subject(
        kind, fake, chain_target, upstream, operation, url, credential, request, http_client
    )


def serve_fake(kind: str) -> AbstractAsyncContextManager[FakeProvider]:
    return serve_fake_anthropic() if kind == "anthropic" else serve_fake_openai()


@pytest.fixture(params=HTTP_KINDS)
async def subject(
    request: pytest.FixtureRequest, http_client: HttpClient
) -> AsyncIterator[Subject]:
    async with serve_fake(request.param) as fake:
        yield subject_for(request.param, fake, http_client)


async def read_all(reply: Reply) -> bytes:
    try:
        return b"".join([chunk async for chunk in reply.chunks()])
    finally:
        reply.close()


# -- compile -------------------------------------------------------------------------------------


def test_compile_gives_the_providers_url_and_credential_header(subject: Subject) -> None:
    upstream = subject.upstream
    assert upstream.urls[subject.operation] == subject.url
    name, value = subject.credential
    assert upstream.headers[name] == value
    assert {k.lower(): v for k, v in upstream.headers.items()}["content-type"] == (
        "application/json"
    )
    assert upstream.model_json == json.dumps(subject.target.model).encode()
    assert upstream.provider_id == subject.target.provider_id
    anthropic_kind = subject.kind == "anthropic"
    assert upstream.wire is (WireFormat.ANTHROPIC if anthropic_kind else WireFormat.OPENAI)
    # Anthropic always reports usage in a stream; OpenAI's format must be asked.
    assert upstream.stream_usage is not anthropic_kind


def test_the_credential_stays_out_of_the_upstreams_repr(subject: Subject) -> None:
    assert subject.fake.api_key not in repr(subject.upstream)
    assert subject.fake.api_key not in str(subject.upstream)


# -- the provider's answers ----------------------------------------------------------------------


async def test_a_plain_send_returns_the_providers_status_body_and_content_type(
    subject: Subject,
) -> None:
    reply = await subject.send()
    try:
        body = json.loads(await reply.read())
    finally:
        reply.close()
    assert reply.status == 200
    assert reply.content_type.startswith(b"application/json")
    assert reply.retry_after is None
    if subject.kind == "anthropic":
        assert body["content"] == [{"type": "text", "text": fa.REPLY}]
    else:
        assert body["choices"][0]["message"]["content"]
    (received,) = subject.fake.received
    assert received.body == subject.body(), "the body goes out byte for byte"
    assert received.header(subject.credential[0]) == subject.credential[1]


async def test_a_stream_yields_the_providers_sse_bytes_unchanged(subject: Subject) -> None:
    reply = await subject.send(stream=True)
    data = await read_all(reply)
    assert reply.status == 200
    assert reply.content_type.startswith(b"text/event-stream")
    assert subject.fake.streamed, "the fake streamed something"
    assert data == b"".join(subject.fake.streamed)


@pytest.mark.parametrize("status", [400, 404, 429, 500, 503])
async def test_a_provider_error_is_a_reply_with_its_retry_after(
    subject: Subject, status: int
) -> None:
    subject.fake.fail_next(status, "the provider's own words", **{"Retry-After": "7"})
    reply = await subject.send()
    try:
        body = json.loads(await reply.read())
    finally:
        reply.close()
    assert reply.status == status
    assert reply.retry_after == b"7"
    assert body == subject.fake.error_body(status, "the provider's own words")


async def test_a_redirect_is_not_followed(subject: Subject) -> None:
    # Followed, this 307 would send the POST (and its credential) again, to wherever it points.
    subject.fake.failures.append(Failure(307, {}, {"Location": subject.url}))
    reply = await subject.send()
    reply.close()
    assert reply.status == 307
    assert len(subject.fake.received) == 1


async def test_closing_a_reply_mid_stream_ends_the_providers_request(subject: Subject) -> None:
    # What lets a client that went away stop paying for the rest of a long answer.
    subject.fake.stream_events, subject.fake.chunk_delay_s = 500, 0.01
    reply = await subject.send(stream=True)
    async for _ in reply.chunks():
        break
    reply.close()
    await asyncio.wait_for(subject.fake.stream_cancelled.wait(), 5)


# -- a provider that fails -----------------------------------------------------------------------


async def test_a_provider_stalling_past_the_read_timeout_raises_provider_timeout(
    subject: Subject, impatient_client: HttpClient
) -> None:
    subject.fake.hold = asyncio.Event()
    upstream = subject.recompiled(impatient_client)
    try:
        with pytest.raises(ProviderTimeout):
            await subject.send(upstream)
    finally:
        subject.fake.hold.set()


async def test_a_refused_connection_raises_provider_unreachable(subject: Subject) -> None:
    assert subject.target.base_url is not None
    origin = "/".join(subject.target.base_url.split("/")[:3])
    closed = subject.target.base_url.replace(origin, f"http://127.0.0.1:{free_port()}")
    upstream = subject.recompiled(subject.http_client, base_url=closed)
    with pytest.raises(ProviderUnreachable):
        await subject.send(upstream)
    assert subject.fake.received == []


async def test_a_stream_cut_midway_raises_provider_unreachable_from_chunks(
    subject: Subject,
) -> None:
    subject.fake.break_after_events = 2
    reply = await subject.send(stream=True)
    assert reply.status == 200
    got = b""
    try:
        with pytest.raises(ProviderUnreachable):
            async for chunk in reply.chunks():
                got += chunk
    finally:
        reply.close()
    sent = b"".join(subject.fake.streamed)
    assert len(subject.fake.streamed) == 2
    # What arrived before the cut, if any, is what the provider sent: nothing made up.
    assert sent.startswith(got)


# -- what each adapter declares ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["azure_openai", "openai_compatible"])
def test_a_kind_without_a_default_address_refuses_to_compile_without_base_url(
    kind: str, http_client: HttpClient
) -> None:
    with pytest.raises(ProviderMisconfigured, match="base_url"):
        adapter(kind, http_client).compile(target(kind, None, "some-model", "sk-some"))


def test_openai_defaults_to_openais_own_address(http_client: HttpClient) -> None:
    upstream = adapter("openai", http_client).compile(target("openai", None, "gpt-4o", "sk-x"))
    assert upstream.urls == {
        Operation.CHAT: "https://api.openai.com/v1/chat/completions",
        Operation.EMBEDDINGS: "https://api.openai.com/v1/embeddings",
        Operation.SPEECH: "https://api.openai.com/v1/audio/speech",
        Operation.TRANSCRIPTION: "https://api.openai.com/v1/audio/transcriptions",
        Operation.TRANSLATION: "https://api.openai.com/v1/audio/translations",
        Operation.IMAGE_GENERATION: "https://api.openai.com/v1/images/generations",
        Operation.IMAGE_EDIT: "https://api.openai.com/v1/images/edits",
        Operation.RESPONSES: "https://api.openai.com/v1/responses",
    }


def test_a_provider_without_the_responses_api_has_no_responses_url(
    http_client: HttpClient,
) -> None:
    for kind, base in (("openai_compatible", "http://vllm:8000/v1"), ("azure_openai", "https://a")):
        declared = target(kind, base, "m", "sk-x", responses_api=False, api_version="2024-10-21")
        upstream = adapter(kind, http_client).compile(declared)
        assert Operation.RESPONSES not in upstream.urls
        assert Operation.CHAT in upstream.urls


def test_azure_names_the_deployment_in_the_path_with_a_default_api_version(
    http_client: HttpClient,
) -> None:
    upstream = adapter("azure_openai", http_client).compile(
        target("azure_openai", "https://acme.openai.azure.com/", "team a/gpt-4o", "azure-key")
    )
    deployment = "https://acme.openai.azure.com/openai/deployments/team%20a%2Fgpt-4o"
    version = "?api-version=2024-10-21"
    assert upstream.urls == {
        Operation.CHAT: f"{deployment}/chat/completions{version}",
        Operation.EMBEDDINGS: f"{deployment}/embeddings{version}",
        Operation.SPEECH: f"{deployment}/audio/speech{version}",
        Operation.TRANSCRIPTION: f"{deployment}/audio/transcriptions{version}",
        Operation.TRANSLATION: f"{deployment}/audio/translations{version}",
        Operation.IMAGE_GENERATION: f"{deployment}/images/generations{version}",
        Operation.IMAGE_EDIT: f"{deployment}/images/edits{version}",
        Operation.CHAT: f"{deployment}/chat/completions?api-version=2024-10-21",
        Operation.EMBEDDINGS: f"{deployment}/embeddings?api-version=2024-10-21",
        # Not under the deployment, and at a version that serves it.
        Operation.RESPONSES: (
            "https://acme.openai.azure.com/openai/responses?api-version=2025-04-01-preview"
        ),
    }
    assert upstream.headers == {"Content-Type": "application/json", "api-key": "azure-key"}


def test_azure_keeps_a_credentials_api_version_that_serves_the_responses_api(
    http_client: HttpClient,
) -> None:
    for version, used in (
        ("2025-03-01-preview", "2025-03-01-preview"),
        ("2026-01-01", "2026-01-01"),
        ("2024-12-01-preview", "2025-04-01-preview"),
        ("preview", "2025-04-01-preview"),
    ):
        upstream = adapter("azure_openai", http_client).compile(
            target("azure_openai", "https://a.example", "d", "k", api_version=version)
        )
        assert upstream.urls[Operation.RESPONSES].endswith(f"?api-version={used}")


def test_anthropic_defaults_to_its_root_and_version_and_keeps_extra_headers(
    http_client: HttpClient,
) -> None:
    upstream = adapter("anthropic", http_client).compile(
        target(
            "anthropic",
            None,
            "claude-3-5-haiku-20241022",
            "sk-ant-x",
            headers={"Anthropic-Beta": "prompt-caching-2024-07-31"},
        )
    )
    assert upstream.urls == {Operation.MESSAGES: "https://api.anthropic.com/v1/messages"}
    assert upstream.headers == {
        "content-type": "application/json",
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "prompt-caching-2024-07-31",
        "x-api-key": "sk-ant-x",
    }


def test_anthropic_takes_the_credentials_api_version(http_client: HttpClient) -> None:
    upstream = adapter("anthropic", http_client).compile(
        target("anthropic", None, "claude-2.1", "sk-ant-x", api_version="2023-01-01")
    )
    assert upstream.headers["anthropic-version"] == "2023-01-01"


@pytest.mark.parametrize("kind", ["openai", "openai_compatible", "azure_openai"])
async def test_embeddings_reach_the_providers_embeddings_route(
    kind: str, http_client: HttpClient
) -> None:
    async with serve_fake_openai() as fake:
        subject = subject_for(kind, fake, http_client)
        body = json.dumps({"model": subject.target.model, "input": ["one", "two"]}).encode()
        upstream = subject.upstream
        reply = await upstream.adapter.send(upstream, Operation.EMBEDDINGS, body, upstream.headers)
        try:
            answer = json.loads(await reply.read())
        finally:
            reply.close()
    assert reply.status == 200
    assert [item["index"] for item in answer["data"]] == [0, 1]
    (received,) = fake.received
    assert received.body == body
    assert received.path.endswith("/embeddings")


# -- the fakes themselves: other tests rely on them answering as the real providers do ------------


def anthropic_sdk(fake: FakeAnthropic) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=fake.url, api_key=fake.api_key, max_retries=0)


WEATHER_TOOL: Any = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


async def test_fake_anthropic_answers_the_sdk_with_a_message_and_settable_usage(
    fake_anthropic: FakeAnthropic,
) -> None:
    fake_anthropic.input_tokens, fake_anthropic.output_tokens = 21, 9
    fake_anthropic.cache_creation_input_tokens, fake_anthropic.cache_read_input_tokens = 5, 3
    async with anthropic_sdk(fake_anthropic) as client:
        message = await client.messages.create(
            model="claude-3-5-haiku-20241022", max_tokens=64, messages=HELLO
        )
    assert message.id.startswith("msg_")
    assert message.model == "claude-3-5-haiku-20241022"
    assert [(b.type, getattr(b, "text", None)) for b in message.content] == [("text", fa.REPLY)]
    assert message.stop_reason == "end_turn"
    usage = message.usage
    assert (usage.input_tokens, usage.output_tokens) == (21, 9)
    assert (usage.cache_creation_input_tokens, usage.cache_read_input_tokens) == (5, 3)
    (received,) = fake_anthropic.received
    assert received.path == "/v1/messages"
    assert received.header("anthropic-version")


async def test_fake_anthropic_streams_the_events_anthropic_sends(
    fake_anthropic: FakeAnthropic,
) -> None:
    async with (
        anthropic_sdk(fake_anthropic) as client,
        client.messages.stream(
            model="claude-3-5-haiku-20241022", max_tokens=64, messages=HELLO
        ) as stream,
    ):
        message = await stream.get_final_message()
    assert [(b.type, getattr(b, "text", None)) for b in message.content] == [("text", fa.REPLY)]
    assert message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (11, 7)
    names = [event.split(b"\n", 1)[0] for event in fake_anthropic.streamed]
    assert names == [
        b"event: message_start",
        b"event: content_block_start",
        b"event: ping",
        *[b"event: content_block_delta"] * len(fa.REPLY_PIECES),
        b"event: content_block_stop",
        b"event: message_delta",
        b"event: message_stop",
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_fake_anthropic_calls_the_first_tool_then_answers_its_result(
    fake_anthropic: FakeAnthropic, stream: bool
) -> None:
    model = "claude-3-5-haiku-20241022"
    message: anthropic.types.Message
    async with anthropic_sdk(fake_anthropic) as client:
        if stream:
            async with client.messages.stream(
                model=model, max_tokens=64, messages=HELLO, tools=[WEATHER_TOOL]
            ) as events:
                message = await events.get_final_message()
        else:
            message = await client.messages.create(
                model=model, max_tokens=64, messages=HELLO, tools=[WEATHER_TOOL]
            )
        (call,) = message.content
        assert call.type == "tool_use"
        assert call.id.startswith("toolu_")
        assert (call.name, call.input) == ("get_weather", fa.TOOL_INPUT)
        assert message.stop_reason == "tool_use"
        result = [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}]
        turns: Any = [
            *HELLO,
            {"role": "assistant", "content": [call.model_dump()]},
            {"role": "user", "content": result},
        ]
        answer = await client.messages.create(
            model=model, max_tokens=64, tools=[WEATHER_TOOL], messages=turns
        )
    assert answer.stop_reason == "end_turn"
    assert answer.content[0].type == "text"


@pytest.mark.parametrize(
    ("headers", "status", "kind"),
    [
        ({"anthropic-version": "2023-06-01"}, 401, "authentication_error"),
        (
            {"x-api-key": "sk-ant-wrong", "anthropic-version": "2023-06-01"},
            401,
            "authentication_error",
        ),
        ({"x-api-key": fa.API_KEY}, 400, "invalid_request_error"),
    ],
    ids=["no-key", "wrong-key", "no-version"],
)
async def test_fake_anthropic_refuses_bad_headers_as_anthropic_does(
    fake_anthropic: FakeAnthropic, headers: dict[str, str], status: int, kind: str
) -> None:
    async with httpx.AsyncClient(base_url=fake_anthropic.url) as http:
        response = await http.post(
            "/v1/messages",
            json={"model": "claude-3-5-haiku-20241022", "max_tokens": 8, "messages": HELLO},
            headers=headers,
        )
    assert response.status_code == status
    body = response.json()
    assert body == {"type": "error", "error": {"type": kind, "message": body["error"]["message"]}}


@pytest.mark.parametrize(
    ("drop", "replace", "field"),
    [
        ("max_tokens", {}, "max_tokens"),
        ("model", {}, "model"),
        (None, {"messages": []}, "messages"),
        (None, {"max_tokens": 0}, "max_tokens"),
    ],
    ids=["no-max-tokens", "no-model", "no-messages", "zero-max-tokens"],
)
async def test_fake_anthropic_refuses_a_body_anthropic_refuses(
    fake_anthropic: FakeAnthropic, drop: str | None, replace: dict[str, Any], field: str
) -> None:
    request: dict[str, Any] = {
        "model": "claude-3-5-haiku-20241022",
        "max_tokens": 8,
        "messages": HELLO,
        **replace,
    }
    request.pop(drop or "", None)
    async with httpx.AsyncClient(base_url=fake_anthropic.url) as http:
        response = await http.post(
            "/v1/messages",
            json=request,
            headers={"x-api-key": fake_anthropic.api_key, "anthropic-version": "2023-06-01"},
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith(field)


@pytest.mark.parametrize(
    ("status", "kind"),
    [(429, "rate_limit_error"), (500, "api_error"), (529, "overloaded_error")],
)
async def test_fake_anthropic_failures_reach_the_sdk_as_anthropics_errors(
    fake_anthropic: FakeAnthropic, status: int, kind: str
) -> None:
    fake_anthropic.fail_next(status, "not now", **{"retry-after": "4"})
    async with anthropic_sdk(fake_anthropic) as client:
        with pytest.raises(anthropic.APIStatusError) as refused:
            await client.messages.create(
                model="claude-3-5-haiku-20241022", max_tokens=8, messages=HELLO
            )
    assert refused.value.status_code == status
    assert refused.value.response.headers["retry-after"] == "4"
    assert refused.value.body == {"type": "error", "error": {"type": kind, "message": "not now"}}


@pytest.fixture
async def fake_azure() -> AsyncIterator[FakeOpenAI]:
    async with serve_fake_openai() as fake:
        yield fake


def azure_sdk(fake: FakeOpenAI) -> openai.AsyncAzureOpenAI:
    return openai.AsyncAzureOpenAI(
        azure_endpoint=fake.azure_endpoint,
        api_key=fake.api_key,
        api_version=AZURE_VERSION,
        max_retries=0,
    )


async def test_fake_azure_answers_the_azure_sdk_on_its_deployment_routes(
    fake_azure: FakeOpenAI,
) -> None:
    async with azure_sdk(fake_azure) as client:
        completion = await client.chat.completions.create(model=AZURE_DEPLOYMENT, messages=HELLO)
        stream = await client.chat.completions.create(
            model=AZURE_DEPLOYMENT,
            messages=HELLO,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        embedding = await client.embeddings.create(model=AZURE_DEPLOYMENT, input="hello")
    assert completion.choices[0].message.content
    assert chunks[-1].usage is not None
    assert len(embedding.data) == 1
    chat, streamed, embedded = fake_azure.received
    deployment = f"/openai/deployments/{AZURE_DEPLOYMENT}"
    assert [chat.path, streamed.path, embedded.path] == [
        f"{deployment}/chat/completions",
        f"{deployment}/chat/completions",
        f"{deployment}/embeddings",
    ]
    assert chat.query == {"api-version": AZURE_VERSION}
    assert chat.header("api-key") == fake_azure.api_key


@pytest.mark.parametrize(
    ("query", "headers", "status", "code"),
    [
        ("", {"api-key": OPENAI_KEY}, 404, "404"),
        (f"?api-version={AZURE_VERSION}", {"api-key": "wrong"}, 401, "401"),
        (f"?api-version={AZURE_VERSION}", {"Authorization": f"Bearer {OPENAI_KEY}"}, 401, "401"),
    ],
    ids=["no-api-version", "wrong-key", "bearer-instead-of-api-key"],
)
async def test_fake_azure_refuses_as_azure_does(
    fake_azure: FakeOpenAI, query: str, headers: dict[str, str], status: int, code: str
) -> None:
    async with httpx.AsyncClient(base_url=fake_azure.azure_endpoint) as http:
        response = await http.post(
            f"/openai/deployments/{AZURE_DEPLOYMENT}/chat/completions{query}",
            json={"messages": HELLO},
            headers=headers,
        )
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"code", "message"}
    assert error["code"] == code


async def test_fake_azure_knows_only_its_deployments_once_told_them(
    fake_azure: FakeOpenAI,
) -> None:
    fake_azure.azure_deployments = {AZURE_DEPLOYMENT}
    async with azure_sdk(fake_azure) as client:
        await client.chat.completions.create(model=AZURE_DEPLOYMENT, messages=HELLO)
        with pytest.raises(openai.NotFoundError) as refused:
            await client.chat.completions.create(model="no-such-deployment", messages=HELLO)
    assert refused.value.code == "DeploymentNotFound"

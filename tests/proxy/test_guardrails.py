"""Guardrails through the official SDKs: each kind and action on the request and the response
stage, what the provider and the client see, streams redacted through the window and blocked
mid-way, slow webhooks under each `on_error`, and what the spend record says of each check."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pytest
from google import genai
from google.genai import types

from tests.proxy.conftest import (
    CHAT_ALIAS,
    EMBEDDING_ALIAS,
    RunningProxy,
    Tenant,
    add_key,
    add_provider,
    make_tenant,
)
from tests.proxy.outcome_support import outcomes
from tests.support.api import ADMIN, create
from tests.support.fake_gemini import FakeGemini
from tests.support.fake_openai import REPLY, FakeOpenAI
from tests.support.fake_webhook import SECRET, FakeWebhook, serve_fake_webhook
from vkgate.spend import SpendRecord

EMAIL = "jane.doe@example.com"
CARD = "4111 1111 1111 1111"
AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
OPENAI_KEY = "sk-proj-Zq3xT9bW2mK7vN4pL8rY1cD6"
_names = itertools.count(1)


def said(text: str) -> Any:
    return [{"role": "user", "content": text}]


@dataclass
class Guarded:
    proxy: RunningProxy
    tenant: Tenant
    client: httpx.AsyncClient
    fake: FakeOpenAI
    webhook: FakeWebhook

    async def key(self, *guardrails: dict[str, Any]) -> str:
        """A key of a project of its own, under `guardrails` scoped to that project."""
        project = await create(
            self.client,
            "/api/admin/projects",
            {"organization_id": self.tenant.org, "name": f"guarded-{next(_names)}"},
        )
        for fields in guardrails:
            body = {
                "organization_id": self.tenant.org,
                "scope": {"kind": "project", "id": project["id"]},
                "name": f"{fields['kind']}-{next(_names)}",
                **fields,
            }
            await create(self.client, "/api/admin/guardrails", body)
        tenant = Tenant(
            self.tenant.org, project["id"], self.tenant.provider, self.tenant.policy, "", ""
        )
        return (await add_key(self.client, tenant))[1]

    def openai(self, key: str) -> openai.AsyncOpenAI:
        return self.proxy.openai(key)

    def anthropic(self, key: str) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(
            base_url=self.proxy.url.removesuffix("/v1"), api_key=key, max_retries=0, timeout=10
        )

    async def outcomes(self) -> list[SpendRecord]:
        """The outcome records the proxy wrote, through the ledger."""
        return await outcomes(self.proxy, self.client, self.tenant.org)

    async def last(self) -> SpendRecord:
        return (await self.outcomes())[-1]

    def received_text(self) -> str:
        return "\n".join(r.body.decode() for r in self.fake.received)


@pytest.fixture
async def webhook() -> AsyncIterator[FakeWebhook]:
    async with serve_fake_webhook() as fake:
        yield fake


@pytest.fixture
async def guarded(
    client: httpx.AsyncClient, proxy: RunningProxy, fake_openai: FakeOpenAI, webhook: FakeWebhook
) -> Guarded:
    tenant = await make_tenant(client, fake_openai.url, fake_openai.api_key)
    return Guarded(proxy, tenant, client, fake_openai, webhook)


def only(record: SpendRecord) -> dict[str, str]:
    """The record's guardrail outcomes, by stage, without the generated names."""
    return {
        f"{k.partition(':')[0]}:{k.split(':')[1].rsplit('-', 1)[0]}": v
        for k, v in record.guardrails.items()
    }


# Request stage


async def test_a_redacted_email_never_reaches_the_provider(guarded: Guarded) -> None:
    key = await guarded.key({"kind": "pii", "stage": "request", "action": "redact"})
    async with guarded.openai(key) as sdk:
        reply = await sdk.chat.completions.create(
            model=CHAT_ALIAS, messages=said(f"Mail {EMAIL} and call +1 415-555-0100 today")
        )
    assert reply.choices[0].message.content == REPLY
    [received] = guarded.fake.received
    assert received.json()["messages"] == said(
        "Mail [REDACTED:email] and call [REDACTED:phone] today"
    )
    assert EMAIL not in received.body.decode()
    record = await guarded.last()
    assert record.kind == "confirm" and only(record) == {"request:pii": "redacted"}
    tally = guarded.proxy.metrics.guardrails.counts()
    assert any(k[1:] == ("request", "redacted") for k in tally)


async def test_a_blocked_request_answers_in_anthropics_shape_without_echoing(
    guarded: Guarded,
) -> None:
    key = await guarded.key(
        {
            "kind": "pii",
            "stage": "request",
            "action": "block",
            "config": {"entities": ["credit_card"]},
        }
    )
    async with guarded.anthropic(key) as sdk:
        with pytest.raises(anthropic.BadRequestError) as refused:
            await sdk.messages.create(
                model=CHAT_ALIAS, max_tokens=50, messages=said(f"my card is {CARD}")
            )
        # A number that fails the Luhn check is no card.
        await sdk.messages.create(
            model=CHAT_ALIAS, max_tokens=50, messages=said("order 4111 1111 1111 1112")
        )
    body = refused.value.response.json()
    assert body["type"] == "error"
    assert body["error"]["code"] == "guardrail_blocked"
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["stage"] == "request"
    assert body["error"]["guardrail"].startswith("pii-")
    assert CARD not in refused.value.response.text and "4111" not in refused.value.response.text
    assert len(guarded.fake.received) == 1, "the blocked request never reached the provider"
    blocked, passed = await guarded.outcomes()
    assert (blocked.status, blocked.error_code, blocked.refused) == (400, "guardrail_blocked", True)
    assert only(blocked) == {"request:pii": "blocked"}
    assert only(passed) == {"request:pii": "passed"}


async def test_warn_lets_a_secret_through_with_a_header(guarded: Guarded) -> None:
    key = await guarded.key({"kind": "secrets", "stage": "request", "action": "warn"})
    async with guarded.openai(key) as sdk:
        raw = await sdk.chat.completions.with_raw_response.create(
            model=CHAT_ALIAS, messages=said(f"why does {AWS_KEY} not work?")
        )
    assert raw.headers["x-vkgate-guardrail-warning"].startswith("secrets-")
    assert AWS_KEY in guarded.received_text(), "warn changes nothing that is sent"
    assert only(await guarded.last()) == {"request:secrets": "warned"}


async def test_regex_redacts_the_responses_apis_input(guarded: Guarded) -> None:
    key = await guarded.key(
        {
            "kind": "regex",
            "stage": "request",
            "action": "redact",
            "config": {"patterns": {"project_code": r"\bPRJ-\d{4}\b"}},
        }
    )
    async with guarded.openai(key) as sdk:
        await sdk.responses.create(
            model=CHAT_ALIAS,
            instructions="never say PRJ-0001",
            input=[{"role": "user", "content": [{"type": "input_text", "text": "on PRJ-4242?"}]}],
        )
    sent = guarded.fake.received[-1].json()
    assert sent["instructions"] == "never say [REDACTED:project_code]"
    assert sent["input"][0]["content"][0]["text"] == "on [REDACTED:project_code]?"


async def test_a_pattern_that_backtracks_without_end_is_cut_short(guarded: Guarded) -> None:
    key = await guarded.key(
        {
            "kind": "regex",
            "stage": "request",
            "action": "block",
            "on_error": "allow",
            "config": {"patterns": {"evil": r"^(a|aa)+$"}},
        }
    )
    async with guarded.openai(key) as sdk:
        await sdk.chat.completions.create(model=CHAT_ALIAS, messages=said("a" * 60 + "b"))
    assert only(await guarded.last()) == {"request:regex": "skipped"}


async def test_embeddings_input_is_screened_and_their_answer_skipped(guarded: Guarded) -> None:
    key = await guarded.key({"kind": "pii", "stage": "both", "action": "redact"})
    async with guarded.openai(key) as sdk:
        await sdk.embeddings.create(model=EMBEDDING_ALIAS, input=[f"to {EMAIL}", "plain"])
    assert guarded.fake.received[-1].json()["input"] == ["to [REDACTED:email]", "plain"]
    assert only(await guarded.last()) == {"request:pii": "redacted", "response:pii": "skipped"}


# Response stage


async def test_a_plain_answer_is_redacted_before_the_client_sees_it(guarded: Guarded) -> None:
    guarded.fake.reply_pieces = (f"Write to {EMAIL}", " anytime.")
    key = await guarded.key({"kind": "pii", "stage": "response", "action": "redact"})
    async with guarded.openai(key) as sdk:
        reply = await sdk.chat.completions.create(model=CHAT_ALIAS, messages=said("who?"))
    assert reply.choices[0].message.content == "Write to [REDACTED:email] anytime."
    assert only(await guarded.last()) == {"response:pii": "redacted"}


async def test_a_blocked_answer_is_refused_and_its_spend_still_recorded(guarded: Guarded) -> None:
    guarded.fake.reply_pieces = ("The launch code is ", "PRJ-9999", ".")
    key = await guarded.key(
        {
            "kind": "regex",
            "stage": "response",
            "action": "block",
            "config": {"patterns": {"code": r"PRJ-\d+"}},
        }
    )
    async with guarded.openai(key) as sdk:
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.chat.completions.create(model=CHAT_ALIAS, messages=said("code?"))
    error = refused.value.response.json()["error"]
    assert (error["code"], error["stage"]) == ("guardrail_blocked", "response")
    assert "PRJ" not in refused.value.response.text
    record = await guarded.last()
    assert (record.kind, record.status, record.refused) == ("fail", 400, False)
    assert (record.input_tokens, record.output_tokens) == (11, 7), "the provider was paid"
    assert only(record) == {"response:regex": "blocked"}


async def test_a_stream_is_redacted_through_the_window(guarded: Guarded) -> None:
    filler = tuple(f"word{i} " for i in range(150))
    split_email = ("Write to jane", ".doe@exa", "mple.com today. ")
    guarded.fake.reply_pieces = (*filler, *split_email, *filler)
    key = await guarded.key({"kind": "pii", "stage": "response", "action": "redact"})
    async with guarded.openai(key) as sdk:
        stream = await sdk.chat.completions.create(
            model=CHAT_ALIAS, messages=said("hi"), stream=True
        )
        chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    whole = "".join(filler)
    assert text == whole + "Write to [REDACTED:email] today. " + whole
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert only(await guarded.last()) == {"response:pii": "redacted"}


async def test_a_stream_blocked_mid_way_ends_with_an_error_event(guarded: Guarded) -> None:
    filler = tuple(f"safe{i} " for i in range(200))
    guarded.fake.reply_pieces = (*filler, "use ", OPENAI_KEY, " now", *filler)
    key = await guarded.key({"kind": "secrets", "stage": "response", "action": "block"})
    received: list[str] = []
    async with guarded.openai(key) as sdk:
        stream = await sdk.chat.completions.create(
            model=CHAT_ALIAS, messages=said("hi"), stream=True
        )
        with pytest.raises(openai.APIError) as ended:
            async for chunk in stream:
                if chunk.choices:
                    received.append(chunk.choices[0].delta.content or "")
    text = "".join(received)
    assert text, "what came before the window went on"
    assert text == "".join(filler)[: len(text)]
    assert "sk-proj" not in text
    assert "guardrail" in str(ended.value.message)
    record = await guarded.last()
    assert (record.kind, record.status, record.error_code) == ("confirm", 200, "guardrail_blocked")
    assert only(record) == {"response:secrets": "blocked"}


async def test_an_anthropic_stream_blocked_mid_way_ends_with_anthropics_error_event(
    guarded: Guarded,
) -> None:
    guarded.fake.reply_pieces = ("all fine ", "until ", AWS_KEY, " shows up")
    key = await guarded.key({"kind": "secrets", "stage": "response", "action": "block"})
    async with guarded.anthropic(key) as sdk:
        with pytest.raises(anthropic.APIStatusError) as ended:
            async with sdk.messages.stream(
                model=CHAT_ALIAS, max_tokens=50, messages=said("hi")
            ) as stream:
                async for _ in stream:
                    pass
    assert ended.value.body["error"]["code"] == "guardrail_blocked"  # type: ignore[index]
    assert AWS_KEY not in json.dumps(ended.value.body)


# Webhook and moderation


async def test_a_webhook_is_signed_and_its_redaction_is_what_the_provider_gets(
    guarded: Guarded,
) -> None:
    guarded.webhook.answer = lambda call: {
        "action": "redact",
        "texts": [t.replace("Acme", "[REDACTED:customer]") for t in call["texts"]],
    }
    key = await guarded.key(
        {
            "kind": "webhook",
            "stage": "request",
            "action": "redact",
            "config": {"url": guarded.webhook.url},
            "secret": SECRET,
        }
    )
    async with guarded.openai(key) as sdk:
        await sdk.chat.completions.create(model=CHAT_ALIAS, messages=said("Acme owes us"))
    [call] = guarded.webhook.calls
    assert (call["stage"], call["model"], call["texts"]) == (
        "request",
        CHAT_ALIAS,
        ["Acme owes us"],
    )
    assert guarded.webhook.forged == 0
    assert guarded.fake.received[-1].json()["messages"] == said("[REDACTED:customer] owes us")
    assert only(await guarded.last()) == {"request:webhook": "redacted"}


async def test_a_webhook_block_on_the_response(guarded: Guarded) -> None:
    guarded.webhook.answer = lambda call: {
        "action": "block" if "upstream" in " ".join(call["texts"]) else "allow"
    }
    key = await guarded.key(
        {
            "kind": "webhook",
            "stage": "both",
            "config": {"url": guarded.webhook.url},
            "secret": SECRET,
        }
    )
    async with guarded.openai(key) as sdk:
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.chat.completions.create(model=CHAT_ALIAS, messages=said("hi"))
    assert refused.value.response.json()["error"]["stage"] == "response"
    assert [c["stage"] for c in guarded.webhook.calls] == ["request", "response"]
    assert only(await guarded.last()) == {
        "request:webhook": "passed",
        "response:webhook": "blocked",
    }


@pytest.mark.parametrize("on_error", ["allow", "block"])
async def test_a_slow_webhook_follows_on_error(guarded: Guarded, on_error: str) -> None:
    guarded.webhook.hang = asyncio.Event()
    key = await guarded.key(
        {
            "kind": "webhook",
            "stage": "request",
            "on_error": on_error,
            "timeout_ms": 200,
            "config": {"url": guarded.webhook.url},
            "secret": SECRET,
        }
    )
    async with guarded.openai(key) as sdk:
        if on_error == "allow":
            await sdk.chat.completions.create(model=CHAT_ALIAS, messages=said("hi"))
        else:
            with pytest.raises(openai.BadRequestError) as refused:
                await sdk.chat.completions.create(model=CHAT_ALIAS, messages=said("hi"))
            assert "could not be checked" in refused.value.response.json()["error"]["message"]
    assert len(guarded.webhook.calls) == 1
    assert len(guarded.fake.received) == (1 if on_error == "allow" else 0)
    outcome = "skipped" if on_error == "allow" else "blocked"
    assert only(await guarded.last()) == {"request:webhook": outcome}


async def test_moderation_blocks_what_its_provider_flags(guarded: Guarded) -> None:
    key = await guarded.key(
        {
            "kind": "moderation",
            "stage": "request",
            "config": {"provider_id": guarded.tenant.provider, "thresholds": {"violence": 0.5}},
        }
    )
    async with guarded.openai(key) as sdk:
        await sdk.chat.completions.create(model=CHAT_ALIAS, messages=said("a kind word"))
        with pytest.raises(openai.BadRequestError):
            await sdk.chat.completions.create(model=CHAT_ALIAS, messages=said("KILL it"))
    moderations = [r for r in guarded.fake.received if r.path == "/v1/moderations"]
    assert [m.json()["input"] for m in moderations] == [["a kind word"], ["KILL it"]]
    assert [r.path for r in guarded.fake.received].count("/v1/chat/completions") == 1
    passed, blocked = (only(r) for r in await guarded.outcomes())
    assert (passed, blocked) == (
        {"request:moderation": "passed"},
        {"request:moderation": "blocked"},
    )


async def test_a_key_without_guardrails_records_none(guarded: Guarded) -> None:
    key = await guarded.key()
    async with guarded.openai(key) as sdk:
        await sdk.chat.completions.create(model=CHAT_ALIAS, messages=said(f"to {EMAIL}"))
    assert (await guarded.last()).guardrails == {}
    assert EMAIL in guarded.received_text()


async def test_a_new_guardrail_reaches_the_proxy_through_the_change_feed(
    guarded: Guarded,
) -> None:
    key = await guarded.key()
    async with guarded.openai(key) as sdk:
        await sdk.chat.completions.create(model=CHAT_ALIAS, messages=said("hi"))
    await guarded.proxy.following_changes()
    await create(
        guarded.client,
        "/api/admin/guardrails",
        {
            "organization_id": guarded.tenant.org,
            "name": "late",
            "kind": "pii",
            "stage": "request",
            "action": "block",
        },
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5.0
    async with guarded.openai(key) as sdk:
        while True:
            try:
                await sdk.chat.completions.create(model=CHAT_ALIAS, messages=said(f"to {EMAIL}"))
            except openai.BadRequestError:
                break
            assert loop.time() < deadline, "the guardrail never reached the proxy"
            await asyncio.sleep(0.02)
    listed = await guarded.client.get("/api/admin/guardrails", headers=ADMIN)
    assert [g["name"] for g in listed.json()["data"]] == ["late"]


async def test_a_responses_stream_is_redacted_in_its_deltas_and_its_whole_texts(
    guarded: Guarded,
) -> None:
    key = await guarded.key(
        {
            "kind": "regex",
            "stage": "response",
            "action": "redact",
            "config": {"patterns": {"who": r"fake upstream"}},
        }
    )
    async with guarded.openai(key) as sdk:
        stream = await sdk.responses.create(model=CHAT_ALIAS, input="hi", stream=True)
        events = [event async for event in stream]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == "Hi there! I am the [REDACTED:who]."
    completed = next(e for e in events if e.type == "response.completed")
    assert completed.response.output_text == deltas
    assert all("fake upstream" not in e.model_dump_json() for e in events)
    assert only(await guarded.last()) == {"response:regex": "redacted"}


async def test_the_gemini_apis_contents_are_redacted_before_google_sees_them(
    guarded: Guarded, fake_gemini: FakeGemini
) -> None:
    provider = await add_provider(
        guarded.client,
        guarded.tenant.org,
        "studio",
        fake_gemini.url,
        fake_gemini.api_key,
        kind="gemini",
    )
    policy = await create(
        guarded.client,
        "/api/admin/routing-policies",
        {
            "organization_id": guarded.tenant.org,
            "name": "gemini",
            "aliases": {"gemini": [{"provider_id": provider, "model": "gemini-2.5-flash"}]},
        },
    )
    guarded.tenant.policy = policy["id"]
    key = await guarded.key({"kind": "pii", "stage": "request", "action": "redact"})
    client = genai.Client(
        api_key=key,
        http_options=types.HttpOptions(
            base_url=guarded.proxy.url.removesuffix("/v1"),
            api_version="v1beta",
            timeout=30_000,
            retry_options=types.HttpRetryOptions(attempts=1),
        ),
    )
    try:
        await client.aio.models.generate_content(model="gemini", contents=f"mail {EMAIL}")
    finally:
        await client.aio.aclose()
    [sent] = fake_gemini.received
    assert sent.json()["contents"][0]["parts"][0]["text"] == "mail [REDACTED:email]"

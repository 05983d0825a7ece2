"""The response cache and response guardrails together, through the official SDK: an entry
holds the answer as the client got it (redacted), an answer a guardrail cut short is never
stored, and a hit's replay passes the key's response guardrails as they stand now."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from tests.proxy.conftest import CHAT_ALIAS
from tests.proxy.test_guardrails import EMAIL, OPENAI_KEY, Guarded, guarded, only, said, webhook
from tests.support.api import create

__all__ = ["guarded", "webhook"]  # the guardrails' tests' fixtures

REDACTED = "Write to [REDACTED:email] anytime."


@pytest.fixture
async def cached(guarded: Guarded) -> Guarded:
    """`guarded`, with a cache rule over its organization's chat alias."""
    await create(
        guarded.client,
        "/api/admin/cache-rules",
        {
            "organization_id": guarded.tenant.org,
            "name": "chat",
            "scope": {"kind": "organization"},
            "models": [CHAT_ALIAS],
            "ttl_seconds": 300,
        },
    )
    return guarded


def provider_calls(guarded: Guarded) -> int:
    return sum(r.path.endswith("/chat/completions") for r in guarded.fake.received)


async def plain(sdk: openai.AsyncOpenAI, text: str = "who?") -> tuple[str | None, Any]:
    raw = await sdk.chat.completions.with_raw_response.create(model=CHAT_ALIAS, messages=said(text))
    return raw.headers.get("x-vkgate-cache"), raw.parse()


async def streamed(sdk: openai.AsyncOpenAI, text: str = "who?") -> tuple[str | None, str]:
    raw = await sdk.chat.completions.with_raw_response.create(
        model=CHAT_ALIAS, messages=said(text), stream=True
    )
    chunks = [chunk async for chunk in raw.parse()]
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return raw.headers.get("x-vkgate-cache"), content


async def test_a_redacted_answer_is_stored_redacted_and_replayed_redacted(
    cached: Guarded,
) -> None:
    cached.fake.reply_pieces = (f"Write to {EMAIL}", " anytime.")
    key = await cached.key({"kind": "pii", "stage": "response", "action": "redact"})
    async with cached.openai(key) as sdk:
        first_header, first = await plain(sdk)
        second_header, second = await plain(sdk)
        stream_header, replayed = await streamed(sdk)
    assert (first_header, second_header, stream_header) == ("miss", "hit", "hit")
    assert provider_calls(cached) == 1
    assert first.choices[0].message.content == REDACTED
    assert second.choices[0].message.content == REDACTED
    assert replayed == REDACTED
    # The entry itself holds the redacted answer: a key of the same organization without the
    # guardrail is answered from it, redacted.
    async with cached.openai(await cached.key()) as sdk:
        unguarded_header, unguarded = await plain(sdk)
    assert unguarded_header == "hit"
    assert unguarded.choices[0].message.content == REDACTED
    records = await cached.outcomes()
    assert [r.cache_hit for r in records] == [False, True, True, True]
    # The replays pass: what the entry holds was redacted before it was stored.
    assert [only(r) for r in records] == [
        {"response:pii": "redacted"},
        {"response:pii": "passed"},
        {"response:pii": "passed"},
        {},
    ]


async def test_a_streamed_answer_is_stored_as_redacted_through_the_window(
    cached: Guarded,
) -> None:
    cached.fake.reply_pieces = ("Write to jane", ".doe@exa", "mple.com", " anytime.")
    key = await cached.key({"kind": "pii", "stage": "response", "action": "redact"})
    async with cached.openai(key) as sdk:
        first_header, first = await streamed(sdk)
        second_header, second = await plain(sdk)
    assert (first_header, second_header) == ("miss", "hit")
    assert provider_calls(cached) == 1
    assert first == REDACTED
    assert second.choices[0].message.content == REDACTED


async def test_an_answer_blocked_at_the_response_stage_is_never_stored(cached: Guarded) -> None:
    filler = tuple(f"safe{i} " for i in range(200))
    cached.fake.reply_pieces = (*filler, "use ", OPENAI_KEY, " now", *filler)
    key = await cached.key({"kind": "secrets", "stage": "response", "action": "block"})
    async with cached.openai(key) as sdk:
        for _ in range(2):
            stream = await sdk.chat.completions.create(
                model=CHAT_ALIAS, messages=said("hi"), stream=True
            )
            with pytest.raises(openai.APIError):
                async for _chunk in stream:
                    pass
        for _ in range(2):
            with pytest.raises(openai.BadRequestError):
                await sdk.chat.completions.create(model=CHAT_ALIAS, messages=said("hi"))
    # Each of the four went to the provider: none was answered from a refused answer.
    assert provider_calls(cached) == 4
    metrics = cached.proxy.metrics.render().decode()
    assert 'vkgate_response_cache_stores_total{result="not_stored"} 2.0' in metrics
    assert 'vkgate_response_cache_stores_total{result="stored"}' not in metrics


async def stored_unguarded(cached: Guarded) -> str:
    """A key without guardrails whose answer, with an email in it, is in the cache."""
    cached.fake.reply_pieces = (f"Write to {EMAIL}", " anytime.")
    key = await cached.key()
    async with cached.openai(key) as sdk:
        header, answer = await plain(sdk)
    assert header == "miss" and EMAIL in answer.choices[0].message.content
    await cached.proxy.following_changes()
    return key


async def late_guardrail(cached: Guarded, action: str) -> None:
    await create(
        cached.client,
        "/api/admin/guardrails",
        {
            "organization_id": cached.tenant.org,
            "name": f"{action}-late",
            "kind": "pii",
            "stage": "response",
            "action": action,
        },
    )


async def test_a_redaction_added_after_an_answer_was_stored_applies_to_its_hits(
    cached: Guarded,
) -> None:
    key = await stored_unguarded(cached)
    await late_guardrail(cached, "redact")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5.0
    async with cached.openai(key) as sdk:
        while True:
            header, answer = await plain(sdk)
            assert header == "hit"
            if answer.choices[0].message.content == REDACTED:
                break
            assert loop.time() < deadline, "the guardrail never reached the proxy"
            await asyncio.sleep(0.02)
        assert (await streamed(sdk)) == ("hit", REDACTED)
    assert provider_calls(cached) == 1, "every answer after the first came from the cache"
    last = await cached.last()
    assert last.cache_hit
    assert only(last) == {"response:redact": "redacted"}


async def test_a_block_added_after_an_answer_was_stored_refuses_its_hits(
    cached: Guarded,
) -> None:
    key = await stored_unguarded(cached)
    await late_guardrail(cached, "block")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5.0
    async with cached.openai(key) as sdk:
        while True:
            try:
                await plain(sdk)
            except openai.BadRequestError as exc:
                refused = exc
                break
            assert loop.time() < deadline, "the guardrail never reached the proxy"
            await asyncio.sleep(0.02)
        with pytest.raises(openai.BadRequestError) as streamed_refusal:
            await streamed(sdk)
    for response in (refused.response, streamed_refusal.value.response):
        error = response.json()["error"]
        assert (error["code"], error["stage"]) == ("guardrail_blocked", "response")
        assert EMAIL not in response.text
    assert provider_calls(cached) == 1, "no refused hit went to the provider"
    last = await cached.last()
    assert (last.status, last.error_code, last.cache_hit) == (400, "guardrail_blocked", False)
    assert (last.input_tokens, last.output_tokens) == (0, 0), "a refused hit costs nothing"
    assert only(last) == {"response:block": "blocked"}


async def test_a_hit_skips_the_request_guardrails_and_says_so(cached: Guarded) -> None:
    key = await cached.key({"kind": "pii", "stage": "both", "action": "redact"})
    async with cached.openai(key) as sdk:
        first_header, _ = await plain(sdk, f"mail {EMAIL}")
        second_header, _ = await plain(sdk, f"mail {EMAIL}")
    assert (first_header, second_header) == ("miss", "hit")
    assert provider_calls(cached) == 1
    assert EMAIL not in cached.received_text()
    first, second = await cached.outcomes()
    assert only(first) == {"request:pii": "redacted", "response:pii": "passed"}
    assert only(second) == {"request:pii": "skipped", "response:pii": "passed"}


async def test_a_key_whose_request_guardrails_differ_is_never_answered_from_anothers_entry(
    cached: Guarded,
) -> None:
    prompt = f"mail {EMAIL}"
    async with cached.openai(await cached.key()) as sdk:
        header, _ = await plain(sdk, prompt)
    assert header == "miss"
    # Same organization, same rule, same body: a hit would skip the guardrail that refuses it.
    key = await cached.key({"kind": "pii", "stage": "request", "action": "block"})
    async with cached.openai(key) as sdk:
        with pytest.raises(openai.BadRequestError) as refusal:
            await plain(sdk, prompt)
    error = refusal.value.response.json()["error"]
    assert (error["code"], error["stage"]) == ("guardrail_blocked", "request")
    # A key with the same checks as the first shares its entry.
    async with cached.openai(await cached.key()) as sdk:
        header, _ = await plain(sdk, prompt)
    assert header == "hit"
    assert provider_calls(cached) == 1

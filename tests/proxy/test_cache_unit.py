"""The response cache's parts without HTTP: keys, rules, the stores, and the canonical form a
stream is read back into and replayed from."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from proxy.asgi import Message
from proxy.cache import _anthropic, _openai
from proxy.cache._events import NotAnAnswer
from proxy.cache.rules import compile_rules
from proxy.cache.service import Recorder, _directives, cache_key
from proxy.cache.stores import MemoryStore
from proxy.usage import TokenUsage
from tests.support.clock import ManualClock
from tests.support.fake_reasoning import _chat, _chat_events, _message, _message_events
from vkgate.wire import CacheRuleState

CHAT = "/v1/chat/completions"


def key(doc: dict[str, Any], route: str = CHAT, namespace: bytes = b"organization:o") -> bytes:
    return cache_key("org_1", namespace, route, "chat", doc)


def test_the_key_ignores_key_order_delivery_and_who_asked() -> None:
    base = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    same = {
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "user": "alice",
        "messages": [{"content": "hi", "role": "user"}],
        "model": "chat",
    }
    assert key(base) == key(same)
    assert key(base) != key({**base, "temperature": 1})
    assert key(base) != key(base, namespace=b"project:p")
    assert key(base) != key(base, route="/v1/messages")
    assert cache_key("org_2", b"organization:o", CHAT, "chat", base) != key(base)
    message = {"model": "chat", "max_tokens": 5, "messages": [], "metadata": {"user_id": "bob"}}
    anonymous = {k: v for k, v in message.items() if k != "metadata"}
    assert key(message, "/v1/messages") == key(anonymous, "/v1/messages")
    # Anthropic's version and betas shape the answer: part of the key.
    version = {"anthropic-version": "2023-06-01"}
    beta = {**version, "anthropic-beta": "interleaved-thinking-2025-05-14"}
    messages = [cache_key("o", b"n", "/v1/messages", "c", message, h) for h in (version, beta)]
    assert messages[0] != messages[1]


@pytest.mark.parametrize(
    ("headers", "directives"),
    [
        ([], ("miss", None)),
        ([(b"cache-control", b"no-cache")], ("refresh", None)),
        ([(b"cache-control", b"max-age=0")], ("refresh", 0)),
        ([(b"cache-control", b"No-Cache, max-age=5")], ("refresh", 5)),
        ([(b"cache-control", b"no-cache, no-store")], ("bypass", None)),
        ([(b"cache-control", b"max-age=60")], ("miss", 60)),
        ([(b"cache-control", b"max-age=60"), (b"cache-control", b"max-age=30")], ("miss", 30)),
        ([(b"cache-control", b"max-age=soon")], ("miss", None)),
    ],
)
def test_cache_control_refreshes_or_bypasses(
    headers: list[tuple[bytes, bytes]], directives: tuple[str, int | None]
) -> None:
    assert _directives({"headers": [(b"authorization", b"Bearer vk-x"), *headers]}) == directives


def test_the_narrowest_rule_matching_an_alias_decides_its_scope_and_ttl() -> None:
    def rule(ident: str, kind: str, models: list[str], ttl: int) -> CacheRuleState:
        return CacheRuleState(ident, kind, f"{kind}-id", models, ttl)

    scopes = compile_rules(
        [
            rule("cr_org", "organization", ["*"], 60),
            rule("cr_key", "virtual_key", ["gpt-4o*"], 5),
            rule("cr_team", "team", ["claude-*", "gpt-4o-mini"], 30),
            rule("cr_new", "galaxy", ["*"], 1),
        ],
        ["gpt-4o-mini", "claude-3", "embed"],
    )
    assert {alias: (s.namespace, s.ttl_s) for alias, s in scopes.items()} == {
        "gpt-4o-mini": (b"virtual_key:virtual_key-id", 5),
        "claude-3": (b"team:team-id", 30),
        "embed": (b"organization:organization-id", 60),
    }
    assert compile_rules([], ["gpt-4o-mini"]) == {}


async def test_the_memory_store_keeps_within_its_bytes_and_drops_what_lapsed() -> None:
    clock = ManualClock()
    clock.freeze()
    store = MemoryStore(1_000, clock.monotonic)
    await store.put(b"a", b"x" * 300, ttl_s=10)
    await store.put(b"b", b"x" * 300, ttl_s=100)
    assert await store.get(b"a") is not None  # now the most recently used
    await store.put(b"c", b"x" * 300, ttl_s=100)
    assert await store.get(b"b") is None, "the least recently used went first"
    assert store.bytes <= 1_000
    await store.put(b"huge", b"x" * 2_000, ttl_s=100)
    assert await store.get(b"huge") is None, "larger than the whole cache: never kept"
    clock.elapse(11)
    assert await store.get(b"a") is None
    assert await store.get(b"c") is not None
    assert store.stats() == (1, store.bytes, 0)


def sse(events: list[bytes]) -> bytes:
    return b"".join(events)


def test_an_openai_stream_reads_back_into_its_plain_answer_and_replays_the_same() -> None:
    payload = {"model": "r1", "stream_options": {"include_usage": True}}
    plain = _chat(payload)
    assert isinstance(plain, dict)
    assembled = _openai.assemble(sse(_chat_events(payload)), None)
    assert assembled == {**plain, "choices": [{**plain["choices"][0], "logprobs": None}]}
    replayed = _openai.replay(assembled, with_usage=True)
    assert _openai.assemble(replayed, None) == assembled
    assert replayed.endswith(b"data: [DONE]\n\n")
    bare = _openai.replay(assembled, with_usage=False)
    assert b'"usage"' not in bare


def test_an_openai_stream_without_usage_takes_it_from_the_outcome() -> None:
    events = _chat_events({"model": "r1"})
    usage = TokenUsage(input_tokens=120, output_tokens=80, cache_read_tokens=20)
    assembled = _openai.assemble(sse(events), usage)
    assert assembled["usage"]["prompt_tokens"] == 120
    assert assembled["usage"]["prompt_tokens_details"] == {"cached_tokens": 20}


def test_an_anthropic_stream_reads_back_into_its_plain_message_and_replays_the_same() -> None:
    plain = _message({"model": "c1"})
    assembled = _anthropic.assemble(sse(_message_events({"model": "c1"})))
    assert assembled == plain
    assert _anthropic.assemble(_anthropic.replay(plain)) == plain


@pytest.mark.parametrize(
    "stream",
    [
        b'data: {"error": {"message": "overloaded"}}\n\n',
        b"data: not json\n\n",
        b"",
    ],
)
def test_an_openai_stream_that_is_no_whole_answer_is_not_kept(stream: bytes) -> None:
    with pytest.raises(NotAnAnswer):
        _openai.assemble(stream, None)


def test_an_anthropic_stream_cut_short_or_in_error_is_not_kept() -> None:
    events = _message_events({"model": "c1"})
    with pytest.raises(NotAnAnswer):
        _anthropic.assemble(sse(events[:-1]))
    error = b'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error"}}\n\n'
    with pytest.raises(NotAnAnswer):
        _anthropic.assemble(sse([*events[:3], error]))


def test_a_replayed_anthropic_stream_opens_each_block_empty_then_fills_it() -> None:
    frames = [
        json.loads(line.removeprefix(b"data: "))
        for line in _anthropic.replay(_message({"model": "c1"})).splitlines()
        if line.startswith(b"data: ")
    ]
    starts = [f["content_block"] for f in frames if f["type"] == "content_block_start"]
    assert starts[0] == {"type": "thinking", "thinking": "", "signature": ""}
    assert starts[2]["input"] == {}
    assert frames[0]["message"]["usage"]["output_tokens"] == 0
    assert frames[-2]["usage"]["output_tokens"] == 80
    assert msgspec.json.decode(msgspec.json.encode(frames))


async def test_the_recorder_passes_everything_on_and_stops_keeping_past_its_bound() -> None:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    recorder = Recorder(send, limit=10)
    messages: list[Message] = [
        {"type": "http.response.start", "status": 200, "headers": []},
        {"type": "http.response.body", "body": b"123456", "more_body": True},
        {"type": "http.response.body", "body": b"789012", "more_body": False},
    ]
    for message in messages:
        await recorder(message)
    assert sent == messages
    assert (recorder.status, recorder.ended, recorder.overflowed) == (200, True, True)
    assert recorder.parts == [], "nothing half kept"


def test_message_fields_read_apart_from_none_are_kept_both_ways() -> None:
    """Web-search annotations, audio, a vendor's own fields: whatever the answer had."""
    annotation = {"type": "url_citation", "url_citation": {"url": "https://example.com"}}
    plain: dict[str, Any] = {
        "id": "c1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "See example.com.",
                    "refusal": None,
                    "annotations": [annotation],
                    "audio": {"id": "audio_1", "transcript": "See example.com."},
                },
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
    }
    assembled = _openai.assemble(_openai.replay(plain, with_usage=False), None)
    assert assembled["choices"][0]["message"] == plain["choices"][0]["message"]
    split = [
        b'data: {"id":"c1","created":1,"model":"m","choices":[{"index":0,"delta":'
        b'{"role":"assistant","content":"x","annotations":[1]}}]}\n\n',
        b'data: {"id":"c1","created":1,"model":"m","choices":[{"index":0,"delta":'
        b'{"annotations":[2]},"finish_reason":"stop"}]}\n\n',
    ]
    assert _openai.assemble(b"".join(split), None)["choices"][0]["message"]["annotations"] == [
        1,
        2,
    ]


def test_an_entrys_key_is_the_sha256_of_its_parts_as_entries_already_stored_were_named() -> None:
    import hashlib

    doc = {"model": "gpt", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    parts = [b"org_1", b"ns", b"/v1/messages", b"claude"]
    headers = {"anthropic-version": "2023-06-01"}
    expected = hashlib.sha256(b"vkgate-cache-v1\x00")
    for part in [*parts, json.dumps(headers, separators=(",", ":")).encode()]:
        expected.update(part + b"\x00")
    expected.update(
        json.dumps(
            {k: v for k, v in doc.items() if k != "stream"}, sort_keys=True, separators=(",", ":")
        ).encode()
    )
    found = cache_key("org_1", b"ns", "/v1/messages", "claude", doc, headers)
    assert found == expected.hexdigest().encode()

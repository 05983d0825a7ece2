"""How one request is put to credentials of either format, without any HTTP."""

from __future__ import annotations

import json

import msgspec

from proxy.formats import ChatExchange
from proxy.providers import Upstream
from proxy.providers.base import WireFormat
from proxy.spend.records import _prompt_text

ANTHROPIC_BODY = json.dumps(
    {"model": "alias", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
).encode()


def upstream(kind: str, wire: WireFormat = WireFormat.OPENAI) -> Upstream:
    return Upstream(
        "p",
        "p",
        kind,
        "m",
        msgspec.json.encode("m"),
        adapter=None,
        wire=wire,  # type: ignore[arg-type]
    )


def anthropic_exchange() -> ChatExchange:
    return ChatExchange(
        WireFormat.ANTHROPIC,
        ANTHROPIC_BODY,
        "alias",
        stream=False,
        client_wants_usage=True,
        with_usage=ANTHROPIC_BODY,
        created=0,
    )


def test_openais_own_api_gets_max_completion_tokens() -> None:
    for kind in ("openai", "azure_openai"):
        sent = json.loads(anthropic_exchange().body_for(upstream(kind)))
        assert sent["max_completion_tokens"] == 64 and "max_tokens" not in sent


def test_servers_speaking_openais_api_get_max_tokens() -> None:
    sent = json.loads(anthropic_exchange().body_for(upstream("openai_compatible")))
    assert sent["max_tokens"] == 64


def test_same_format_body_passes_with_only_the_model_patched() -> None:
    sent = anthropic_exchange().body_for(upstream("anthropic", WireFormat.ANTHROPIC))
    assert sent == ANTHROPIC_BODY.replace(b'"alias"', b'"m"')


def test_usage_is_read_before_an_answer_is_rendered() -> None:
    exchange = anthropic_exchange()
    answer = json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "gpt-x",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "hey"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        }
    ).encode()
    usage, model = exchange.usage_of(upstream("openai"), 200, answer)
    assert usage is not None and (usage.input_tokens, usage.output_tokens) == (5, 2)
    assert model == "gpt-x"
    rendered = json.loads(exchange.render(upstream("openai"), 200, answer))
    assert rendered["type"] == "message" and rendered["content"][0]["text"] == "hey"


def test_an_estimate_counts_inline_images_as_a_few_tokens() -> None:
    image = "data:image/png;base64," + "A" * 100_000
    body = json.dumps({"messages": [{"content": [{"image_url": {"url": image}}]}]}).encode()
    text = _prompt_text(body)
    assert len(text) < 100 and "inline data" in text

"""What a chat or Responses request costs the proxy to send to a cloud credential, in process.

For one OpenAI chat request (the body `bench/peers/chat.lua` sends) and one answer, µs per
request of what the exchange does for each kind of credential: the body for the provider
(`body_for`: the model patched in for a pass-through, a translation for Bedrock and Gemini),
the request's authentication (SigV4 signed by botocore for Bedrock; a header for the others),
the usage read off the answer and the answer rendered for the client; and the same for a
streamed answer (the provider's stream through its pipe). The `openai` row is chat's
pass-through, for comparison.

With `--api responses` the request is a Responses API one (the same conversation, as
`instructions` and `input`): passed through to the `openai` credential with its ids sealed,
translated for the others; a `bedrock-via-chat` row translates it the way the first design
would have, to a chat request and that to Converse, for comparison with the direct module.

    .venv/bin/python bench/cloud_cost.py [--n 20000] [--api chat|responses]

No network: the signer's keys are stored ones, the answers recorded ones.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable

from proxy.formats import ChatExchange
from proxy.providers import Operation, registry
from proxy.providers._client import HttpClient
from proxy.providers._connection import Timeouts
from proxy.providers.base import Upstream, WireFormat
from proxy.responses.exchange import ResponsesExchange
from proxy.responses.ids import ResponseIds
from proxy.translate import openai_converse, responses_openai
from proxy.translate._responses_request import parse
from vkgate.clock import SystemClock
from vkgate.wire import ChainTarget

BODY = json.dumps(
    {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You are a concise assistant. Answer in one sentence."},
            {
                "role": "user",
                "content": "What is the capital of France, and what river runs through it?",
            },
        ],
        "temperature": 0.2,
        "max_tokens": 64,
    }
).encode()
RESPONSES_BODY = json.dumps(
    {
        "model": "gpt-4o-mini",
        "instructions": "You are a concise assistant. Answer in one sentence.",
        "input": "What is the capital of France, and what river runs through it?",
        "temperature": 0.2,
        "max_output_tokens": 64,
        "store": False,
    }
).encode()
RESPONSES_ANSWER = json.dumps(
    {
        "id": "resp_bench0001",
        "object": "response",
        "created_at": 1700000000,
        "status": "completed",
        "model": "gpt-4o-mini-2024-07-18",
        "output": [
            {
                "id": "msg_bench0001",
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Hello!", "annotations": []}],
            }
        ],
        "usage": {
            "input_tokens": 25,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 13,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 38,
        },
    }
).encode()
IDS = ResponseIds(["bench-secret-" + "x" * 32])
TEXT = "Hello! This is a fixed reply from the benchmark mock upstream."
ANSWERS = {
    "openai": json.dumps(
        {
            "id": "chatcmpl-b1",
            "object": "chat.completion",
            "created": 1700000000,
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": TEXT},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 25, "completion_tokens": 13, "total_tokens": 38},
        }
    ).encode(),
    "bedrock": json.dumps(
        {
            "output": {"message": {"role": "assistant", "content": [{"text": TEXT}]}},
            "stopReason": "end_turn",
            "usage": {"inputTokens": 25, "outputTokens": 13, "totalTokens": 38},
        }
    ).encode(),
    "gemini": json.dumps(
        {
            "candidates": [
                {"content": {"parts": [{"text": TEXT}], "role": "model"}, "finishReason": "STOP"}
            ],
            "usageMetadata": {
                "promptTokenCount": 25,
                "candidatesTokenCount": 13,
                "totalTokenCount": 38,
            },
            "modelVersion": "gemini-2.5-flash",
            "responseId": "bench0001",
        }
    ).encode(),
}
TARGETS = {
    "openai": ChainTarget("p1", "openai", "openai", None, "gpt-4o-mini", api_key="sk-bench"),
    "bedrock": ChainTarget(
        "p2",
        "bedrock",
        "bedrock",
        None,
        "amazon.nova-lite-v1:0",
        settings={"region": "us-east-1"},
        credentials={
            "aws_access_key_id": "AKIABENCHMARKKEY0001",
            "aws_secret_access_key": "bench/secret/key/0123456789abcdefghijklmn",
        },
    ),
    "gemini": ChainTarget("p3", "gemini", "gemini", None, "gemini-2.5-flash", api_key="AIza-bench"),
}


def per_call(n: int, step: Callable[[], object]) -> float:
    for _ in range(min(n, 500)):
        step()
    started = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - started) / n * 1e6


async def per_await(n: int, step: Callable[[], object]) -> float:
    for _ in range(min(n, 500)):
        await step()  # type: ignore[misc]
    started = time.perf_counter()
    for _ in range(n):
        await step()  # type: ignore[misc]
    return (time.perf_counter() - started) / n * 1e6


API = {"name": "chat"}


def _exchange(stream: bool = False) -> ChatExchange | ResponsesExchange:
    if API["name"] == "responses":
        return ResponsesExchange(
            RESPONSES_BODY.replace(b'"store": false', b'"stream": true')
            if stream
            else RESPONSES_BODY,
            "gpt-4o-mini",
            stream=stream,
            stored=False,
            ids=IDS,
            organization_id="org_bench",
            created=1,
        )
    return ChatExchange(
        WireFormat.OPENAI,
        BODY,
        "gpt-4o-mini",
        stream=stream,
        client_wants_usage=False,
        with_usage=BODY,
        created=1,
    )


def _via_chat(upstream: Upstream) -> bytes:
    """The Responses request translated in two steps, to chat then to Converse."""
    chat = responses_openai.request(parse(RESPONSES_BODY, "chat"), upstream.model)
    return openai_converse.request(chat, upstream.model)


async def row(kind: str, upstream: Upstream, n: int) -> str:
    answer = ANSWERS[kind]
    if API["name"] == "responses" and kind == "openai":
        answer = RESPONSES_ANSWER
    body_for = per_call(n, lambda: _exchange().body_for(upstream))
    auth = 0.0
    signer = upstream.signer
    if signer is not None:
        url = upstream.urls[Operation.CONVERSE]
        auth = await per_await(n, lambda: signer.sign(url, BODY, dict(upstream.headers)))
    one = _exchange()
    usage = per_call(n, lambda: one.usage_of(upstream, 200, answer))
    render = per_call(n, lambda: one.render(upstream, 200, answer))
    stream = per_call(n // 4, lambda: _streamed(kind, upstream))
    return (
        f"{kind:<10} {body_for:9.1f} {auth:7.1f} {usage:7.1f} {render:7.1f} "
        f"{body_for + auth + usage + render:7.1f} {stream:7.1f}"
    )


async def measure(n: int) -> None:
    providers = registry(HttpClient(Timeouts(5, 5, 5), user_agent="bench"), SystemClock())
    print(
        f"{'credential':<10} {'body_for':>9} {'auth':>7} {'usage':>7} {'render':>7} "
        f"{'plain':>7} {'stream':>7}   (µs per request, {n} each)"
    )
    for kind, target in TARGETS.items():
        print(await row(kind, providers[kind].compile(target), n))
    if API["name"] == "responses":
        bedrock = providers["bedrock"].compile(TARGETS["bedrock"])
        print(f"{'bedrock-via-chat':<10} {per_call(n, lambda: _via_chat(bedrock)):9.1f}")


STREAMS = {
    "openai": b"".join(
        b"data: "
        + json.dumps(
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "gpt-4o-mini",
                "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}],
            }
        ).encode()
        + b"\n\n"
        for piece in ("A fixed", " streamed answer.")
    )
    + b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":25,"completion_tokens":5,"total_tokens":30}}\n\ndata: [DONE]\n\n',
    "gemini": b'data: {"candidates":[{"content":{"parts":[{"text":"A fixed"}],"role":"model"},"index":0}],"usageMetadata":{"promptTokenCount":25,"totalTokenCount":25},"modelVersion":"gemini-2.5-flash","responseId":"b2"}\r\n\r\ndata: {"candidates":[{"content":{"parts":[{"text":" streamed answer."}],"role":"model"},"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":25,"candidatesTokenCount":5,"totalTokenCount":30},"modelVersion":"gemini-2.5-flash","responseId":"b2"}\r\n\r\n',
}


def _bedrock_stream() -> bytes:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.support import eventstream

    events = [
        ("messageStart", {"role": "assistant"}),
        ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "A fixed"}}),
        ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": " streamed answer."}}),
        ("contentBlockStop", {"contentBlockIndex": 0}),
        ("messageStop", {"stopReason": "end_turn"}),
        ("metadata", {"usage": {"inputTokens": 25, "outputTokens": 5, "totalTokens": 30}}),
    ]
    return b"".join(eventstream.event(name, payload) for name, payload in events)


def _streamed(kind: str, upstream: Upstream) -> bytes:
    pipe = _exchange(stream=True).pipe(upstream)
    data = STREAMS[kind]
    if API["name"] == "responses" and kind == "openai":
        data = RESPONSES_STREAM
    return pipe.feed(data) + pipe.finish()


RESPONSES_STREAM = b"".join(
    b"event: " + name.encode() + b"\ndata: " + json.dumps(data).encode() + b"\n\n"
    for name, data in (
        ("response.created", {"type": "response.created", "response": {"id": "resp_b2"}}),
        (
            "response.output_text.delta",
            {"type": "response.output_text.delta", "delta": "A fixed", "sequence_number": 1},
        ),
        (
            "response.output_text.delta",
            {"type": "response.output_text.delta", "delta": " answer.", "sequence_number": 2},
        ),
        (
            "response.completed",
            {
                "type": "response.completed",
                "response": {
                    "id": "resp_b2",
                    "usage": {"input_tokens": 25, "output_tokens": 5, "total_tokens": 30},
                },
            },
        ),
    )
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--api", choices=("chat", "responses"), default="chat")
    args = parser.parse_args()
    API["name"] = args.api
    STREAMS["bedrock"] = _bedrock_stream()
    asyncio.run(measure(args.n))


if __name__ == "__main__":
    main()

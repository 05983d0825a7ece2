"""OpenAI chat completions in the cache: a stream read back into the plain answer it stands
for, and a plain answer replayed as the stream of chunks OpenAI's SDKs read."""

from __future__ import annotations

from typing import Any

import msgspec

from proxy.cache._events import NotAnAnswer, data_of, event
from proxy.translate._common import openai_usage
from proxy.usage import TokenUsage

_TEXT_FIELDS = ("content", "refusal", "reasoning_content", "reasoning")
"""Fields of a message that stream as text deltas: the answer, a refusal, and the reasoning
some OpenAI-format servers (vLLM, DeepSeek, OpenRouter) send beside it."""
_CARRIED = ("system_fingerprint", "service_tier")
_KNOWN = frozenset(("role", "tool_calls", "function_call", *_TEXT_FIELDS))
"""Message fields read apart; any other (`annotations`, `audio`, a vendor's own) is kept as
it came: lists added up, anything else as last sent."""


def assemble(stream: bytes, usage: TokenUsage | None) -> dict[str, Any]:
    """The `chat.completion` a stream of `chat.completion.chunk`s adds up to. `usage` fills in
    what the client was not sent (it did not ask for `stream_options.include_usage`)."""
    answer: dict[str, Any] = {}
    choices: dict[int, dict[str, Any]] = {}
    for _, chunk in data_of(stream):
        if not isinstance(chunk, dict) or "error" in chunk:
            raise NotAnAnswer("the stream carried an error")
        if not answer:
            answer = {
                "id": chunk.get("id"),
                "object": "chat.completion",
                "created": chunk.get("created"),
                "model": chunk.get("model"),
            }
        for name in _CARRIED:
            if chunk.get(name) is not None:
                answer[name] = chunk[name]
        if chunk.get("usage"):
            answer["usage"] = chunk["usage"]
        for part in chunk.get("choices") or ():
            _add(choices, part)
    if not answer or not choices:
        raise NotAnAnswer("the stream held no choice")
    answer["choices"] = [_finished(choices[i]) for i in sorted(choices)]
    if "usage" not in answer and usage is not None:
        answer["usage"] = msgspec.to_builtins(openai_usage(usage))
    return answer


def _add(choices: dict[int, dict[str, Any]], part: dict[str, Any]) -> None:
    index = part.get("index", 0)
    choice = choices.setdefault(
        index, {"index": index, "message": {"role": "assistant"}, "texts": {}, "calls": {}}
    )
    delta = part.get("delta") or {}
    message, texts = choice["message"], choice["texts"]
    if delta.get("role"):
        message["role"] = delta["role"]
    for name in _TEXT_FIELDS:
        if isinstance(delta.get(name), str):
            texts.setdefault(name, []).append(delta[name])
    for name, value in delta.items():
        if name in _KNOWN or value is None:
            continue
        if isinstance(value, list) and isinstance(message.get(name), list):
            message[name] = [*message[name], *value]
        else:
            message[name] = value
    for call in delta.get("tool_calls") or ():
        known = choice["calls"].setdefault(
            call.get("index", 0), {"type": "function", "function": {"name": "", "arguments": []}}
        )
        if call.get("id"):
            known["id"] = call["id"]
        if call.get("type"):
            known["type"] = call["type"]
        function = call.get("function") or {}
        if function.get("name"):
            known["function"]["name"] += function["name"]
        if function.get("arguments"):
            known["function"]["arguments"].append(function["arguments"])
    if part.get("finish_reason"):
        choice["finish_reason"] = part["finish_reason"]
    logprobs = part.get("logprobs")
    if isinstance(logprobs, dict):
        kept = choice.setdefault("logprobs", {})
        for name, items in logprobs.items():
            if isinstance(items, list):
                kept.setdefault(name, []).extend(items)


def _finished(choice: dict[str, Any]) -> dict[str, Any]:
    message = choice["message"]
    texts = choice.pop("texts")
    message["content"] = "".join(texts["content"]) if "content" in texts else None
    message["refusal"] = "".join(texts["refusal"]) if "refusal" in texts else None
    for name in ("reasoning_content", "reasoning"):
        if name in texts:
            message[name] = "".join(texts[name])
    calls = choice.pop("calls")
    if calls:
        message["tool_calls"] = [
            {
                **calls[i],
                "function": {
                    "name": calls[i]["function"]["name"],
                    "arguments": "".join(calls[i]["function"]["arguments"]),
                },
            }
            for i in sorted(calls)
        ]
    choice.setdefault("logprobs", None)
    choice.setdefault("finish_reason", None)
    return choice


def replay(answer: dict[str, Any], *, with_usage: bool) -> bytes:
    """The plain answer as the chunks a stream of it would have sent: per choice its role,
    reasoning, text, refusal and tool calls, then its finish reason; the usage chunk when the
    client asked for it; `[DONE]`."""
    head = {
        "id": answer.get("id"),
        "object": "chat.completion.chunk",
        "created": answer.get("created"),
        "model": answer.get("model"),
    }
    for name in _CARRIED:
        if name in answer:
            head[name] = answer[name]
    out = bytearray()

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> None:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        out.extend(event({**head, "choices": [choice]}))

    for choice in answer.get("choices") or ():
        index = choice.get("index", 0)
        message = choice.get("message") or {}
        chunk(index, {"role": message.get("role", "assistant"), "content": ""})
        for name in ("reasoning_content", "reasoning"):
            if message.get(name):
                chunk(index, {name: message[name]})
        if message.get("content"):
            chunk(index, {"content": message["content"]})
        if message.get("refusal"):
            chunk(index, {"refusal": message["refusal"]})
        for position, call in enumerate(message.get("tool_calls") or ()):
            chunk(index, {"tool_calls": [{"index": position, **call}]})
        others = {k: v for k, v in message.items() if k not in _KNOWN and v is not None}
        if others:
            chunk(index, others)
        if choice.get("logprobs"):
            # Kept whole on the finishing chunk: a client adding them up gets the same list.
            out.extend(
                event(
                    {
                        **head,
                        "choices": [
                            {
                                "index": index,
                                "delta": {},
                                "logprobs": choice["logprobs"],
                                "finish_reason": None,
                            }
                        ],
                    }
                )
            )
        chunk(index, {}, choice.get("finish_reason") or "stop")
    if with_usage and answer.get("usage"):
        out.extend(event({**head, "choices": [], "usage": answer["usage"]}))
    out.extend(b"data: [DONE]\n\n")
    return bytes(out)

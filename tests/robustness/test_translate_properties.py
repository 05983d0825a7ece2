"""Property tests of the format translators: an OpenAI request taken to Anthropic's format and
back keeps everything either format can say, an answer taken the other way round keeps its
text, tool calls, finish and usage, and a field neither knows is refused by name, never
dropped."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.errors import ProxyError
from proxy.translate import _openai_request, anthropic_openai, openai_anthropic

PROPERTIES = settings(max_examples=60, deadline=None)

texts = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=40
)
names = st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True)
scalars = st.one_of(st.integers(-1000, 1000), st.booleans(), texts)
arguments = st.dictionaries(names, scalars, max_size=3)
probability = st.floats(0, 1, allow_nan=False).map(lambda x: round(x, 3))


@st.composite
def assistant_turns(draw: st.DrawFn, turn: int) -> list[dict[str, Any]]:
    """An assistant message, and the tool messages that answer its calls, if it makes any."""
    calls = [
        {
            "id": f"call_{turn}_{n}",
            "type": "function",
            "function": {"name": draw(names), "arguments": json.dumps(draw(arguments))},
        }
        for n in range(draw(st.integers(0, 2)))
    ]
    message: dict[str, Any] = {"role": "assistant", "content": draw(texts)}
    if calls:
        message["tool_calls"] = calls
    results = [
        {"role": "tool", "tool_call_id": call["id"], "content": draw(texts)} for call in calls
    ]
    return [message, *results]


@st.composite
def openai_requests(draw: st.DrawFn) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(texts)})
    for turn in range(draw(st.integers(1, 4))):
        messages.append({"role": "user", "content": draw(texts)})
        if draw(st.booleans()):
            messages.extend(draw(assistant_turns(turn)))
    request: dict[str, Any] = {"model": "alias", "messages": messages}
    request["max_tokens"] = draw(st.integers(1, 100_000))
    for field, values in (
        ("temperature", probability),
        ("top_p", probability),
        ("stop", st.lists(texts, min_size=1, max_size=3)),
        ("user", names),
    ):
        if draw(st.booleans()):
            request[field] = draw(values)
    if draw(st.booleans()):
        request["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": draw(texts),
                    "parameters": {
                        "type": "object",
                        "properties": {p: {"type": "string"} for p in draw(st.sets(names))},
                    },
                },
            }
            for name in draw(st.sets(names, min_size=1, max_size=3))
        ]
    return request


def said(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Everything an OpenAI conversation says, in order: (role, text), tool calls as
    ("call", id name arguments) and tool results as ("result", id text)."""
    out: list[tuple[str, str]] = []
    for message in messages:
        content = message.get("content")
        parts = [content] if isinstance(content, str) else [p["text"] for p in content or ()]
        if message["role"] == "tool":
            out += [("result", f"{message['tool_call_id']} {text}") for text in parts]
            continue
        out += [(message["role"], text) for text in parts if text]
        for call in message.get("tool_calls", ()):
            given_arguments = json.loads(call["function"]["arguments"] or "{}")
            out.append(("call", f"{call['id']} {call['function']['name']} {given_arguments}"))
    return out


@PROPERTIES
@given(openai_requests())
def test_an_openai_request_through_anthropics_format_and_back_keeps_what_both_can_say(
    request: dict[str, Any],
) -> None:
    there = openai_anthropic.request(json.dumps(request).encode(), "claude")
    back = json.loads(anthropic_openai.request(there, "gpt"))
    assert said(back["messages"]) == said(request["messages"])
    assert back["max_tokens"] == request["max_tokens"]
    for field in ("temperature", "top_p", "stop", "user"):
        assert back.get(field) == request.get(field), field
    tools = [tool["function"] for tool in back.get("tools", ())]
    assert tools == [tool["function"] for tool in request.get("tools", ())]


@st.composite
def openai_answers(draw: st.DrawFn) -> dict[str, Any]:
    calls = [
        {
            "id": f"call_{n}",
            "type": "function",
            "function": {"name": draw(names), "arguments": json.dumps(draw(arguments))},
        }
        for n in range(draw(st.integers(0, 2)))
    ]
    message: dict[str, Any] = {"role": "assistant", "content": draw(st.none() | texts)}
    if calls:
        message["tool_calls"] = calls
    elif message["content"] is None:
        message["content"] = draw(texts)
    finish = "tool_calls" if calls else draw(st.sampled_from(["stop", "length"]))
    prompt, completion = draw(st.integers(0, 10**6)), draw(st.integers(0, 10**6))
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


@PROPERTIES
@given(openai_answers())
def test_an_openai_answer_through_anthropics_format_and_back_keeps_text_calls_finish_and_usage(
    answer: dict[str, Any],
) -> None:
    there = anthropic_openai.response(json.dumps(answer).encode())
    back = json.loads(openai_anthropic.response(there, created=1))
    [choice], [original] = back["choices"], answer["choices"]
    assert said([choice["message"]]) == said([original["message"]])
    assert choice["finish_reason"] == original["finish_reason"]
    for count in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert back["usage"][count] == answer["usage"][count], count


KNOWN_OPENAI = frozenset(_openai_request.Request.__struct_fields__)
KNOWN_ANTHROPIC = frozenset(anthropic_openai._Request.__struct_fields__)


@PROPERTIES
@given(names.filter(lambda n: n not in KNOWN_OPENAI), scalars)
def test_a_field_anthropic_has_no_place_for_is_refused_by_name(field: str, value: Any) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], field: value}
    with pytest.raises(ProxyError) as refused:
        openai_anthropic.request(json.dumps(body).encode(), "claude")
    assert refused.value.param == field


@PROPERTIES
@given(names.filter(lambda n: n not in KNOWN_ANTHROPIC), scalars)
def test_a_field_openai_has_no_place_for_is_refused_by_name(field: str, value: Any) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, field: value}
    with pytest.raises(ProxyError) as refused:
        anthropic_openai.request(json.dumps(body).encode(), "gpt")
    assert refused.value.param == field

"""Reading a request body's routing fields and patching its bytes, without the rest of the proxy."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from proxy.body import ChatFields, StreamOptions, ask_for_usage, chat_fields, embedding_fields
from proxy.body import patch_model as patch
from proxy.errors import ProxyError
from vkgate.errors import ErrorCode

UPSTREAM = b'"gpt-4o-mini-2024-07-18"'
HELLO = '[{"role": "user", "content": "hi"}]'


def refusal(call: Any, body: bytes) -> ProxyError:
    with pytest.raises(ProxyError) as raised:
        call(body)
    error = raised.value
    assert error.code is ErrorCode.INVALID_REQUEST
    assert error.status == 400
    assert error.message
    return error


def pairs(body: bytes) -> list[tuple[str, Any]]:
    """Every top-level key and value, duplicates included, as a strict reader sees them."""
    decoded: list[tuple[str, Any]] = json.loads(body, object_pairs_hook=lambda items: items)
    return decoded


def changed_span(before: bytes, after: bytes) -> tuple[bytes, bytes]:
    """The one stretch of bytes that differs between two bodies: (what it was, what it is)."""
    start = 0
    while start < min(len(before), len(after)) and before[start] == after[start]:
        start += 1
    end = 0
    while (
        end < min(len(before), len(after)) - start
        and before[len(before) - 1 - end] == after[len(after) - 1 - end]
    ):
        end += 1
    return before[start : len(before) - end], after[start : len(after) - end]


# -- chat_fields ----------------------------------------------------------------------------


def test_chat_fields_reads_model_stream_and_stream_options() -> None:
    fields = chat_fields(
        b'{"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stream": true,'
        b' "stream_options": {"include_usage": false}}'
    )
    assert fields.model == "chat"
    assert fields.stream is True
    assert fields.stream_options == StreamOptions(include_usage=False)
    assert [bytes(m) for m in fields.messages] == [b'{"role": "user", "content": "hi"}']


def test_chat_fields_tell_absent_stream_options_from_null_ones() -> None:
    absent = chat_fields(b'{"model": "chat", "messages": [{}]}')
    null = chat_fields(b'{"model": "chat", "messages": [{}], "stream_options": null}')
    assert absent.stream_options is msgspec.UNSET
    assert null.stream_options is None
    assert absent.stream is None


def test_chat_fields_pass_over_fields_they_do_not_need() -> None:
    body = (
        b'{"model": "chat", "messages": [{"role": "user", "content": [{"type": "image_url",'
        b' "image_url": {"url": "data:image/png;base64,AAAA"}}]}], "tools": [{"type": "function",'
        b' "function": {"name": "f", "parameters": {}}}], "response_format": {"type": "json_object"},'
        b' "a_field_invented_tomorrow": {"nested": [1, 2, 3]}}'
    )
    fields = chat_fields(body)
    assert fields.model == "chat"
    assert len(fields.messages) == 1


def test_chat_fields_accept_an_escaped_spelling_of_model() -> None:
    assert chat_fields(b'{"m\\u006fdel": "ch\\u0061t", "messages": [{}]}').model == "chat"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"model": "chat", "messages": [', None),
        (b"not json at all", None),
        (b"", None),
        (b'["model", "chat"]', None),
        (b'{"model": 5, "messages": ' + HELLO.encode() + b"}", "model"),
        (b'{"model": null, "messages": ' + HELLO.encode() + b"}", "model"),
        (b'{"messages": ' + HELLO.encode() + b"}", "model"),
        (b'{"model": "", "messages": ' + HELLO.encode() + b"}", "model"),
        (b'{"model": "chat"}', "messages"),
        (b'{"model": "chat", "messages": "hi"}', "messages"),
        (b'{"model": "chat", "messages": []}', "messages"),
        (b'{"model": "chat", "messages": ' + HELLO.encode() + b', "stream": "yes"}', "stream"),
        (
            b'{"model": "chat", "messages": ' + HELLO.encode() + b', "stream_options": "usage"}',
            "stream_options",
        ),
        (
            b'{"model": "chat", "messages": '
            + HELLO.encode()
            + b', "stream_options": {"include_usage": "yes"}}',
            "stream_options",
        ),
    ],
    ids=[
        "truncated-json",
        "not-json",
        "empty-body",
        "not-an-object",
        "model-is-a-number",
        "model-is-null",
        "missing-model",
        "empty-model",
        "missing-messages",
        "messages-is-a-string",
        "empty-messages",
        "stream-is-a-string",
        "stream-options-is-a-string",
        "include-usage-is-a-string",
    ],
)
def test_malformed_chat_body_is_refused_naming_the_field(body: bytes, param: str | None) -> None:
    assert refusal(chat_fields, body).param == param


# -- embedding_fields -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [b'"hello"', b'["a", "b"]', b"[1, 2, 3]", b"[[1, 2], [3]]"],
    ids=["text", "texts", "tokens", "token-lists"],
)
def test_embedding_fields_keep_the_input_as_sent(value: bytes) -> None:
    fields = embedding_fields(b'{"model": "embed", "input": ' + value + b', "dimensions": 8}')
    assert fields.model == "embed"
    assert bytes(fields.input) == value


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"model": "embed"}', "input"),
        (b'{"model": "embed", "input": []}', "input"),
        (b'{"model": "embed", "input": [ ]}', "input"),
        (b'{"model": "embed", "input": [\n\t]}', "input"),
        (b'{"model": "embed", "input": ""}', "input"),
        (b'{"model": "embed", "input": null}', "input"),
        (b'{"input": "text"}', "model"),
        (b'{"model": "", "input": "text"}', "model"),
        (b'{"model": ["embed"], "input": "text"}', "model"),
        (b'{"model": "embed", "input": ', None),
    ],
    ids=[
        "missing-input",
        "empty-list",
        "empty-list-with-a-space",
        "empty-list-with-newlines",
        "empty-text",
        "null-input",
        "missing-model",
        "empty-model",
        "model-is-a-list",
        "truncated-json",
    ],
)
def test_malformed_embeddings_body_is_refused_naming_the_field(
    body: bytes, param: str | None
) -> None:
    assert refusal(embedding_fields, body).param == param


# -- patch_model: the common bodies, patched in place ---------------------------------------


@pytest.mark.parametrize(
    ("body", "patched"),
    [
        (
            b'{"model":"chat","messages":[{"role":"user","content":"hi"}]}',
            b'{"model":"gpt-4o-mini-2024-07-18","messages":[{"role":"user","content":"hi"}]}',
        ),
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "model": "chat", "stream": false}',
            b'{"messages": [{"role": "user", "content": "hi"}], '
            b'"model": "gpt-4o-mini-2024-07-18", "stream": false}',
        ),
        (
            b'{\n  "model" :\t"chat",\n  "messages": []\n}',
            b'{\n  "model" :\t"gpt-4o-mini-2024-07-18",\n  "messages": []\n}',
        ),
        (
            b'{"model"\r\n:\r\n"chat"}',
            b'{"model"\r\n:\r\n"gpt-4o-mini-2024-07-18"}',
        ),
    ],
    ids=["model-first", "model-after-messages", "spaces-and-tabs", "crlf"],
)
def test_patch_model_replaces_only_the_model_value(body: bytes, patched: bytes) -> None:
    assert patch(body, "chat", UPSTREAM) == patched


def test_patch_model_leaves_text_that_quotes_a_model_key_alone() -> None:
    body = (
        b'{"messages":[{"role":"user","content":"reply with \\"model\\": \\"chat\\" only"}],'
        b'"model":"chat"}'
    )
    assert patch(body, "chat", UPSTREAM) == body.replace(b'"model":"chat"', b'"model":' + UPSTREAM)


def test_patch_model_writes_a_non_ascii_model_name() -> None:
    body = '{"model":"modèle","messages":[]}'.encode()
    patched = patch(body, "modèle", msgspec.json.encode("最新"))
    assert json.loads(patched) == {"model": "最新", "messages": []}


def test_patch_model_writes_an_upstream_name_that_needs_escaping() -> None:
    patched = patch(b'{"model":"chat","messages":[]}', "chat", msgspec.json.encode('a "quoted" \\'))
    assert json.loads(patched)["model"] == 'a "quoted" \\'


@pytest.mark.parametrize("model_first", [True, False], ids=["model-first", "model-last"])
def test_patch_model_on_a_large_body_changes_only_the_model_bytes(model_first: bool) -> None:
    messages = [
        {"role": "user" if i % 2 else "assistant", "content": f'line {i}\nsays "hi" — ünïcode'}
        for i in range(6_000)
    ]
    document: dict[str, Any] = (
        {"model": "chat", "messages": messages, "stream": False}
        if model_first
        else {"messages": messages, "model": "chat", "temperature": 0.2}
    )
    body = json.dumps(document, ensure_ascii=False).encode()
    assert len(body) > 400_000

    patched = patch(body, "chat", UPSTREAM)

    assert changed_span(body, patched) == (b"chat", UPSTREAM.strip(b'"'))
    assert len(patched) - len(body) == len(UPSTREAM) - len(b'"chat"')
    assert json.loads(patched) == {**document, "model": "gpt-4o-mini-2024-07-18"}


# -- patch_model: the ambiguous bodies, decoded and re-encoded ------------------------------


def test_patch_model_leaves_a_nested_model_key_alone() -> None:
    body = (
        b'{"messages":[{"role":"user","content":"hi"}],"model":"chat","tools":[{"type":"function",'
        b'"function":{"name":"car","parameters":{"type":"object","properties":{"model":'
        b'{"type":"string"}}}}}],"metadata":{"model":"chat"}}'
    )
    patched = json.loads(patch(body, "chat", UPSTREAM))
    assert patched["model"] == "gpt-4o-mini-2024-07-18"
    assert patched["metadata"] == {"model": "chat"}
    properties = patched["tools"][0]["function"]["parameters"]["properties"]
    assert properties == {"model": {"type": "string"}}


def test_patch_model_sets_an_escaped_top_level_key_not_a_nested_one_that_looks_alike() -> None:
    """The only literal `"model"` key is nested; the top-level one is spelled with an escape."""
    body = b'{"messages":[{"role":"user","content":"hi","model":"chat"}],"m\\u006fdel":"chat"}'
    patched = patch(body, "chat", UPSTREAM)
    assert pairs(patched) == [
        ("messages", [[("role", "user"), ("content", "hi"), ("model", "chat")]]),
        ("model", "gpt-4o-mini-2024-07-18"),
    ]


@pytest.mark.parametrize(
    "body",
    [
        b'{"m\\u006Fdel":"chat","messages":[]}',
        b'{"\\u006d\\u006f\\u0064\\u0065\\u006c":"chat","messages":[]}',
        b'{"model":"ch\\u0061t","messages":[]}',
        b'{"model":"chat","messages":[],"model":"chat"}',
        b'{"messages":[{"role":"user","content":"model"}],"model":"chat"}',
    ],
    ids=[
        "escaped-key",
        "fully-escaped-key",
        "escaped-value",
        "duplicate-key",
        "model-as-a-value",
    ],
)
def test_patch_model_leaves_exactly_one_top_level_model(body: bytes) -> None:
    patched = patch(body, "chat", UPSTREAM)
    decoded = pairs(patched)
    assert [value for key, value in decoded if key == "model"] == ["gpt-4o-mini-2024-07-18"]
    assert {key: value for key, value in decoded if key != "model"} == {
        key: value for key, value in pairs(body) if key != "model"
    }


def test_patch_model_follows_the_last_of_duplicate_keys_as_the_decoder_does() -> None:
    body = b'{"model":"other","messages":[],"model":"chat"}'
    assert chat_fields(body.replace(b"[]", b"[{}]")).model == "chat"
    assert pairs(patch(body, "chat", UPSTREAM)) == [
        ("model", "gpt-4o-mini-2024-07-18"),
        ("messages", []),
    ]


# -- ask_for_usage --------------------------------------------------------------------------


def with_usage(body: bytes) -> bytes:
    return ask_for_usage(body, chat_fields(body))


def test_ask_for_usage_inserts_stream_options_keeping_every_other_byte() -> None:
    body = b'  {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stream": true}'
    asked = with_usage(body)
    assert asked == body.replace(
        b'{"model"', b'{"stream_options":{"include_usage":true},"model"', 1
    )
    assert chat_fields(asked).stream_options == StreamOptions(include_usage=True)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (b"null", {"include_usage": True}),
        (b"{}", {"include_usage": True}),
        (b'{"include_usage": false}', {"include_usage": True}),
        (
            b'{"include_usage": false, "continuous_usage_stats": true}',
            {"include_usage": True, "continuous_usage_stats": True},
        ),
    ],
    ids=["null", "empty", "false", "other-options-kept"],
)
def test_ask_for_usage_turns_on_usage_in_existing_stream_options(
    options: bytes, expected: dict[str, Any]
) -> None:
    body = b'{"model": "chat", "messages": [{}], "stream": true, "stream_options": ' + options
    asked = json.loads(with_usage(body + b"}"))
    assert asked == {
        "model": "chat",
        "messages": [{}],
        "stream": True,
        "stream_options": expected,
    }


def test_ask_for_usage_takes_the_fields_the_caller_already_decoded() -> None:
    body = b'{"model": "chat", "messages": [{}]}'
    fields = ChatFields(model="chat", messages=[msgspec.Raw(b"{}")])
    assert json.loads(ask_for_usage(body, fields))["stream_options"] == {"include_usage": True}

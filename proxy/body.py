"""Reading just the fields routing and accounting need from a request body, and patching bytes.

The body is forwarded as the client sent it: only `model` (and, for streams,
`stream_options.include_usage`) is patched in place, so tools, images, JSON mode and any field
added by a provider tomorrow pass through untouched.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, TypeVar

import msgspec

from proxy.errors import invalid


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = None


NonEmpty = msgspec.Meta(min_length=1)
Model = Annotated[str, NonEmpty]
# OpenAI's own API refuses a count above a 32-bit integer; a bound also keeps a worst-case
# reservation (count times price) a number every counter store can hold.
Count = Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)]


class ChatFields(msgspec.Struct):
    model: Model
    # Raw: each message is checked to be JSON but never decoded.
    messages: Annotated[list[msgspec.Raw], NonEmpty]
    stream: bool | None = None
    stream_options: StreamOptions | msgspec.UnsetType | None = msgspec.UNSET
    user: str | None = None
    # Bound what one request can cost: a budget reserves this much output (per choice).
    max_tokens: Count | None = None
    max_completion_tokens: Count | None = None
    n: Annotated[int, msgspec.Meta(ge=1, le=128)] | None = None


class MessagesMetadata(msgspec.Struct):
    user_id: str | None = None


class MessagesFields(msgspec.Struct):
    """What `POST /v1/messages` (Anthropic's format) routing and accounting need."""

    model: Model
    messages: Annotated[list[msgspec.Raw], NonEmpty]
    max_tokens: Count
    stream: bool | None = None
    metadata: MessagesMetadata | None = None


class ResponsesFields(msgspec.Struct):
    """What `POST /v1/responses` (OpenAI's Responses API) routing and accounting need."""

    model: Model
    stream: bool | None = None
    user: str | None = None
    safety_identifier: str | None = None
    max_output_tokens: Count | None = None
    previous_response_id: Annotated[str, NonEmpty] | None = None
    background: bool | None = None
    store: bool | None = None


class EmbeddingFields(msgspec.Struct):
    model: Model
    input: msgspec.Raw
    user: str | None = None


TOO_DEEP = "request body is nested too deeply to be read"
_chat = msgspec.json.Decoder(ChatFields)
_embeddings = msgspec.json.Decoder(EmbeddingFields)
_messages = msgspec.json.Decoder(MessagesFields)
_responses = msgspec.json.Decoder(ResponsesFields)
_encode = msgspec.json.Encoder().encode
_PATH = re.compile(r"at `\$\.([A-Za-z0-9_]+)")
_MISSING = re.compile(r"missing required field `([^`]+)`")
# Fails at the first byte of any real input, however long: cheap on a large batch.
_EMPTY_INPUT = re.compile(rb'\[[ \t\r\n]*\]|""|null')


def _refusal(exc: msgspec.DecodeError) -> Exception:
    text = str(exc)
    if isinstance(exc, msgspec.ValidationError):
        found = _PATH.search(text) or _MISSING.search(text)
        return invalid(f"invalid request body: {text}", param=found.group(1) if found else None)
    return invalid(f"request body is not valid JSON: {text}")


F = TypeVar("F")


def _decoded(decoder: msgspec.json.Decoder[F], body: bytes) -> F:
    try:
        fields = decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise _refusal(exc) from None
    except RecursionError:
        raise invalid(TOO_DEEP) from None
    if not body.isascii():
        # JSON is UTF-8, and the fields skipped above (messages, unknown ones) were not checked:
        # a provider that fails on them with a 5xx would count against its circuit breaker.
        try:
            body.decode()
        except UnicodeDecodeError as exc:
            raise invalid(f"request body is not valid UTF-8 (byte {exc.start})") from None
    return fields


def fields(decoder: msgspec.json.Decoder[F], body: bytes) -> F:
    """`body`'s fields by `decoder`, or the 400 naming what is wrong with them."""
    return _decoded(decoder, body)


def chat_fields(body: bytes) -> ChatFields:
    return _decoded(_chat, body)


def messages_fields(body: bytes) -> MessagesFields:
    return _decoded(_messages, body)


def responses_fields(body: bytes) -> ResponsesFields:
    return _decoded(_responses, body)


def embedding_fields(body: bytes) -> EmbeddingFields:
    fields = _decoded(_embeddings, body)
    if _EMPTY_INPUT.fullmatch(bytes(fields.input)):
        raise invalid("input must not be empty", param="input")
    return fields


_MODEL_KEY = b'"model"'
_BACKSLASH = 0x5C
_WHITESPACE = b" \t\r\n"
# Every escaped letter of "model" (m o d e l: 0x6d 0x6f 0x64 0x65 0x6c) starts so.
_ESCAPED_MODEL_LETTER = b"\\u006"
_USAGE_OPTION = b'"stream_options":{"include_usage":true},'


def patch_model(body: bytes, requested: str, upstream_json: bytes) -> bytes:
    """`body` with the top-level `model` set to the JSON string `upstream_json`.

    The common body has exactly one unescaped `"model"` key, the top-level one, holding exactly
    the bytes msgspec would write for `requested`: those few bytes are replaced. Anything else
    (a nested "model" key, an escaped spelling) takes the slow, always-correct path.
    """
    at = body.find(_MODEL_KEY)
    if (
        at > 0
        and body[at - 1] != _BACKSLASH
        and body.find(_MODEL_KEY, at + 1) < 0
        and _top_level(body, at)
    ):
        cursor = at + len(_MODEL_KEY)
        while cursor < len(body) and body[cursor] in _WHITESPACE:
            cursor += 1
        if cursor < len(body) and body[cursor] == 0x3A:  # ':'
            cursor += 1
            while cursor < len(body) and body[cursor] in _WHITESPACE:
                cursor += 1
            old = _encode(requested)
            if body.startswith(old, cursor):
                # Joined from views: one copy of a large body rather than three.
                view = memoryview(body)
                return b"".join((view[:cursor], upstream_json, view[cursor + len(old) :]))
    document = _document(body)
    document["model"] = msgspec.json.decode(upstream_json)
    return _encode(document)


def _top_level(body: bytes, at: int) -> bool:
    """Whether the only unescaped `"model"` key, at `at`, can be the top-level one.

    It is when no object or array opens before it. Otherwise it might be a nested key while
    the top-level one is spelled with escapes (`"m\\u006fdel"`); patching it would leave the
    requested alias in the body the provider reads, so any such escape takes the slow path.
    """
    if body.find(b"{", 1, at) < 0 and body.find(b"[", 1, at) < 0:
        return True
    # A single byte is found at memchr speed; most bodies stop here.
    return b"\\" not in body or _ESCAPED_MODEL_LETTER not in body


def ask_for_usage(body: bytes, fields: ChatFields) -> bytes:
    """`body` with `stream_options.include_usage` true, so a stream reports what it used."""
    if fields.stream_options is msgspec.UNSET:
        start = body.find(b"{") + 1  # the body decoded as an object: this is its opening brace
        view = memoryview(body)
        return b"".join((view[:start], _USAGE_OPTION, view[start:]))
    document = _document(body)
    options = document.get("stream_options")
    document["stream_options"] = {**(options or {}), "include_usage": True}
    return _encode(document)


def patch_fields(body: bytes, **fields: str) -> bytes:
    """`body` with each top-level field of `fields` set to its string: decoded and encoded
    again, for the rare request that needs more than `model` changed."""
    document = _document(body)
    document.update(fields)
    return _encode(document)


def _document(body: bytes) -> dict[str, Any]:
    try:
        document = msgspec.json.decode(body)
    except RecursionError:
        # Read once already, less deep in the stack; here a little deeper is too deep.
        raise invalid(TOO_DEEP) from None
    assert isinstance(document, dict)  # the field decoders accepted it as an object
    return document

"""What both Responses API translators share: the request as a client sends it, and the answer
(a response object, or its stream of typed events) as a client expects it.

The request is decoded strictly: a field this module does not know is refused with a 400 naming
it, as is a value with no equivalent in chat completions or Anthropic's Messages API. Labels
that earlier output items carry when a client sends them back as input (`id`, `status`,
`phase`, an output text's `annotations` and `logprobs`) are accepted and not sent on: they
describe that earlier output, not what to generate.

Answers are built by one `ResponseBuilder`, fed the provider's answer piece by piece: a plain
answer is fed whole and its final response object kept; a stream emits each event as its piece
arrives. So a stream's `response.completed` and a plain answer of the same provider reply are
the same object.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from proxy.errors import ProxyError, invalid
from proxy.translate._common import refused, request_fields
from proxy.usage import TokenUsage

Seal = Callable[[str], str]
"""The provider's id of an answer (its message id) → the response id the client sees."""

_encode = msgspec.json.Encoder().encode
_ABSENT = msgspec.Raw(b"null")


# -- the request, as a Responses client sends it -----------------------------------------------


class InputText(msgspec.Struct, tag_field="type", tag="input_text", forbid_unknown_fields=True):
    text: str


class InputImage(msgspec.Struct, tag_field="type", tag="input_image", forbid_unknown_fields=True):
    image_url: str | None = None
    detail: str | None = None
    file_id: str | None = None


class OutputText(msgspec.Struct, tag_field="type", tag="output_text", forbid_unknown_fields=True):
    text: str
    annotations: Any = None
    logprobs: Any = None


class Refusal(msgspec.Struct, tag_field="type", tag="refusal", forbid_unknown_fields=True):
    refusal: str


Part = InputText | InputImage | OutputText | Refusal


class Message(msgspec.Struct, forbid_unknown_fields=True):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Part]
    type: Literal["message"] = "message"
    id: str | None = None
    status: str | None = None
    phase: str | None = None


class Direct(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["direct"]


class FunctionCall(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None
    caller: Direct | None = None
    namespace: None = None
    asynchronous: Literal[False] | None = msgspec.field(default=None, name="async")


class FunctionCallOutput(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputText | InputImage]
    id: str | None = None
    status: str | None = None
    caller: Direct | None = None


class SummaryText(msgspec.Struct, tag_field="type", tag="summary_text", forbid_unknown_fields=True):
    text: str


class Reasoning(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["reasoning"]
    summary: list[SummaryText]
    id: str | None = None
    encrypted_content: str | None = None
    status: str | None = None
    content: Any = None


Item = Message | FunctionCall | FunctionCallOutput | Reasoning


class FunctionTool(msgspec.Struct, tag_field="type", tag="function", forbid_unknown_fields=True):
    name: str
    parameters: msgspec.Raw = _ABSENT
    strict: bool | None = None
    description: str | None = None
    allowed_callers: list[Literal["direct"]] | None = None
    defer_loading: Literal[False] | None = None
    output_schema: None = None


class NamedFunction(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["function"]
    name: str


class Format(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["text", "json_schema", "json_object"]
    name: str | None = None
    schema: msgspec.Raw = _ABSENT
    strict: bool | None = None
    description: str | None = None


class Text(msgspec.Struct, forbid_unknown_fields=True):
    format: Format | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(msgspec.Struct, forbid_unknown_fields=True):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_obfuscation: bool | None = None


class Request(msgspec.Struct, forbid_unknown_fields=True):
    model: str | None = None
    input: str | list[msgspec.Raw] | None = None
    instructions: str | None = None
    tools: list[msgspec.Raw] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    text: Text | None = None
    max_output_tokens: int | None = None
    reasoning: ReasoningConfig | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    safety_identifier: str | None = None
    metadata: dict[str, str] | None = None
    include: list[str] | None = None
    store: bool | None = None
    # Accepted only at a value that asks for nothing a translated request would not do anyway.
    previous_response_id: str | None = None
    background: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    top_logprobs: int | None = None
    service_tier: str | None = None
    max_tool_calls: int | None = None
    conversation: Any = None
    prompt: Any = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None
    context_management: Any = None


HARMLESS: dict[str, tuple[object, ...]] = {
    "previous_response_id": (),
    "background": (False,),
    "truncation": ("disabled",),
    "top_logprobs": (0,),
    "service_tier": ("auto", "default"),
    "max_tool_calls": (),
    "conversation": (),
    "prompt": (),
    "prompt_cache_retention": (),
    "prompt_cache_options": (),
    "context_management": (),
}
"""Fields with no equivalent in either target, and the values of each that ask for nothing."""

ENCRYPTED_REASONING = "reasoning.encrypted_content"
"""The one `include` a translated answer can honour (reasoning items carry it anyway)."""

_request = msgspec.json.Decoder(Request)


class _Kind(msgspec.Struct):
    type: str = "message"


_kind = msgspec.json.Decoder(_Kind)
_ITEMS: dict[str, msgspec.json.Decoder[Any]] = {
    "message": msgspec.json.Decoder(Message),
    "function_call": msgspec.json.Decoder(FunctionCall),
    "function_call_output": msgspec.json.Decoder(FunctionCallOutput),
    "reasoning": msgspec.json.Decoder(Reasoning),
}
_tool_decoder = msgspec.json.Decoder(FunctionTool)


class _ToolKind(msgspec.Struct):
    type: str = ""


_tool_kind = msgspec.json.Decoder(_ToolKind)


@dataclass(frozen=True, slots=True)
class Parsed:
    """A Responses request, decoded and checked for what no translation can carry."""

    request: Request
    items: list[Item]
    tools: list[FunctionTool]


def parse(body: bytes, target: str) -> Parsed:
    """`body` decoded for translation to `target`, or a 400 naming the field that cannot be."""
    request = request_fields(_request, body, target)
    for name, harmless in HARMLESS.items():
        value = getattr(request, name)
        if value is not None and value not in harmless:
            raise refused(name, target, _WHY.get(name, ""))
    for i, included in enumerate(request.include or ()):
        if included != ENCRYPTED_REASONING:
            raise refused(f"include[{i}]", target, f": {included!r} has no equivalent there")
    if request.store:
        raise refused(
            "store",
            target,
            ": a translated response is not stored (send `store: false`, or leave it out)",
        )
    items: list[Item] = []
    if isinstance(request.input, list):
        for i, raw in enumerate(request.input):
            kind = request_fields(_kind, raw, target, f"input[{i}]").type
            decoder = _ITEMS.get(kind)
            if decoder is None:
                raise refused(f"input[{i}].type", target, f": {kind!r} items have no equivalent")
            items.append(request_fields(decoder, raw, target, f"input[{i}]"))
    elif isinstance(request.input, str):
        items.append(Message(role="user", content=request.input))
    tools: list[FunctionTool] = []
    for i, raw in enumerate(request.tools or ()):
        kind = request_fields(_tool_kind, raw, target, f"tools[{i}]").type
        if kind != "function":
            raise refused(
                f"tools[{i}].type", target, f": {kind!r} tools are built into OpenAI's own API"
            )
        tools.append(request_fields(_tool_decoder, raw, target, f"tools[{i}]"))
    return Parsed(request, items, tools)


_WHY = {
    "previous_response_id": (
        ": this provider does not serve the Responses API, so nothing is stored with it; "
        "send the conversation in `input`"
    ),
    "background": ": the gateway answers each response while the request is open",
    "conversation": ": conversations are stored by OpenAI's own API",
    "prompt": ": prompt templates are stored by OpenAI's own API",
}


def no_previous_response() -> ProxyError:
    """The 400 for `previous_response_id` sent to a provider that stores nothing."""
    return invalid(
        "`previous_response_id` cannot be used with this model: its provider does not serve "
        "the Responses API, so the gateway translates for it and nothing is stored; send the "
        "conversation in `input` instead",
        param="previous_response_id",
    )


def image_url(image: InputImage, at: str, target: str) -> str:
    if image.file_id is not None:
        raise refused(f"{at}.file_id", target, ": files are stored by OpenAI's own API")
    if image.image_url is None:
        raise invalid(f"`{at}.image_url` is required", param=f"{at}.image_url")
    return image.image_url


def output_text(content: str | list[Part], at: str, target: str) -> str:
    """An assistant message's text (its output text and refusals, replayed as text)."""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if isinstance(part, OutputText | InputText):
            texts.append(part.text)
        elif isinstance(part, Refusal):
            texts.append(part.refusal)
        else:
            raise refused(f"{at}.content[{j}]", target, ": an assistant turn holds text only")
    return "".join(texts)


# -- the answer, as a Responses client expects it ----------------------------------------------


def usage_out(usage: TokenUsage) -> dict[str, Any]:
    """A response's `usage`: input counts cached tokens in, output counts reasoning in."""
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cache_read_tokens,
            "cache_write_tokens": usage.cache_write_tokens,
        },
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


_ECHOED = (
    "instructions",
    "max_output_tokens",
    "metadata",
    "parallel_tool_calls",
    "reasoning",
    "safety_identifier",
    "prompt_cache_key",
    "temperature",
    "text",
    "tool_choice",
    "tools",
    "top_p",
    "truncation",
    "user",
)
_DEFAULTS: dict[str, Any] = {
    "instructions": None,
    "max_output_tokens": None,
    "metadata": {},
    "parallel_tool_calls": True,
    "reasoning": {"effort": None, "summary": None},
    "temperature": 1.0,
    "text": {"format": {"type": "text"}},
    "tool_choice": "auto",
    "tools": [],
    "top_p": 1.0,
    "truncation": "disabled",
}
_top_level = msgspec.json.Decoder(dict[str, msgspec.Raw])


@dataclass(slots=True)
class Frame:
    """What every response object of one request carries besides its output."""

    seal: Seal
    created_at: int
    echo: dict[str, Any] = field(default_factory=dict)
    """The request's settings, as a response object repeats them (its defaults otherwise)."""

    @classmethod
    def of(cls, body: bytes, seal: Seal, created_at: int) -> Frame:
        given = _top_level.decode(body)
        echo: dict[str, Any] = {}
        for name in _ECHOED:
            value = given.get(name)
            if value is not None and bytes(value) != b"null":
                echo[name] = value
            elif name in _DEFAULTS:
                echo[name] = _DEFAULTS[name]
        return cls(seal, created_at, echo)


def item_id(prefix: str, base: str, index: int) -> str:
    """A stable id for the `index`-th output item of the answer `base`: the same answer gets
    the same ids, in its stream and as a plain answer."""
    digest = hashlib.blake2b(f"{base}:{index}".encode(), digest_size=20).hexdigest()
    return f"{prefix}_{digest}"


REDACTED = "redacted_thinking:"
"""Marks the `encrypted_content` of a reasoning item that holds Anthropic's redacted thinking."""
REFUSAL = "refusal"
"""The key a refusal's message item is fed under (chat completions' `refusal` deltas)."""


@dataclass(slots=True)
class _Item:
    key: object
    index: int
    body: dict[str, Any]
    text: list[str] = field(default_factory=list)
    open: bool = True


class ResponseBuilder:
    """A response object built from the provider's answer piece by piece, and the typed events
    of its stream (`event:` and `data:`, every event with the next `sequence_number`)."""

    def __init__(self, frame: Frame) -> None:
        self._frame = frame
        self._items: list[_Item] = []
        self._by_key: dict[object, _Item] = {}
        self._base = ""
        self.id = ""
        self.model = ""
        self.sequence = 0
        self.started = False
        self.ended = False
        self.final: dict[str, Any] = {}
        """The response object once `finish` made it."""

    # -- events ---------------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, **fields, "sequence_number": self.sequence}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + _encode(data) + b"\n\n"

    def response(
        self,
        status: str,
        usage: TokenUsage | None = None,
        incomplete: str | None = None,
    ) -> dict[str, Any]:
        """The response object as it stands, with `status`."""
        echo = self._frame.echo
        return {
            "id": self.id,
            "object": "response",
            "created_at": self._frame.created_at,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "instructions": echo.get("instructions"),
            "max_output_tokens": echo.get("max_output_tokens"),
            "model": self.model,
            "output": [item.body for item in self._items if not item.open],
            "parallel_tool_calls": echo["parallel_tool_calls"],
            "previous_response_id": None,
            "reasoning": echo["reasoning"],
            "store": False,
            "temperature": echo["temperature"],
            "text": echo["text"],
            "tool_choice": echo["tool_choice"],
            "tools": echo["tools"],
            "top_p": echo["top_p"],
            "truncation": echo["truncation"],
            "usage": usage_out(usage) if usage is not None else None,
            "user": echo.get("user"),
            "safety_identifier": echo.get("safety_identifier"),
            "prompt_cache_key": echo.get("prompt_cache_key"),
            "metadata": echo["metadata"],
        }

    def start(self, upstream_id: str, model: str) -> bytes:
        """`response.created` and `response.in_progress`, once the provider's answer began."""
        self._base = upstream_id
        self.id = self._frame.seal(upstream_id)
        self.model = model
        self.started = True
        created = self.response("in_progress")
        return self._event("response.created", response=created) + self._event(
            "response.in_progress", response=created
        )

    def _add(self, key: object, prefix: str, body: dict[str, Any]) -> tuple[_Item, bytes]:
        index = len(self._items)
        body = {"id": item_id(prefix, self._base, index), **body}
        item = _Item(key, index, body)
        self._items.append(item)
        self._by_key[key] = item
        return item, self._event("response.output_item.added", output_index=index, item=body)

    def item(self, key: object) -> _Item | None:
        """The open item fed under `key`, if any."""
        item = self._by_key.get(key)
        return item if item is not None and item.open else None

    # -- text -----------------------------------------------------------------------------------

    def text(self, key: object, delta: str) -> bytes:
        """`delta` added to the message item under `key` (`REFUSAL` for a refusal), opened when
        it is new."""
        refusal = key == REFUSAL
        out = b""
        item = self.item(key)
        if item is None:
            part = _refusal_part("") if refusal else _text_part("")
            item, out = self._add(
                key,
                "msg",
                {"type": "message", "status": "in_progress", "content": [], "role": "assistant"},
            )
            out += self._event(
                "response.content_part.added",
                item_id=item.body["id"],
                output_index=item.index,
                content_index=0,
                part=part,
            )
        if not delta:
            return out
        item.text.append(delta)
        if refusal:
            return out + self._event(
                "response.refusal.delta",
                item_id=item.body["id"],
                output_index=item.index,
                content_index=0,
                delta=delta,
            )
        return out + self._event(
            "response.output_text.delta",
            item_id=item.body["id"],
            output_index=item.index,
            content_index=0,
            delta=delta,
            logprobs=[],
        )

    # -- function calls ---------------------------------------------------------------------------

    def call(self, key: object, call_id: str, name: str) -> bytes:
        _, out = self._add(
            key,
            "fc",
            {
                "type": "function_call",
                "status": "in_progress",
                "arguments": "",
                "call_id": call_id,
                "name": name,
            },
        )
        return out

    def arguments(self, key: object, delta: str) -> bytes:
        item = self.item(key)
        if item is None or not delta:
            return b""
        item.text.append(delta)
        return self._event(
            "response.function_call_arguments.delta",
            item_id=item.body["id"],
            output_index=item.index,
            delta=delta,
        )

    # -- reasoning (Anthropic's thinking) ---------------------------------------------------------

    def reasoning(self, key: object, redacted: str | None = None) -> bytes:
        body: dict[str, Any] = {"type": "reasoning", "summary": []}
        if redacted is not None:
            body["encrypted_content"] = REDACTED + redacted
            _, out = self._add(key, "rs", body)
            return out
        item, out = self._add(key, "rs", body)
        return out + self._event(
            "response.reasoning_summary_part.added",
            item_id=item.body["id"],
            output_index=item.index,
            summary_index=0,
            part={"type": "summary_text", "text": ""},
        )

    def thought(self, key: object, delta: str) -> bytes:
        item = self.item(key)
        if item is None or not delta:
            return b""
        item.text.append(delta)
        return self._event(
            "response.reasoning_summary_text.delta",
            item_id=item.body["id"],
            output_index=item.index,
            summary_index=0,
            delta=delta,
        )

    def signature(self, key: object, signature: str) -> None:
        item = self.item(key)
        if item is not None and signature:
            item.body["encrypted_content"] = item.body.get("encrypted_content", "") + signature

    # -- ends -------------------------------------------------------------------------------------

    def close(self, key: object) -> bytes:
        """The item under `key` done: its `.done` events, with everything it holds."""
        item = self.item(key)
        if item is None:
            return b""
        item.open = False
        self._by_key.pop(key, None)
        body, ident, index = item.body, item.body["id"], item.index
        text = "".join(item.text)
        kind = body["type"]
        out = b""
        if kind == "message":
            out += self._message_done(item, text)
        elif kind == "function_call":
            body["arguments"] = text
            body["status"] = "completed"
            out += self._event(
                "response.function_call_arguments.done",
                item_id=ident,
                output_index=index,
                name=body["name"],
                arguments=text,
            )
        elif "encrypted_content" not in body or not body["encrypted_content"].startswith(REDACTED):
            summary = {"type": "summary_text", "text": text}
            body["summary"] = [summary]
            out += self._event(
                "response.reasoning_summary_text.done",
                item_id=ident,
                output_index=index,
                summary_index=0,
                text=text,
            )
            out += self._event(
                "response.reasoning_summary_part.done",
                item_id=ident,
                output_index=index,
                summary_index=0,
                part=summary,
            )
        return out + self._event("response.output_item.done", output_index=index, item=body)

    def _message_done(self, item: _Item, text: str) -> bytes:
        body, ident, index = item.body, item.body["id"], item.index
        refusal = item.key == REFUSAL
        part = _refusal_part(text) if refusal else _text_part(text)
        body["content"] = [part]
        body["status"] = "completed"
        if refusal:
            done = self._event(
                "response.refusal.done",
                item_id=ident,
                output_index=index,
                content_index=0,
                refusal=text,
            )
        else:
            done = self._event(
                "response.output_text.done",
                item_id=ident,
                output_index=index,
                content_index=0,
                text=text,
                logprobs=[],
            )
        return done + self._event(
            "response.content_part.done",
            item_id=ident,
            output_index=index,
            content_index=0,
            part=part,
        )

    def finish(self, usage: TokenUsage | None, incomplete: str | None = None) -> bytes:
        """Every open item closed, then `response.completed` (or `response.incomplete`)."""
        out = b"".join(self.close(item.key) for item in list(self._items) if item.open)
        self.ended = True
        if incomplete is not None:
            self.final = self.response("incomplete", usage, incomplete)
            return out + self._event("response.incomplete", response=self.final)
        self.final = self.response("completed", usage)
        return out + self._event("response.completed", response=self.final)

    def fail(self, error: ProxyError) -> bytes:
        """The stream's last event: an `error` event in OpenAI's shape."""
        self.ended = True
        return error_event(error, self.sequence)


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


def _refusal_part(text: str) -> dict[str, Any]:
    return {"type": "refusal", "refusal": text}


def error_event(error: ProxyError, sequence: int) -> bytes:
    """A Responses stream's `error` event: what ends a stream that failed after it began."""
    data = {
        "type": "error",
        "code": error.code.value,
        "message": error.message,
        "param": error.param,
        "sequence_number": sequence,
    }
    return b"event: error\ndata: " + _encode(data) + b"\n\n"


def encode(value: Any) -> bytes:
    return _encode(value)

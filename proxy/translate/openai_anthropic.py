"""A client speaking OpenAI's chat completions, a provider speaking Anthropic's Messages API.

Requests: a field with no Anthropic equivalent is refused with a 400 naming it, never dropped;
so is any field this module does not know. A field at its harmless default (`n: 1`,
`logprobs: false`, `presence_penalty: 0`, `null` for any optional field…) is accepted.
Decisions where the two APIs differ:

- System and developer messages, wherever they stand, become Anthropic's `system`, in order
  (Anthropic has no system turn). One system message of plain text stays a string.
- Tool messages become `tool_result` blocks of a user turn; consecutive messages of one role are
  merged into one turn, since Anthropic's roles alternate. Empty text is left out: Anthropic
  refuses empty text blocks.
- An assistant `refusal` (field or content part) from an earlier turn is replayed as text.
- Tool call arguments must be a JSON object; an empty string counts as `{}`.
- `max_tokens` is required by Anthropic: `DEFAULT_MAX_TOKENS` when the client sets none.
  `max_tokens` and `max_completion_tokens` may both be sent only with the same value.
- `temperature` above 1 is refused: Anthropic's range is 0 to 1, and rescaling would change
  what the client asked for.
- `user` (or `safety_identifier`) becomes `metadata.user_id`.
- `stream_options` is accepted: Anthropic always reports usage, so the usage chunk is sent
  exactly when the client asked for it.

Answers: thinking blocks are left out (OpenAI's chat schema has no place for them; their tokens
are counted in `completion_tokens` anyway), as are blocks of server tools, which a translated
request cannot ask for. Text blocks are concatenated into `content`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from proxy.errors import ProxyError, invalid
from proxy.sse import Event, EventReader
from proxy.translate._common import (
    ANTHROPIC,
    FINISH_REASONS,
    OPENAI_TYPES,
    OpenAIUsageOut,
    anthropic_image,
    openai_error_type,
    openai_id,
    openai_usage,
    provider_error,
    refused,
    request_fields,
)
from proxy.translate._openai_request import (
    ABSENT,
    AssistantMessage,
    DeveloperMessage,
    FunctionDef,
    ImagePart,
    ImageURL,
    Message,
    Request,
    SystemMessage,
    TextPart,
    UserMessage,
    absent,
)
from proxy.usage import AnthropicUsage, TokenUsage, from_anthropic, updated
from vkgate.errors import ErrorCode
from vkgate.wire import ErrorBody, ErrorDetail

DEFAULT_MAX_TOKENS = 4096
"""`max_tokens` sent to Anthropic, which requires one, when the client set no limit."""

_EMPTY_SCHEMA = msgspec.Raw(b'{"type":"object","properties":{}}')
_EMPTY_INPUT = msgspec.Raw(b"{}")
_encode = msgspec.json.Encoder().encode
_object = msgspec.json.Decoder(dict[str, msgspec.Raw])


_HARMLESS: dict[str, tuple[object, ...]] = {
    "n": (1,),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "logit_bias": ({},),
    "seed": (),
    "store": (False,),
    "metadata": ({},),
    "modalities": (["text"],),
    "service_tier": ("auto",),
    "functions": ([],),
    "audio": (),
    "prediction": (),
    "reasoning_effort": (),
    "verbosity": (),
    "web_search_options": (),
    "function_call": (),
    "prompt_cache_key": (),
}
"""Fields with no Anthropic equivalent, and the values of each that ask for nothing."""

_request = msgspec.json.Decoder(Request)


def request(body: bytes, model: str) -> bytes:
    """An OpenAI chat completions request as an Anthropic Messages request for `model`."""
    fields = request_fields(_request, body, ANTHROPIC)
    for name, harmless in _HARMLESS.items():
        value = getattr(fields, name)
        if value is not None and value not in harmless:
            raise refused(name, ANTHROPIC)
    if fields.response_format is not None and fields.response_format.type != "text":
        raise refused("response_format", ANTHROPIC, ': only `{"type": "text"}` can be')
    system, messages = _conversation(fields.messages)
    out: dict[str, Any] = {"model": model, "max_tokens": _max_tokens(fields)}
    if system is not None:
        out["system"] = system
    out["messages"] = messages
    if fields.temperature is not None:
        if fields.temperature > 1:
            raise refused("temperature", ANTHROPIC, ": its range is 0 to 1")
        out["temperature"] = fields.temperature
    if fields.top_p is not None:
        out["top_p"] = fields.top_p
    if fields.stop is not None:
        stop = [fields.stop] if isinstance(fields.stop, str) else fields.stop
        if stop:
            out["stop_sequences"] = stop
    if fields.stream is not None:
        out["stream"] = fields.stream
    if (user := _user_id(fields)) is not None:
        out["metadata"] = {"user_id": user}
    if fields.tools is not None:
        out["tools"] = [_tool(tool.function) for tool in fields.tools]
    if (choice := _tool_choice(fields)) is not None:
        out["tool_choice"] = choice
    return _encode(out)


def _max_tokens(fields: Request) -> int:
    both = fields.max_tokens is not None and fields.max_completion_tokens is not None
    if both and fields.max_tokens != fields.max_completion_tokens:
        raise invalid(
            "`max_tokens` and `max_completion_tokens` disagree: send one of them",
            param="max_completion_tokens",
        )
    limit = fields.max_completion_tokens
    if limit is None:
        limit = fields.max_tokens
    return DEFAULT_MAX_TOKENS if limit is None else limit


def _user_id(fields: Request) -> str | None:
    both = fields.user is not None and fields.safety_identifier is not None
    if both and fields.user != fields.safety_identifier:
        raise invalid(
            "`user` and `safety_identifier` disagree: Anthropic takes one user id",
            param="safety_identifier",
        )
    return fields.user if fields.user is not None else fields.safety_identifier


Content = str | list[dict[str, Any]]


def _conversation(
    messages: list[Message],
) -> tuple[str | list[dict[str, Any]] | None, list[dict[str, Any]]]:
    system: list[str | list[TextPart]] = []
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        at = f"messages[{i}]"
        if isinstance(message, SystemMessage | DeveloperMessage):
            _no_name(message.name, at)
            system.append(message.content)
        elif isinstance(message, UserMessage):
            _no_name(message.name, at)
            _append(turns, "user", _user_content(message.content, at))
        elif isinstance(message, AssistantMessage):
            _append(turns, "assistant", _assistant_content(message, at))
        else:
            result = {
                "type": "tool_result",
                "tool_use_id": message.tool_call_id,
                "content": message.content
                if isinstance(message.content, str)
                else _text_blocks(message.content),
            }
            _append(turns, "user", [result])
    if not system:
        return None, turns
    if len(system) == 1 and isinstance(system[0], str):
        return system[0], turns
    blocks: list[dict[str, Any]] = []
    for content in system:
        blocks.extend(_blocks(content) if isinstance(content, str) else _text_blocks(content))
    return blocks, turns


def _no_name(name: str | None, at: str) -> None:
    if name is not None:
        raise refused(f"{at}.name", ANTHROPIC, ": it has no participant names")


def _append(turns: list[dict[str, Any]], role: str, content: Content) -> None:
    """Anthropic's roles alternate: a turn of the same role as the last is merged into it."""
    if turns and turns[-1]["role"] == role:
        last = turns[-1]
        last["content"] = _as_blocks(last["content"]) + _as_blocks(content)
    else:
        turns.append({"role": role, "content": content})


def _as_blocks(content: Content) -> list[dict[str, Any]]:
    return _blocks(content) if isinstance(content, str) else content


def _blocks(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}] if text else []


def _text_blocks(parts: list[TextPart]) -> list[dict[str, Any]]:
    return [{"type": "text", "text": part.text} for part in parts if part.text]


def _user_content(content: str | list[TextPart | ImagePart], at: str) -> Content:
    if isinstance(content, str):
        return content
    blocks: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        if isinstance(part, TextPart):
            blocks.extend(_blocks(part.text))
        else:
            blocks.append(_image(part.image_url, f"{at}.content[{j}].image_url"))
    return blocks


def _image(image: ImageURL, at: str) -> dict[str, Any]:
    if image.detail not in (None, "auto"):
        raise refused(f"{at}.detail", ANTHROPIC, ": it has no image detail levels")
    return anthropic_image(image.url, f"{at}.url")


def _assistant_content(message: AssistantMessage, at: str) -> Content:
    _no_name(message.name, at)
    for name in ("audio", "function_call"):
        if getattr(message, name) is not None:
            raise refused(f"{at}.{name}", ANTHROPIC)
    content = message.content
    if isinstance(content, str) and not message.tool_calls and message.refusal is None:
        return content
    blocks: list[dict[str, Any]] = []
    if isinstance(content, str):
        blocks.extend(_blocks(content))
    elif content is not None:
        for part in content:
            blocks.extend(_blocks(part.text if isinstance(part, TextPart) else part.refusal))
    if message.refusal is not None:
        blocks.extend(_blocks(message.refusal))
    for j, call in enumerate(message.tool_calls or ()):
        here = f"{at}.tool_calls[{j}]"
        if call.type != "function":
            raise refused(f"{here}.type", ANTHROPIC, ": only function tool calls can be")
        blocks.append(
            {
                "type": "tool_use",
                "id": call.id,
                "name": call.function.name,
                "input": _arguments(call.function.arguments, f"{here}.function.arguments"),
            }
        )
    if not blocks:
        raise invalid(f"`{at}` has neither content nor tool_calls", param=f"{at}.content")
    return blocks


def _arguments(arguments: str, param: str) -> msgspec.Raw:
    """The arguments as the JSON object Anthropic's `input` must be, byte for byte."""
    text = arguments.strip()
    if not text:
        return _EMPTY_INPUT
    try:
        _object.decode(text)
    except msgspec.ValidationError:
        raise invalid(f"`{param}` must be a JSON object", param=param) from None
    except msgspec.DecodeError:
        raise invalid(f"`{param}` is not valid JSON", param=param) from None
    return msgspec.Raw(text.encode())


def _tool(function: FunctionDef) -> dict[str, Any]:
    tool: dict[str, Any] = {"name": function.name}
    if function.description is not None:
        tool["description"] = function.description
    tool["input_schema"] = _EMPTY_SCHEMA if absent(function.parameters) else function.parameters
    if function.strict:
        tool["strict"] = True
    return tool


def _tool_choice(fields: Request) -> dict[str, Any] | None:
    choice = fields.tool_choice
    out: dict[str, Any] | None
    if choice is None:
        out = None
    elif choice == "auto":
        out = {"type": "auto"}
    elif choice == "none":
        out = {"type": "none"}
    elif choice == "required":
        out = {"type": "any"}
    elif choice.type == "function" and choice.function is not None:
        out = {"type": "tool", "name": choice.function.name}
    else:
        raise refused("tool_choice", ANTHROPIC, ": only a named function can be forced")
    if fields.parallel_tool_calls is False and fields.tools:
        if out is None:
            out = {"type": "auto"}
        if out["type"] != "none":
            out["disable_parallel_tool_use"] = True
    return out


# -- the answer, as Anthropic sends it ----------------------------------------------------------


class _Block(msgspec.Struct):
    type: str
    text: str = ""
    id: str = ""
    name: str = ""
    input: msgspec.Raw = ABSENT


class _AnthropicMessage(msgspec.Struct):
    id: str = ""
    model: str = ""
    content: list[_Block] = []
    stop_reason: str | None = None
    usage: AnthropicUsage | None = None


class _FunctionOut(msgspec.Struct):
    name: str
    arguments: str


class _ToolCallOut(msgspec.Struct, kw_only=True):
    id: str
    type: str = "function"
    function: _FunctionOut


class _MessageOut(msgspec.Struct, kw_only=True):
    role: str = "assistant"
    content: str | None
    refusal: None = None
    tool_calls: list[_ToolCallOut] | msgspec.UnsetType = msgspec.UNSET


class _ChoiceOut(msgspec.Struct, kw_only=True):
    index: int = 0
    message: _MessageOut
    logprobs: None = None
    finish_reason: str | None


class _CompletionOut(msgspec.Struct, kw_only=True):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[_ChoiceOut]
    usage: OpenAIUsageOut | msgspec.UnsetType = msgspec.UNSET


_message = msgspec.json.Decoder(_AnthropicMessage)


def response(data: bytes, created: int) -> bytes:
    """An Anthropic message as an OpenAI `chat.completion`."""
    try:
        message = _message.decode(data)
    except msgspec.DecodeError:
        raise provider_error("a message was expected") from None
    texts = [block.text for block in message.content if block.type == "text"]
    calls = [
        _ToolCallOut(id=block.id, function=_FunctionOut(block.name, _input_json(block.input)))
        for block in message.content
        if block.type == "tool_use"
    ]
    choice = _ChoiceOut(
        message=_MessageOut(
            content="".join(texts) if texts else None, tool_calls=calls or msgspec.UNSET
        ),
        finish_reason=_finish_reason(message.stop_reason),
    )
    return _encode(
        _CompletionOut(
            id=openai_id(message.id),
            created=created,
            model=message.model,
            choices=[choice],
            usage=openai_usage(from_anthropic(message.usage)) if message.usage else msgspec.UNSET,
        )
    )


def _input_json(value: msgspec.Raw) -> str:
    return "{}" if absent(value) else bytes(value).decode()


def _is_empty_object(value: msgspec.Raw) -> bool:
    if absent(value):
        return True
    try:
        return not _object.decode(value)
    except msgspec.DecodeError:
        return False


def _finish_reason(stop_reason: str | None) -> str | None:
    return None if stop_reason is None else FINISH_REASONS.get(stop_reason, "stop")


class _ErrorDetail(msgspec.Struct):
    type: str = ""
    message: str = ""


class _ErrorBody(msgspec.Struct):
    error: _ErrorDetail | None = None


_error = msgspec.json.Decoder(_ErrorBody)


def error(status: int, data: bytes) -> bytes:
    """An Anthropic error body as OpenAI's, keeping the provider's message; `code` is its type."""
    try:
        detail = _error.decode(data).error
    except msgspec.DecodeError:
        detail = None
    if detail is None or not detail.message:
        message = f"the provider answered with HTTP status {status}"
        return _encode(ErrorBody(ErrorDetail(message, openai_error_type(status), "provider_error")))
    return _encode(ErrorBody(_openai_error(detail, status)))


def _openai_error(detail: _ErrorDetail, status: int | None) -> ErrorDetail:
    kind = OPENAI_TYPES.get(detail.type)
    if kind is None:
        kind = openai_error_type(status) if status is not None else "api_error"
    return ErrorDetail(detail.message, kind, detail.type or "provider_error")


# -- streams --------------------------------------------------------------------------------------


class _StreamMessage(msgspec.Struct):
    id: str = ""
    model: str = ""
    usage: AnthropicUsage | None = None


class _StreamDelta(msgspec.Struct):
    type: str = ""
    text: str = ""
    partial_json: str = ""
    stop_reason: str | None = None


class _StreamEvent(msgspec.Struct):
    """Any Anthropic stream event: each type fills the fields it has."""

    type: str = ""
    message: _StreamMessage | None = None
    index: int = 0
    content_block: _Block | None = None
    delta: _StreamDelta | None = None
    usage: AnthropicUsage | None = None
    error: _ErrorDetail | None = None


class _FunctionDelta(msgspec.Struct):
    name: str | msgspec.UnsetType = msgspec.UNSET
    arguments: str | msgspec.UnsetType = msgspec.UNSET


class _ToolCallDelta(msgspec.Struct, kw_only=True):
    index: int
    id: str | msgspec.UnsetType = msgspec.UNSET
    type: str | msgspec.UnsetType = msgspec.UNSET
    function: _FunctionDelta


class _Delta(msgspec.Struct):
    role: str | msgspec.UnsetType = msgspec.UNSET
    content: str | msgspec.UnsetType = msgspec.UNSET
    tool_calls: list[_ToolCallDelta] | msgspec.UnsetType = msgspec.UNSET


class _ChunkChoice(msgspec.Struct, kw_only=True):
    index: int = 0
    delta: _Delta
    logprobs: None = None
    finish_reason: str | None = None


class _Chunk(msgspec.Struct, kw_only=True):
    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    choices: list[_ChunkChoice]
    usage: OpenAIUsageOut | msgspec.UnsetType | None = msgspec.UNSET


_event = msgspec.json.Decoder(_StreamEvent)
_DONE = b"data: [DONE]\n\n"
_IGNORED = frozenset({b"ping"})


class StreamTranslator:
    """Anthropic's stream events, cut anywhere, as OpenAI `chat.completion.chunk` events.

    Every chunk carries the message's id (as `chatcmpl-…`), `created` and the served model.
    With `include_usage`, every chunk carries `"usage": null` and a usage-only chunk precedes
    `[DONE]`, as OpenAI does. An error (Anthropic's `error` event, an unreadable event, or a
    stream that ends before its message did) ends the stream with OpenAI's in-stream error and
    no `[DONE]`; `errored` tells.
    """

    def __init__(self, created: int, include_usage: bool) -> None:
        self._created = created
        self._include_usage = include_usage
        self._reader = EventReader()
        self._id = ""
        self._reported: AnthropicUsage | None = None
        self._tool_calls: dict[int, int] = {}  # Anthropic's block index → OpenAI's call index
        self._finish_sent = False
        self._ended = False
        self.usage: TokenUsage | None = None
        self.model: str | None = None
        self.errored = False

    def feed(self, chunk: bytes) -> bytes:
        return self._translate(self._reader.feed(chunk))

    def finish(self) -> bytes:
        out = self._translate(self._reader.flush())
        if self._ended:
            return out
        if self._finish_sent:  # everything but `message_stop` arrived
            return out + self._end()
        return out + self._fail(
            ProxyError(ErrorCode.PROVIDER_ERROR, "the provider's stream ended before its answer")
        )

    def _translate(self, events: list[Event]) -> bytes:
        out: list[bytes] = []
        for event in events:
            if self._ended:
                break
            if event.name in _IGNORED:
                continue
            try:
                decoded = _event.decode(event.data)
            except msgspec.DecodeError:
                out.append(self._fail(provider_error("a stream event was not JSON")))
                break
            out.append(self._chunks(decoded))
        return b"".join(out)

    def _chunks(self, event: _StreamEvent) -> bytes:
        kind = event.type
        if kind == "content_block_delta" and event.delta is not None:
            return self._block_delta(event.index, event.delta)
        if kind == "message_start" and event.message is not None:
            self._id = openai_id(event.message.id)
            self.model = event.message.model
            if event.message.usage is not None:
                self._report(event.message.usage)
            return self._chunk(_Delta(role="assistant", content=""))
        if kind == "content_block_start" and event.content_block is not None:
            return self._block_start(event.index, event.content_block)
        if kind == "message_delta":
            if event.usage is not None:
                self._report(event.usage)
            stop_reason = event.delta.stop_reason if event.delta else None
            if stop_reason is None or self._finish_sent:
                return b""
            self._finish_sent = True
            return self._chunk(_Delta(), _finish_reason(stop_reason))
        if kind == "message_stop":
            return self._end()
        if kind == "error":
            detail = event.error or _ErrorDetail(message="the provider's stream failed")
            self.errored = self._ended = True
            return b"data: " + _encode(ErrorBody(_openai_error(detail, None))) + b"\n\n"
        return b""  # content_block_stop, ping, and event types Anthropic may add

    def _block_start(self, index: int, block: _Block) -> bytes:
        if block.type == "text":
            return self._chunk(_Delta(content=block.text)) if block.text else b""
        if block.type != "tool_use":
            return b""  # thinking and server tool blocks have no place in OpenAI's schema
        call = len(self._tool_calls)
        self._tool_calls[index] = call
        # A streamed tool call starts with an empty `input`; its JSON follows in deltas.
        arguments = "" if _is_empty_object(block.input) else _input_json(block.input)
        delta = _ToolCallDelta(
            index=call,
            id=block.id,
            type="function",
            function=_FunctionDelta(name=block.name, arguments=arguments),
        )
        return self._chunk(_Delta(tool_calls=[delta]))

    def _block_delta(self, index: int, delta: _StreamDelta) -> bytes:
        if delta.type == "text_delta" and delta.text:
            return self._chunk(_Delta(content=delta.text))
        if delta.type == "input_json_delta" and delta.partial_json:
            call = self._tool_calls.get(index)
            if call is not None:
                arguments = _FunctionDelta(arguments=delta.partial_json)
                return self._chunk(
                    _Delta(tool_calls=[_ToolCallDelta(index=call, function=arguments)])
                )
        return b""  # thinking, signatures and citations have no place in OpenAI's schema

    def _chunk(self, delta: _Delta, finish_reason: str | None = None) -> bytes:
        chunk = _Chunk(
            id=self._id,
            created=self._created,
            model=self.model or "",
            choices=[_ChunkChoice(delta=delta, finish_reason=finish_reason)],
            usage=None if self._include_usage else msgspec.UNSET,
        )
        return b"data: " + _encode(chunk) + b"\n\n"

    def _end(self) -> bytes:
        self._ended = True
        if not self._include_usage or self.usage is None:
            return _DONE
        chunk = _Chunk(
            id=self._id,
            created=self._created,
            model=self.model or "",
            choices=[],
            usage=openai_usage(self.usage),
        )
        return b"data: " + _encode(chunk) + b"\n\n" + _DONE

    def _fail(self, failure: ProxyError) -> bytes:
        self.errored = self._ended = True
        return b"data: " + failure.openai_body() + b"\n\n"

    def _report(self, usage: AnthropicUsage) -> None:
        self._reported = updated(self._reported, usage)
        self.usage = from_anthropic(self._reported)

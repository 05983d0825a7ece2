"""A client speaking Anthropic's Messages API, a provider speaking OpenAI's chat completions.

Requests: a field with no OpenAI equivalent is refused with a 400 naming it, never dropped; so
is any field this module does not know, and any block type but `text`, `image`, `tool_use` and
`tool_result` (documents, search results, thinking, server tools…). `null` counts as absent.
One deliberate exception: `cache_control` markers (on blocks, tools, system blocks, or the
request) are accepted and left out, because OpenAI-format providers cache prompt prefixes by
themselves; the cached tokens still come back in the usage.
Decisions where the two APIs differ:

- `system` becomes the first message, a system message: a string, or text parts for several
  blocks (one block stays a string, which every OpenAI-compatible server takes).
- A user turn's `tool_result` blocks become `tool` messages, in place; its other blocks stay a
  user message. A `tool_result` with `is_error: true` keeps the failure visible to the model:
  its content is prefixed with `Error: ` (OpenAI's tool messages have no error flag).
- An assistant turn's text blocks become its `content` (a string for one block, text parts
  for several), its `tool_use` blocks its `tool_calls`, in order; text between tool calls
  cannot keep its place, since OpenAI puts content before the calls.
- `stream: true` also asks for `stream_options.include_usage`: the usage must come back.

Answers: tool call arguments must parse to a JSON object (Anthropic promises `input` is one);
an empty string counts as `{}`. A call the model left unfinished because `max_tokens` cut it
off is left out (`stop_reason: max_tokens` says the answer was cut, as Anthropic's own answer
would); any other call with unreadable arguments makes the answer a 502, since making up an
`input` would have the client call a tool with arguments the model never gave.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from proxy.errors import invalid
from proxy.sse import Event, EventReader
from proxy.translate._common import (
    ANTHROPIC_TYPES_BY_OPENAI,
    OPENAI,
    STOP_REASONS,
    AnthropicUsageOut,
    anthropic_error_type,
    anthropic_id,
    anthropic_usage,
    provider_error,
    refused,
    request_fields,
)
from proxy.usage import OpenAIUsage, TokenUsage, from_openai

_encode = msgspec.json.Encoder().encode
_object = msgspec.json.Decoder(dict[str, msgspec.Raw])


# -- the request, as an Anthropic client sends it -----------------------------------------------


class _TextBlock(msgspec.Struct, tag_field="type", tag="text", forbid_unknown_fields=True):
    text: str
    cache_control: Any = None
    citations: list[Any] | None = None


class _Base64Source(msgspec.Struct, tag_field="type", tag="base64", forbid_unknown_fields=True):
    media_type: str
    data: str


class _URLSource(msgspec.Struct, tag_field="type", tag="url", forbid_unknown_fields=True):
    url: str


class _ImageBlock(msgspec.Struct, tag_field="type", tag="image", forbid_unknown_fields=True):
    source: _Base64Source | _URLSource
    cache_control: Any = None


class _ToolUseBlock(msgspec.Struct, tag_field="type", tag="tool_use", forbid_unknown_fields=True):
    id: str
    name: str
    input: msgspec.Raw
    cache_control: Any = None


class _ToolResultBlock(
    msgspec.Struct, tag_field="type", tag="tool_result", forbid_unknown_fields=True
):
    tool_use_id: str
    content: str | list[_TextBlock | _ImageBlock] | None = None
    is_error: bool | None = None
    cache_control: Any = None


_Block = _TextBlock | _ImageBlock | _ToolUseBlock | _ToolResultBlock


class _Message(msgspec.Struct, forbid_unknown_fields=True):
    role: Literal["user", "assistant"]
    content: str | list[_Block]


class _ToolKind(msgspec.Struct):
    type: str | None = None


class _Tool(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    input_schema: msgspec.Raw
    description: str | None = None
    strict: bool | None = None
    type: Literal["custom"] | None = None
    cache_control: Any = None


class _ChoiceAuto(msgspec.Struct, tag_field="type", tag="auto", forbid_unknown_fields=True):
    disable_parallel_tool_use: bool | None = None


class _ChoiceAny(msgspec.Struct, tag_field="type", tag="any", forbid_unknown_fields=True):
    disable_parallel_tool_use: bool | None = None


class _ChoiceTool(msgspec.Struct, tag_field="type", tag="tool", forbid_unknown_fields=True):
    name: str
    disable_parallel_tool_use: bool | None = None


class _ChoiceNone(msgspec.Struct, tag_field="type", tag="none", forbid_unknown_fields=True):
    pass


class _Thinking(msgspec.Struct):
    type: str


class _Metadata(msgspec.Struct, forbid_unknown_fields=True):
    user_id: str | None = None


class _Request(msgspec.Struct, forbid_unknown_fields=True):
    messages: list[_Message]
    max_tokens: int
    model: str | None = None
    system: str | list[_TextBlock] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    metadata: _Metadata | None = None
    stream: bool | None = None
    tools: list[msgspec.Raw] | None = None
    tool_choice: _ChoiceAuto | _ChoiceAny | _ChoiceTool | _ChoiceNone | None = None
    thinking: _Thinking | None = None
    service_tier: str | None = None
    cache_control: Any = None  # accepted: see the module's docstring
    # Refused whatever their value but null.
    top_k: int | None = None
    container: Any = None
    mcp_servers: Any = None


_request = msgspec.json.Decoder(_Request)
_tool_kind = msgspec.json.Decoder(_ToolKind)
_tool = msgspec.json.Decoder(_Tool)


def request(body: bytes, model: str, *, max_tokens_field: str = "max_tokens") -> bytes:
    """An Anthropic Messages request as an OpenAI chat completions request for `model`.

    `max_tokens_field` is `max_completion_tokens` for OpenAI's own API (its reasoning models
    refuse `max_tokens`); servers that merely speak OpenAI's API know `max_tokens`.
    """
    fields = request_fields(_request, body, OPENAI)
    for name in ("top_k", "container", "mcp_servers"):
        if getattr(fields, name) is not None:
            raise refused(name, OPENAI)
    if fields.thinking is not None and fields.thinking.type != "disabled":
        raise refused("thinking", OPENAI, ': only `{"type": "disabled"}` can be')
    if fields.service_tier not in (None, "auto"):
        raise refused("service_tier", OPENAI, ": only `auto` can be")
    messages: list[dict[str, Any]] = []
    if fields.system:
        messages.append({"role": "system", "content": _system(fields.system)})
    for i, message in enumerate(fields.messages):
        at = f"messages[{i}]"
        if isinstance(message.content, str):
            messages.append({"role": message.role, "content": message.content})
        elif message.role == "user":
            messages.extend(_user_turn(message.content, at))
        else:
            messages.append(_assistant_turn(message.content, at))
    out: dict[str, Any] = {
        "model": model,
        "messages": messages,
        max_tokens_field: fields.max_tokens,
    }
    if fields.temperature is not None:
        out["temperature"] = fields.temperature
    if fields.top_p is not None:
        out["top_p"] = fields.top_p
    if fields.stop_sequences:
        out["stop"] = fields.stop_sequences
    if fields.stream is not None:
        out["stream"] = fields.stream
        if fields.stream:
            out["stream_options"] = {"include_usage": True}
    if fields.metadata is not None and fields.metadata.user_id is not None:
        out["user"] = fields.metadata.user_id
    if fields.tools is not None:
        out["tools"] = [_function(tool, f"tools[{i}]") for i, tool in enumerate(fields.tools)]
    if fields.tool_choice is not None:
        out.update(_tool_choice(fields.tool_choice))
    return _encode(out)


def _system(system: str | list[_TextBlock]) -> str | list[dict[str, Any]]:
    if isinstance(system, str):
        return system
    parts = [_text_part(block, f"system[{i}]") for i, block in enumerate(system)]
    # One block stays a string: OpenAI-compatible servers that take no parts still take it.
    return parts[0]["text"] if len(parts) == 1 else parts


def _text_part(block: _TextBlock, at: str) -> dict[str, Any]:
    if block.citations:
        raise refused(f"{at}.citations", OPENAI)
    return {"type": "text", "text": block.text}


def _image_part(block: _ImageBlock) -> dict[str, Any]:
    source = block.source
    if isinstance(source, _Base64Source):
        url = f"data:{source.media_type};base64,{source.data}"
    else:
        url = source.url
    return {"type": "image_url", "image_url": {"url": url}}


def _user_turn(blocks: list[_Block], at: str) -> list[dict[str, Any]]:
    """Tool results become tool messages in place; the blocks between them, user messages."""
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        here = f"{at}.content[{j}]"
        if isinstance(block, _TextBlock):
            parts.append(_text_part(block, here))
        elif isinstance(block, _ImageBlock):
            parts.append(_image_part(block))
        elif isinstance(block, _ToolResultBlock):
            if parts:
                out.append({"role": "user", "content": parts})
                parts = []
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": block.tool_use_id,
                    "content": _tool_result(block, here),
                }
            )
        else:
            raise invalid(f"`{here}`: a user turn cannot hold a tool_use block", param=here)
    if parts or not out:
        out.append({"role": "user", "content": parts})
    return out


def _tool_result(block: _ToolResultBlock, at: str) -> str | list[dict[str, Any]]:
    content: str | list[dict[str, Any]]
    if block.content is None or isinstance(block.content, str):
        content = block.content or ""
    else:
        content = []
        for k, part in enumerate(block.content):
            if isinstance(part, _ImageBlock):
                raise refused(f"{at}.content[{k}]", OPENAI, ": its tool messages hold text only")
            content.append(_text_part(part, f"{at}.content[{k}]"))
    if not block.is_error:
        return content
    if isinstance(content, str):
        return f"Error: {content}" if content else "Error"
    if content:
        first = content[0]
        return [{**first, "text": f"Error: {first['text']}"}, *content[1:]]
    return "Error"


def _assistant_turn(blocks: list[_Block], at: str) -> dict[str, Any]:
    texts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        here = f"{at}.content[{j}]"
        if isinstance(block, _TextBlock):
            texts.append(_text_part(block, here))
        elif isinstance(block, _ToolUseBlock):
            arguments = bytes(block.input).decode()
            if not arguments.lstrip().startswith("{"):
                raise invalid(f"`{here}.input` must be an object", param=f"{here}.input")
            calls.append(
                {
                    "id": block.id,
                    "type": "function",
                    "function": {"name": block.name, "arguments": arguments},
                }
            )
        else:
            kind = "an image" if isinstance(block, _ImageBlock) else "a tool_result"
            raise refused(here, OPENAI, f": an assistant message cannot hold {kind}")
    content: str | list[dict[str, Any]] | None
    if not texts:
        content = None
    elif len(texts) == 1:
        content = texts[0]["text"]
    else:
        content = texts
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return message


def _function(raw: msgspec.Raw, at: str) -> dict[str, Any]:
    kind = request_fields(_tool_kind, raw, OPENAI, at).type
    if kind not in (None, "custom"):
        raise refused(f"{at}.type", OPENAI, ": only custom tools can be, not Anthropic's own")
    tool = request_fields(_tool, raw, OPENAI, at)
    function: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    function["parameters"] = tool.input_schema
    if tool.strict:
        function["strict"] = True
    return {"type": "function", "function": function}


def _tool_choice(
    choice: _ChoiceAuto | _ChoiceAny | _ChoiceTool | _ChoiceNone,
) -> dict[str, Any]:
    if isinstance(choice, _ChoiceNone):
        return {"tool_choice": "none"}
    out: dict[str, Any]
    if isinstance(choice, _ChoiceAuto):
        out = {"tool_choice": "auto"}
    elif isinstance(choice, _ChoiceAny):
        out = {"tool_choice": "required"}
    else:
        out = {"tool_choice": {"type": "function", "function": {"name": choice.name}}}
    if choice.disable_parallel_tool_use:
        out["parallel_tool_calls"] = False
    return out


# -- the answer, as an OpenAI-format provider sends it ------------------------------------------


class _FunctionIn(msgspec.Struct):
    name: str = ""
    arguments: str | None = None


class _ToolCallIn(msgspec.Struct):
    id: str = ""
    function: _FunctionIn | None = None


class _MessageIn(msgspec.Struct):
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[_ToolCallIn] | None = None


class _ChoiceIn(msgspec.Struct):
    message: _MessageIn | None = None
    finish_reason: str | None = None


class _CompletionIn(msgspec.Struct):
    id: str = ""
    model: str = ""
    choices: list[_ChoiceIn] = []
    usage: OpenAIUsage | None = None


class _TextOut(msgspec.Struct, tag_field="type", tag="text"):
    text: str


class _ToolUseOut(msgspec.Struct, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: msgspec.Raw


class _MessageOut(msgspec.Struct, kw_only=True):
    id: str
    type: str = "message"
    role: str = "assistant"
    model: str
    content: list[_TextOut | _ToolUseOut]
    stop_reason: str
    stop_sequence: None = None
    usage: AnthropicUsageOut


_completion = msgspec.json.Decoder(_CompletionIn)
_EMPTY_INPUT = msgspec.Raw(b"{}")


def response(data: bytes) -> bytes:
    """An OpenAI `chat.completion` as an Anthropic message."""
    try:
        completion = _completion.decode(data)
    except msgspec.DecodeError:
        raise provider_error("a chat completion was expected") from None
    if not completion.choices or completion.choices[0].message is None:
        raise provider_error("the chat completion holds no message")
    choice = completion.choices[0]
    message = choice.message
    assert message is not None
    content: list[_TextOut | _ToolUseOut] = []
    for text in (message.content, message.refusal):
        if text:
            content.append(_TextOut(text))
    for j, call in enumerate(message.tool_calls or ()):
        function = call.function or _FunctionIn()
        arguments = _input(function.arguments)
        if arguments is None:
            if choice.finish_reason == "length":
                continue  # cut off mid-call by max_tokens: see the module's docstring
            raise provider_error(f"choices[0].message.tool_calls[{j}] has no JSON object")
        content.append(_ToolUseOut(id=call.id, name=function.name, input=arguments))
    usage = from_openai(completion.usage) if completion.usage else TokenUsage()
    return _encode(
        _MessageOut(
            id=anthropic_id(completion.id),
            model=completion.model,
            content=content,
            stop_reason=_stop_reason(choice.finish_reason),
            usage=anthropic_usage(usage),
        )
    )


def _input(arguments: str | None) -> msgspec.Raw | None:
    """The arguments as Anthropic's `input` object, or None when they are not one."""
    text = (arguments or "").strip()
    if not text:
        return _EMPTY_INPUT
    try:
        _object.decode(text)
    except msgspec.DecodeError:
        return None
    return msgspec.Raw(text.encode())


def _stop_reason(finish_reason: str | None) -> str:
    return STOP_REASONS.get(finish_reason or "stop", "end_turn")


class _OpenAIErrorDetail(msgspec.Struct):
    message: str | None = None
    type: str | None = None


class _OpenAIError(msgspec.Struct):
    error: _OpenAIErrorDetail | str | None = None


class _AnthropicErrorDetail(msgspec.Struct):
    type: str
    message: str


class _AnthropicError(msgspec.Struct, tag_field="type", tag="error"):
    error: _AnthropicErrorDetail


_openai_error = msgspec.json.Decoder(_OpenAIError)


def error(status: int, data: bytes) -> bytes:
    """An OpenAI error body as Anthropic's, its `type` chosen by status, its message kept."""
    try:
        detail = _openai_error.decode(data).error
    except msgspec.DecodeError:
        detail = None
    message = detail if isinstance(detail, str) else detail.message if detail else None
    if not message:
        message = f"the provider answered with HTTP status {status}"
    return _encode(_AnthropicError(_AnthropicErrorDetail(anthropic_error_type(status), message)))


# -- streams --------------------------------------------------------------------------------------


class _FunctionDeltaIn(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _ToolCallDeltaIn(msgspec.Struct):
    index: int = 0
    id: str | None = None
    function: _FunctionDeltaIn | None = None


class _DeltaIn(msgspec.Struct):
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[_ToolCallDeltaIn] | None = None


class _ChunkChoiceIn(msgspec.Struct):
    index: int = 0
    delta: _DeltaIn | None = None
    finish_reason: str | None = None


class _ChunkIn(msgspec.Struct):
    id: str = ""
    model: str = ""
    choices: list[_ChunkChoiceIn] = []
    usage: OpenAIUsage | None = None
    error: _OpenAIErrorDetail | None = None


class _StartedMessage(msgspec.Struct, kw_only=True):
    id: str
    type: str = "message"
    role: str = "assistant"
    model: str
    content: list[Any] = []
    stop_reason: None = None
    stop_sequence: None = None
    usage: AnthropicUsageOut


class _MessageStart(msgspec.Struct, tag_field="type", tag="message_start"):
    message: _StartedMessage


class _ToolUseStart(msgspec.Struct, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any] = {}


class _BlockStart(msgspec.Struct, tag_field="type", tag="content_block_start"):
    index: int
    content_block: _TextOut | _ToolUseStart


class _TextDelta(msgspec.Struct, tag_field="type", tag="text_delta"):
    text: str


class _InputJsonDelta(msgspec.Struct, tag_field="type", tag="input_json_delta"):
    partial_json: str


class _BlockDelta(msgspec.Struct, tag_field="type", tag="content_block_delta"):
    index: int
    delta: _TextDelta | _InputJsonDelta


class _BlockStop(msgspec.Struct, tag_field="type", tag="content_block_stop"):
    index: int


class _Stop(msgspec.Struct):
    stop_reason: str
    stop_sequence: None = None


class _OutputOnly(msgspec.Struct):
    output_tokens: int = 0


class _MessageDelta(msgspec.Struct, tag_field="type", tag="message_delta"):
    delta: _Stop
    usage: AnthropicUsageOut | _OutputOnly


class _MessageStop(msgspec.Struct, tag_field="type", tag="message_stop"):
    pass


_chunk = msgspec.json.Decoder(_ChunkIn)
_DONE = b"[DONE]"
_NO_USAGE = AnthropicUsageOut(
    input_tokens=0, output_tokens=0, cache_creation_input_tokens=0, cache_read_input_tokens=0
)


def _sse(name: bytes, event: msgspec.Struct) -> bytes:
    return b"event: " + name + b"\ndata: " + _encode(event) + b"\n\n"


class StreamTranslator:
    """OpenAI chunks, cut anywhere, as Anthropic's stream events.

    `message_delta` (with the stop reason and the usage) is held until the usage chunk or
    `[DONE]` arrives, so the usage is in it. Each tool call is one `tool_use` block, found by
    its OpenAI `index`. An error (OpenAI's in-stream error, an unreadable chunk, or a stream
    that ends before its answer did) ends the stream with Anthropic's `error` event; `errored`
    tells.
    """

    def __init__(self) -> None:
        self._reader = EventReader()
        self._started = False
        self._id = ""
        self._open = -1  # the block being streamed, or -1
        self._open_text = False
        self._blocks = 0
        self._tool_blocks: dict[int, int] = {}  # OpenAI's call index → Anthropic's block index
        self._stop_reason: str | None = None
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
        if self._stop_reason is not None:  # a provider that does not send `[DONE]`
            return out + self._end()
        return out + self._fail("api_error", "the provider's stream ended before its answer")

    def _translate(self, events: list[Event]) -> bytes:
        out: list[bytes] = []
        for event in events:
            if self._ended:
                break
            if event.data == _DONE:
                out.append(self._end())
                break
            try:
                chunk = _chunk.decode(event.data)
            except msgspec.DecodeError:
                out.append(self._fail("api_error", "the provider sent a chunk that is not JSON"))
                break
            out.append(self._events(chunk))
        return b"".join(out)

    def _events(self, chunk: _ChunkIn) -> bytes:
        if chunk.error is not None:
            kind = ANTHROPIC_TYPES_BY_OPENAI.get(chunk.error.type or "", "api_error")
            return self._fail(kind, chunk.error.message or "the provider's stream failed")
        out: list[bytes] = []
        choice = next((c for c in chunk.choices if c.index == 0), None)
        if choice is not None:
            if not self._started:
                out.append(self._start(chunk.id, chunk.model))
            delta = choice.delta
            if delta is not None:
                for text in (delta.content, delta.refusal):
                    if text:
                        out.append(self._text(text))
                for call in delta.tool_calls or ():
                    out.append(self._tool_call(call))
            if choice.finish_reason is not None:
                out.append(self._close())
                self._stop_reason = _stop_reason(choice.finish_reason)
        if chunk.usage is not None:
            self.usage = from_openai(chunk.usage)
            if self._stop_reason is not None:
                out.append(self._end())
        return b"".join(out)

    def _start(self, completion_id: str, model: str) -> bytes:
        self._started = True
        self._id = anthropic_id(completion_id)
        self.model = model
        message = _StartedMessage(id=self._id, model=model, usage=_NO_USAGE)
        return _sse(b"message_start", _MessageStart(message))

    def _text(self, text: str) -> bytes:
        out = b""
        if not self._open_text:
            out = self._close() + self._begin(_TextOut(""))
            self._open_text = True
        return out + _sse(b"content_block_delta", _BlockDelta(self._open, _TextDelta(text)))

    def _tool_call(self, call: _ToolCallDeltaIn) -> bytes:
        out = b""
        block = self._tool_blocks.get(call.index)
        function = call.function or _FunctionDeltaIn()
        if block is None:
            start = _ToolUseStart(call.id or f"call_{call.index}", function.name or "")
            out = self._close() + self._begin(start)
            block = self._tool_blocks[call.index] = self._open
        if function.arguments:
            # A provider interleaving parallel calls writes to a block already stopped:
            # Anthropic's SDKs still gather the deltas by index.
            delta = _BlockDelta(block, _InputJsonDelta(function.arguments))
            out += _sse(b"content_block_delta", delta)
        return out

    def _begin(self, block: _TextOut | _ToolUseStart) -> bytes:
        self._open = self._blocks
        self._blocks += 1
        return _sse(b"content_block_start", _BlockStart(self._open, block))

    def _close(self) -> bytes:
        if self._open < 0:
            return b""
        index, self._open, self._open_text = self._open, -1, False
        return _sse(b"content_block_stop", _BlockStop(index))

    def _end(self) -> bytes:
        self._ended = True
        out = b"" if self._started else self._start("", self.model or "")
        usage: AnthropicUsageOut | _OutputOnly = (
            anthropic_usage(self.usage) if self.usage is not None else _OutputOnly()
        )
        delta = _MessageDelta(_Stop(self._stop_reason or "end_turn"), usage)
        return (
            out
            + self._close()
            + _sse(b"message_delta", delta)
            + _sse(b"message_stop", _MessageStop())
        )

    def _fail(self, kind: str, message: str) -> bytes:
        self.errored = self._ended = True
        error = _AnthropicError(_AnthropicErrorDetail(kind, message))
        return _sse(b"error", error)

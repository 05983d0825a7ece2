"""Answers of the cloud providers' formats, as OpenAI and Anthropic clients get them.

Bedrock's Converse and Google's Gemini answers are read into one neutral shape (`Answer`, and
the calls of a `StreamWriter` for a stream), which is then written in the client's format. So a
provider's format is read once, by `_converse` or `_gemini`, and each client format is written
once, here, for both providers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

import msgspec

from proxy.translate._common import (
    AnthropicUsageOut,
    OpenAIUsageOut,
    anthropic_usage,
    openai_usage,
)
from proxy.usage import TokenUsage
from vkgate.wire import ErrorBody, ErrorDetail

_encode = msgspec.json.Encoder().encode


class Stop(StrEnum):
    """Why an answer ended, in terms both client formats can say."""

    END = "end"
    STOP_SEQUENCE = "stop_sequence"
    MAX_TOKENS = "max_tokens"
    CONTEXT_WINDOW = "context_window"
    TOOL_USE = "tool_use"
    FILTERED = "filtered"
    """A safety filter or guardrail stopped it."""


FINISH_REASONS = {
    Stop.END: "stop",
    Stop.STOP_SEQUENCE: "stop",
    Stop.MAX_TOKENS: "length",
    Stop.CONTEXT_WINDOW: "length",
    Stop.TOOL_USE: "tool_calls",
    Stop.FILTERED: "content_filter",
}
STOP_REASONS = {
    Stop.END: "end_turn",
    Stop.STOP_SEQUENCE: "stop_sequence",
    Stop.MAX_TOKENS: "max_tokens",
    Stop.CONTEXT_WINDOW: "model_context_window_exceeded",
    Stop.TOOL_USE: "tool_use",
    Stop.FILTERED: "refusal",
}


@dataclass(slots=True)
class Text:
    text: str


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    """The call's input: a JSON object, as text."""


@dataclass(slots=True)
class Thinking:
    text: str
    signature: str = ""


@dataclass(slots=True)
class RedactedThinking:
    data: str


Block = Text | ToolCall | Thinking | RedactedThinking


@dataclass(slots=True)
class Answer:
    """A provider's whole answer, read."""

    id: str
    model: str
    blocks: list[Block] = field(default_factory=list)
    stop: Stop = Stop.END
    usage: TokenUsage | None = None


# -- OpenAI's chat completion --------------------------------------------------------------------


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
    finish_reason: str


class _CompletionOut(msgspec.Struct, kw_only=True):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[_ChoiceOut]
    usage: OpenAIUsageOut | msgspec.UnsetType = msgspec.UNSET


def openai_completion(answer: Answer, created: int) -> bytes:
    """The answer as an OpenAI `chat.completion`: text joined into `content`, thinking left out
    (OpenAI's chat schema has no place for it; its tokens are in `completion_tokens`)."""
    texts = [block.text for block in answer.blocks if isinstance(block, Text)]
    calls = [
        _ToolCallOut(id=block.id, function=_FunctionOut(block.name, block.arguments))
        for block in answer.blocks
        if isinstance(block, ToolCall)
    ]
    message = _MessageOut(
        content="".join(texts) if texts else None, tool_calls=calls or msgspec.UNSET
    )
    return _encode(
        _CompletionOut(
            id=answer.id,
            created=created,
            model=answer.model,
            choices=[_ChoiceOut(message=message, finish_reason=FINISH_REASONS[answer.stop])],
            usage=openai_usage(answer.usage) if answer.usage is not None else msgspec.UNSET,
        )
    )


# -- Anthropic's message -------------------------------------------------------------------------


class _TextOut(msgspec.Struct, tag_field="type", tag="text"):
    text: str


class _ToolUseOut(msgspec.Struct, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: msgspec.Raw


class _ThinkingOut(msgspec.Struct, tag_field="type", tag="thinking"):
    thinking: str
    signature: str


class _RedactedOut(msgspec.Struct, tag_field="type", tag="redacted_thinking"):
    data: str


_BlockOut = _TextOut | _ToolUseOut | _ThinkingOut | _RedactedOut


class _AnthropicMessageOut(msgspec.Struct, kw_only=True):
    id: str
    type: str = "message"
    role: str = "assistant"
    model: str
    content: list[_BlockOut]
    stop_reason: str
    stop_sequence: None = None
    usage: AnthropicUsageOut


def _block_out(block: Block) -> _BlockOut:
    if isinstance(block, Text):
        return _TextOut(block.text)
    if isinstance(block, ToolCall):
        return _ToolUseOut(block.id, block.name, msgspec.Raw(block.arguments.encode()))
    if isinstance(block, Thinking):
        return _ThinkingOut(block.text, block.signature)
    return _RedactedOut(block.data)


def anthropic_message(answer: Answer) -> bytes:
    return _encode(
        _AnthropicMessageOut(
            id=answer.id,
            model=answer.model,
            content=[_block_out(block) for block in answer.blocks],
            stop_reason=STOP_REASONS[answer.stop],
            usage=anthropic_usage(answer.usage or TokenUsage()),
        )
    )


# -- errors --------------------------------------------------------------------------------------


class _AnthropicErrorDetail(msgspec.Struct):
    type: str
    message: str


class _AnthropicError(msgspec.Struct, tag_field="type", tag="error"):
    error: _AnthropicErrorDetail


def openai_error(message: str, kind: str, code: str) -> bytes:
    return _encode(ErrorBody(ErrorDetail(message, kind, code)))


def anthropic_error(message: str, kind: str) -> bytes:
    return _encode(_AnthropicError(_AnthropicErrorDetail(kind, message)))


# -- streams -------------------------------------------------------------------------------------


class StreamWriter(Protocol):
    """A stream in the client's format, written as a provider's stream is read.

    The reader calls `begin` first (once it knows the answer's id and model), then the pieces
    in order, then `stop` and `usage` in either order as the provider tells them, and `end`
    when the provider's stream ended whole; `fail` instead when it broke.
    """

    def begin(self, answer_id: str, model: str) -> bytes: ...

    def text(self, text: str) -> bytes: ...

    def thinking(self, text: str) -> bytes: ...

    def signature(self, signature: str) -> bytes: ...

    def redacted_thinking(self, data: str) -> bytes: ...

    def tool_call(self, key: int, call_id: str, name: str) -> bytes:
        """A tool call starts; `key` names it for its `tool_arguments`."""
        ...

    def tool_arguments(self, key: int, fragment: str) -> bytes: ...

    def stop(self, reason: Stop) -> bytes: ...

    def usage(self, usage: TokenUsage) -> None: ...

    def end(self) -> bytes: ...

    def fail(self, status: int, message: str) -> bytes:
        """The stream's error event; `status` is the HTTP status the error would have had."""
        ...


class _FunctionDelta(msgspec.Struct, omit_defaults=True):
    name: str | msgspec.UnsetType = msgspec.UNSET
    arguments: str | msgspec.UnsetType = msgspec.UNSET


class _ToolCallDelta(msgspec.Struct, kw_only=True, omit_defaults=True):
    index: int
    id: str | msgspec.UnsetType = msgspec.UNSET
    type: str | msgspec.UnsetType = msgspec.UNSET
    function: _FunctionDelta


class _Delta(msgspec.Struct, omit_defaults=True):
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


_DONE = b"data: [DONE]\n\n"
_OPENAI_ERROR_TYPES = {400: "invalid_request_error", 429: "rate_limit_error"}


class OpenAIChunks:
    """OpenAI `chat.completion.chunk` events: thinking is left out, each tool call gets the next
    `index`; with `include_usage` every chunk says `"usage": null` and a usage-only chunk
    precedes `[DONE]`, as OpenAI does."""

    def __init__(self, created: int, include_usage: bool) -> None:
        self._created = created
        self._include_usage = include_usage
        self._id = ""
        self._model = ""
        self._calls: dict[int, int] = {}
        self._usage: TokenUsage | None = None

    def begin(self, answer_id: str, model: str) -> bytes:
        self._id, self._model = answer_id, model
        return self._chunk(_Delta(role="assistant", content=""))

    def text(self, text: str) -> bytes:
        return self._chunk(_Delta(content=text)) if text else b""

    def thinking(self, text: str) -> bytes:
        return b""

    def signature(self, signature: str) -> bytes:
        return b""

    def redacted_thinking(self, data: str) -> bytes:
        return b""

    def tool_call(self, key: int, call_id: str, name: str) -> bytes:
        index = self._calls[key] = len(self._calls)
        call = _ToolCallDelta(
            index=index,
            id=call_id,
            type="function",
            function=_FunctionDelta(name=name, arguments=""),
        )
        return self._chunk(_Delta(tool_calls=[call]))

    def tool_arguments(self, key: int, fragment: str) -> bytes:
        index = self._calls.get(key)
        if index is None or not fragment:
            return b""
        call = _ToolCallDelta(index=index, function=_FunctionDelta(arguments=fragment))
        return self._chunk(_Delta(tool_calls=[call]))

    def stop(self, reason: Stop) -> bytes:
        return self._chunk(_Delta(), FINISH_REASONS[reason])

    def usage(self, usage: TokenUsage) -> None:
        self._usage = usage

    def end(self) -> bytes:
        if not self._include_usage or self._usage is None:
            return _DONE
        chunk = _Chunk(
            id=self._id,
            created=self._created,
            model=self._model,
            choices=[],
            usage=openai_usage(self._usage),
        )
        return b"data: " + _encode(chunk) + b"\n\n" + _DONE

    def fail(self, status: int, message: str) -> bytes:
        kind = _OPENAI_ERROR_TYPES.get(status, "api_error")
        code = "rate_limited" if status == 429 else "provider_error"
        return b"data: " + openai_error(message, kind, code) + b"\n\n"

    def _chunk(self, delta: _Delta, finish_reason: str | None = None) -> bytes:
        chunk = _Chunk(
            id=self._id,
            created=self._created,
            model=self._model,
            choices=[_ChunkChoice(delta=delta, finish_reason=finish_reason)],
            usage=None if self._include_usage else msgspec.UNSET,
        )
        return b"data: " + _encode(chunk) + b"\n\n"


class _StartedMessage(msgspec.Struct, kw_only=True):
    id: str
    type: str = "message"
    role: str = "assistant"
    model: str
    content: list[_BlockOut] = []
    stop_reason: None = None
    stop_sequence: None = None
    usage: AnthropicUsageOut


class _MessageStart(msgspec.Struct, tag_field="type", tag="message_start"):
    message: _StartedMessage


class _ToolUseStart(msgspec.Struct, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: dict[str, str] = {}


class _BlockStart(msgspec.Struct, tag_field="type", tag="content_block_start"):
    index: int
    content_block: _TextOut | _ThinkingOut | _RedactedOut | _ToolUseStart


class _TextDelta(msgspec.Struct, tag_field="type", tag="text_delta"):
    text: str


class _ThinkingDelta(msgspec.Struct, tag_field="type", tag="thinking_delta"):
    thinking: str


class _SignatureDelta(msgspec.Struct, tag_field="type", tag="signature_delta"):
    signature: str


class _InputJsonDelta(msgspec.Struct, tag_field="type", tag="input_json_delta"):
    partial_json: str


class _BlockDelta(msgspec.Struct, tag_field="type", tag="content_block_delta"):
    index: int
    delta: _TextDelta | _ThinkingDelta | _SignatureDelta | _InputJsonDelta


class _BlockStop(msgspec.Struct, tag_field="type", tag="content_block_stop"):
    index: int


class _StopOut(msgspec.Struct):
    stop_reason: str
    stop_sequence: None = None


class _MessageDelta(msgspec.Struct, tag_field="type", tag="message_delta"):
    delta: _StopOut
    usage: AnthropicUsageOut


class _MessageStop(msgspec.Struct, tag_field="type", tag="message_stop"):
    pass


_NO_USAGE = AnthropicUsageOut(
    input_tokens=0, output_tokens=0, cache_creation_input_tokens=0, cache_read_input_tokens=0
)
_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    403: "permission_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def _sse(name: bytes, event: msgspec.Struct) -> bytes:
    return b"event: " + name + b"\ndata: " + _encode(event) + b"\n\n"


class AnthropicEvents:
    """Anthropic's stream events: each piece in a content block of its kind, a block stopped
    before the next starts; `message_delta` (the stop reason, the whole usage) is held until
    the provider's stream ended, since the usage comes last."""

    def __init__(self) -> None:
        self._open = -1
        self._open_kind = ""
        self._blocks = 0
        self._tools: dict[int, int] = {}
        self._stop = Stop.END
        self._usage: TokenUsage | None = None
        self._id = ""
        self._model = ""

    def begin(self, answer_id: str, model: str) -> bytes:
        self._id, self._model = answer_id, model
        message = _StartedMessage(id=answer_id, model=model, usage=_NO_USAGE)
        return _sse(b"message_start", _MessageStart(message))

    def text(self, text: str) -> bytes:
        if not text:
            return b""
        out = self._open_as("text", _TextOut(""))
        return out + _sse(b"content_block_delta", _BlockDelta(self._open, _TextDelta(text)))

    def thinking(self, text: str) -> bytes:
        if not text:
            return b""
        out = self._open_as("thinking", _ThinkingOut("", ""))
        return out + _sse(b"content_block_delta", _BlockDelta(self._open, _ThinkingDelta(text)))

    def signature(self, signature: str) -> bytes:
        if not signature:
            return b""
        out = self._open_as("thinking", _ThinkingOut("", ""))
        delta = _BlockDelta(self._open, _SignatureDelta(signature))
        return out + _sse(b"content_block_delta", delta) + self._close()

    def redacted_thinking(self, data: str) -> bytes:
        return self._close() + self._begin("redacted", _RedactedOut(data)) + self._close()

    def tool_call(self, key: int, call_id: str, name: str) -> bytes:
        out = self._close() + self._begin("tool", _ToolUseStart(call_id, name))
        self._tools[key] = self._open
        return out

    def tool_arguments(self, key: int, fragment: str) -> bytes:
        block = self._tools.get(key)
        if block is None or not fragment:
            return b""
        return _sse(b"content_block_delta", _BlockDelta(block, _InputJsonDelta(fragment)))

    def stop(self, reason: Stop) -> bytes:
        self._stop = reason
        return self._close()

    def usage(self, usage: TokenUsage) -> None:
        self._usage = usage

    def end(self) -> bytes:
        delta = _MessageDelta(
            _StopOut(STOP_REASONS[self._stop]), anthropic_usage(self._usage or TokenUsage())
        )
        return self._close() + _sse(b"message_delta", delta) + _sse(b"message_stop", _MessageStop())

    def fail(self, status: int, message: str) -> bytes:
        kind = _ANTHROPIC_ERROR_TYPES.get(status, "api_error")
        return _sse(b"error", _AnthropicError(_AnthropicErrorDetail(kind, message)))

    def _open_as(self, kind: str, block: _TextOut | _ThinkingOut) -> bytes:
        if self._open >= 0 and self._open_kind == kind:
            return b""
        return self._close() + self._begin(kind, block)

    def _begin(
        self, kind: str, block: _TextOut | _ThinkingOut | _RedactedOut | _ToolUseStart
    ) -> bytes:
        self._open, self._open_kind = self._blocks, kind
        self._blocks += 1
        return _sse(b"content_block_start", _BlockStart(self._open, block))

    def _close(self) -> bytes:
        if self._open < 0:
            return b""
        index, self._open, self._open_kind = self._open, -1, ""
        return _sse(b"content_block_stop", _BlockStop(index))

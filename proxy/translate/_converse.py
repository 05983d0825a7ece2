"""Bedrock's Converse API on the way back: answers, errors and event streams, read.

A ConverseStream answer is `application/vnd.amazon.eventstream`: binary frames, each with a
prelude, headers, a JSON payload and CRC32 checksums. botocore's `EventStreamBuffer` decodes
them incrementally (bytes cut anywhere go in, whole frames come out, checksums checked), which
is what a stream pump that gets arbitrary chunks needs.
"""

from __future__ import annotations

from typing import Any

import msgspec
from botocore.eventstream import EventStreamBuffer, ParserError

from proxy.translate._answers import (
    Answer,
    Block,
    RedactedThinking,
    Stop,
    StreamWriter,
    Text,
    Thinking,
    ToolCall,
)
from proxy.translate._common import provider_error
from proxy.usage import MalformedAnswer, TokenUsage

BEDROCK = "Bedrock's Converse API"

STOPS = {
    "end_turn": Stop.END,
    "stop_sequence": Stop.STOP_SEQUENCE,
    "max_tokens": Stop.MAX_TOKENS,
    "model_context_window_exceeded": Stop.CONTEXT_WINDOW,
    "tool_use": Stop.TOOL_USE,
    "guardrail_intervened": Stop.FILTERED,
    "content_filtered": Stop.FILTERED,
}
"""Converse's `stopReason`; anything else (`malformed_model_output`, a reason added later)
counts as an end."""

EXCEPTION_STATUS = {
    "throttlingException": 429,
    "serviceUnavailableException": 503,
    "internalServerException": 500,
    "modelStreamErrorException": 502,
    "validationException": 400,
}
"""The HTTP status each exception of a ConverseStream stands for."""

_NULL = msgspec.Raw(b"null")
_EMPTY_OBJECT = b"{}"


# The structs below name their fields as Bedrock does (camelCase): msgspec decodes by name.


class Usage(msgspec.Struct):
    inputTokens: int = 0
    outputTokens: int = 0
    cacheReadInputTokens: int = 0
    cacheWriteInputTokens: int = 0


def token_usage(usage: Usage) -> TokenUsage:
    """Converse counts cached input apart from `inputTokens`, as Anthropic does; reasoning is
    inside `outputTokens` and not told apart."""
    read, write = usage.cacheReadInputTokens, usage.cacheWriteInputTokens
    return TokenUsage(
        input_tokens=usage.inputTokens + read + write,
        output_tokens=usage.outputTokens,
        cache_read_tokens=read,
        cache_write_tokens=write,
    )


# -- a plain answer ------------------------------------------------------------------------------


class _ToolUse(msgspec.Struct):
    toolUseId: str = ""
    name: str = ""
    input: msgspec.Raw = _NULL


class _ReasoningText(msgspec.Struct):
    text: str = ""
    signature: str = ""


class _Reasoning(msgspec.Struct):
    reasoningText: _ReasoningText | None = None
    redactedContent: str | None = None


class _Content(msgspec.Struct):
    text: str | None = None
    toolUse: _ToolUse | None = None
    reasoningContent: _Reasoning | None = None


class _Message(msgspec.Struct):
    content: list[_Content] = []


class _Output(msgspec.Struct):
    message: _Message | None = None


class _Response(msgspec.Struct):
    output: _Output | None = None
    stopReason: str = ""
    usage: Usage | None = None


class _UsageOnly(msgspec.Struct):
    usage: Usage | None = None


_response = msgspec.json.Decoder(_Response)
_usage_only = msgspec.json.Decoder(_UsageOnly)


def usage_of(data: bytes) -> tuple[TokenUsage | None, str | None]:
    """A Converse answer's usage for the spend record (it names no model: the caller's is the
    one served); `MalformedAnswer` when the body is not JSON."""
    try:
        answer = _usage_only.decode(data)
    except (msgspec.ValidationError, RecursionError):
        return None, None
    except msgspec.DecodeError:
        raise MalformedAnswer from None
    return (token_usage(answer.usage) if answer.usage else None), None


def _arguments(raw: msgspec.Raw) -> str:
    text = bytes(raw)
    return "{}" if text in (b"null", b"") else text.decode()


def _block(content: _Content) -> Block | None:
    if content.text is not None:
        return Text(content.text)
    if content.toolUse is not None:
        tool = content.toolUse
        return ToolCall(tool.toolUseId, tool.name, _arguments(tool.input))
    reasoning = content.reasoningContent
    if reasoning is not None:
        if reasoning.reasoningText is not None:
            return Thinking(reasoning.reasoningText.text, reasoning.reasoningText.signature)
        if reasoning.redactedContent is not None:
            return RedactedThinking(reasoning.redactedContent)
    return None  # citations, images, guard content: nothing either client format can hold


def answer(data: bytes, answer_id: str, model: str) -> Answer:
    try:
        response = _response.decode(data)
    except msgspec.DecodeError:
        raise provider_error("a Converse answer was expected") from None
    message = response.output.message if response.output is not None else None
    blocks = [b for c in (message.content if message else ()) if (b := _block(c)) is not None]
    return Answer(
        id=answer_id,
        model=model,
        blocks=blocks,
        stop=STOPS.get(response.stopReason, Stop.END),
        usage=token_usage(response.usage) if response.usage is not None else None,
    )


class _Error(msgspec.Struct):
    message: str | None = None
    Message: str | None = None


_error = msgspec.json.Decoder(_Error)


def error_message(status: int, data: bytes) -> str:
    """The message of a Bedrock error body (`message`, or `Message` from some of its
    services), or one that names the status."""
    try:
        error = _error.decode(data)
    except msgspec.DecodeError:
        error = _Error()
    return error.message or error.Message or f"the provider answered with HTTP status {status}"


# -- a stream ------------------------------------------------------------------------------------


class _DeltaTool(msgspec.Struct):
    input: str = ""


class _DeltaReasoning(msgspec.Struct):
    text: str | None = None
    signature: str | None = None
    redactedContent: str | None = None


class _Delta(msgspec.Struct):
    text: str | None = None
    toolUse: _DeltaTool | None = None
    reasoningContent: _DeltaReasoning | None = None


class _StartTool(msgspec.Struct):
    toolUseId: str = ""
    name: str = ""


class _Start(msgspec.Struct):
    toolUse: _StartTool | None = None


class _Event(msgspec.Struct):
    """Any event's payload: each type fills the fields it has."""

    contentBlockIndex: int = 0
    start: _Start | None = None
    delta: _Delta | None = None
    stopReason: str | None = None
    usage: Usage | None = None
    message: str | None = None
    Message: str | None = None


_event = msgspec.json.Decoder(_Event)


class Opening(msgspec.Struct, frozen=True):
    """What a ConverseStream's first frame says, once it is whole."""

    status: int
    """200 for an event; for an exception, the HTTP status it stands for."""
    message: str = ""


def opening(data: bytes) -> Opening | None:
    """The first frame of a stream's opening bytes, read; None while it is not whole yet."""
    buffer = EventStreamBuffer()
    buffer.add_data(data)
    try:
        frame = next(buffer, None)
    except ParserError:
        return Opening(502, "the provider's stream could not be read")
    if frame is None:
        return None
    headers = frame.headers
    kind = headers.get(":message-type")
    if kind == "exception":
        name = str(headers.get(":exception-type", ""))
        return Opening(EXCEPTION_STATUS.get(name, 502), _frame_message(frame.payload))
    if kind == "error":
        return Opening(502, str(headers.get(":error-message", "the provider's stream failed")))
    return Opening(200)


def _frame_message(payload: bytes) -> str:
    try:
        event = _event.decode(payload)
    except msgspec.DecodeError:
        event = _Event()
    return event.message or event.Message or "the provider's stream failed"


class StreamReader:
    """ConverseStream frames, cut anywhere, written by `writer` in the client's format.

    `usage` and `model` are what the spend record needs; `errored` tells that the stream
    reported an exception, broke a checksum, or ended before its answer did.
    """

    def __init__(self, writer: StreamWriter, answer_id: str, model: str) -> None:
        self._writer = writer
        self._buffer = EventStreamBuffer()
        self._id = answer_id
        self._begun = False
        self._stopped = False
        self._ended = False
        self.usage: TokenUsage | None = None
        self.model: str | None = model
        self.errored = False

    @property
    def sequence(self) -> int:
        """The number of the writer's next event, when the client's format numbers them (a
        Responses stream's error event after a cut follows on)."""
        sequence = getattr(self._writer, "sequence", 0)
        return sequence if isinstance(sequence, int) else 0

    def feed(self, data: bytes) -> bytes:
        if self._ended:
            return b""
        self._buffer.add_data(data)
        out: list[bytes] = []
        try:
            for frame in self._buffer:
                out.append(self._frame(frame.headers, frame.payload))
                if self._ended:
                    break
        except ParserError:
            # A checksum that does not match, a frame too long: nothing after it can be trusted.
            out.append(self._fail(502, "the provider's stream was corrupt"))
        return b"".join(out)

    def finish(self) -> bytes:
        if self._ended:
            return b""
        if self._stopped:
            self._ended = True
            return self._begin() + self._writer.end()
        return self._fail(502, "the provider's stream ended before its answer")

    def _frame(self, headers: dict[str, Any], payload: bytes) -> bytes:
        kind = headers.get(":message-type")
        if kind == "exception":
            name = str(headers.get(":exception-type", ""))
            return self._fail(EXCEPTION_STATUS.get(name, 502), _frame_message(payload))
        if kind == "error":
            return self._fail(502, str(headers.get(":error-message", "the stream failed")))
        try:
            event = _event.decode(payload)
        except msgspec.DecodeError:
            return self._fail(502, "the provider sent an event that is not JSON")
        name = str(headers.get(":event-type", ""))
        writer = self._writer
        if name == "contentBlockDelta" and event.delta is not None:
            return self._begin() + self._delta(event.contentBlockIndex, event.delta)
        if name == "contentBlockStart" and event.start is not None:
            tool = event.start.toolUse
            if tool is not None:
                key = event.contentBlockIndex
                return self._begin() + writer.tool_call(key, tool.toolUseId, tool.name)
            return b""
        if name == "messageStart":
            return self._begin()
        if name == "messageStop":
            self._stopped = True
            return self._begin() + writer.stop(STOPS.get(event.stopReason or "", Stop.END))
        if name == "metadata" and event.usage is not None:
            self.usage = token_usage(event.usage)
            writer.usage(self.usage)
        return b""  # contentBlockStop, and event types Bedrock may add

    def _delta(self, index: int, delta: _Delta) -> bytes:
        writer = self._writer
        if delta.text is not None:
            return writer.text(delta.text)
        if delta.toolUse is not None:
            return writer.tool_arguments(index, delta.toolUse.input)
        reasoning = delta.reasoningContent
        if reasoning is None:
            return b""
        if reasoning.text is not None:
            return writer.thinking(reasoning.text)
        if reasoning.signature is not None:
            return writer.signature(reasoning.signature)
        if reasoning.redactedContent is not None:
            return writer.redacted_thinking(reasoning.redactedContent)
        return b""

    def _begin(self) -> bytes:
        if self._begun:
            return b""
        self._begun = True
        return self._writer.begin(self._id, self.model or "")

    def _fail(self, status: int, message: str) -> bytes:
        self.errored = self._ended = True
        return self._writer.fail(status, message)

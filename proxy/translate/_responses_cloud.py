"""Bedrock's and Google's answers, read into the neutral shape of `_answers`, as a Responses
client gets them: a response object, or its typed events.

One `ResponsesEvents` writes both, so a stream's `response.completed` and a plain answer of the
same provider reply are the same object. Text is a message item, each tool call a
`function_call` item, thinking a reasoning item whose summary is the thinking text and whose
`encrypted_content` is its signature (or the redacted thinking, marked), so the item can be sent
back; each item is done when the next begins. A stop for the token limit or the context window
makes the response `incomplete` (`max_output_tokens`), a safety filter's too (`content_filter`).
"""

from __future__ import annotations

from proxy.errors import ProxyError
from proxy.translate._answers import (
    Answer,
    RedactedThinking,
    Stop,
    Text,
    Thinking,
    ToolCall,
)
from proxy.translate._responses_answer import Frame, ResponseBuilder, encode
from proxy.usage import TokenUsage
from vkgate.errors import ErrorCode

_INCOMPLETE = {
    Stop.MAX_TOKENS: "max_output_tokens",
    Stop.CONTEXT_WINDOW: "max_output_tokens",
    Stop.FILTERED: "content_filter",
}
_FAILURES = {400: ErrorCode.INVALID_REQUEST, 429: ErrorCode.PROVIDER_RATE_LIMITED}


class ResponsesEvents:
    """A `StreamWriter` (see `_answers`) writing the Responses API's typed events."""

    __slots__ = ("_builder", "_count", "_kind", "_open", "_stop", "_usage")

    def __init__(self, frame: Frame, *, events: bool = True) -> None:
        self._builder = ResponseBuilder(frame, events=events)
        self._open: object = None
        """The key of the item being written (text or thinking), None between items."""
        self._kind = ""
        self._count = 0
        self._stop = Stop.END
        self._usage: TokenUsage | None = None

    @property
    def sequence(self) -> int:
        """The number the next event gets: an error event after a cut stream follows on."""
        return self._builder.sequence

    @property
    def final(self) -> bytes:
        return encode(self._builder.final)

    def begin(self, answer_id: str, model: str) -> bytes:
        return self._builder.start(answer_id, model)

    def text(self, text: str) -> bytes:
        if not text:
            return b""
        out = self._open_as("text")
        return out + self._builder.text(self._open, text)

    def thinking(self, text: str) -> bytes:
        out = self._open_as("thinking")
        return out + self._builder.thought(self._open, text)

    def signature(self, signature: str) -> bytes:
        # A signature ends its thinking block (Converse sends it last).
        out = self._open_as("thinking")
        self._builder.signature(self._open, signature)
        return out + self._close()

    def redacted_thinking(self, data: str) -> bytes:
        out = self._close()
        key = self._next("redacted")
        return out + self._builder.reasoning(key, redacted=data) + self._builder.close(key)

    def tool_call(self, key: int, call_id: str, name: str) -> bytes:
        out = self._close()
        self._open, self._kind = ("call", key), "call"
        return out + self._builder.call(self._open, call_id, name)

    def tool_arguments(self, key: int, fragment: str) -> bytes:
        return self._builder.arguments(("call", key), fragment)

    def stop(self, reason: Stop) -> bytes:
        self._stop = reason
        return b""

    def usage(self, usage: TokenUsage) -> None:
        self._usage = usage

    def end(self) -> bytes:
        return self._builder.finish(self._usage, _INCOMPLETE.get(self._stop))

    def fail(self, status: int, message: str) -> bytes:
        code = _FAILURES.get(status, ErrorCode.PROVIDER_ERROR)
        return self._builder.fail(ProxyError(code, message))

    def _next(self, kind: str) -> object:
        self._count += 1
        return (kind, self._count)

    def _open_as(self, kind: str) -> bytes:
        if self._open is not None and self._kind == kind:
            return b""
        out = self._close()
        self._open, self._kind = self._next(kind), kind
        if kind == "thinking":
            out += self._builder.reasoning(self._open)
        return out

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        key, self._open, self._kind = self._open, None, ""
        return self._builder.close(key)


def response(answer: Answer, frame: Frame) -> bytes:
    """A whole answer as a response object."""
    events = ResponsesEvents(frame, events=False)
    events.begin(answer.id, answer.model)
    for index, block in enumerate(answer.blocks):
        if isinstance(block, Text):
            events.text(block.text)
        elif isinstance(block, ToolCall):
            events.tool_call(index, block.id, block.name)
            events.tool_arguments(index, block.arguments)
        elif isinstance(block, Thinking):
            events.thinking(block.text)
            if block.signature:
                events.signature(block.signature)
        elif isinstance(block, RedactedThinking):
            events.redacted_thinking(block.data)
    events.stop(answer.stop)
    if answer.usage is not None:
        events.usage(answer.usage)
    events.end()
    return events.final

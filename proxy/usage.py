"""Token usage as the spend record counts it, whatever format the provider reported it in.

OpenAI's convention throughout: `input_tokens` counts every input token, cache reads and writes
included (Anthropic reports those apart, so they are added in); `reasoning_tokens` are part of
`output_tokens`.

The readers here decode only the usage and model of an answer (small msgspec Structs: every
other field is skipped, never built), and never raise on a malformed body: accounting reports
"no usage" and the answer still reaches the client.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec


@dataclass(slots=True)
class TokenUsage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0


# -- OpenAI -----------------------------------------------------------------------------------


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None
    """Reported by some OpenAI-format providers; part of `prompt_tokens` like cached tokens."""


class CompletionTokensDetails(msgspec.Struct):
    reasoning_tokens: int | None = None


class OpenAIUsage(msgspec.Struct):
    """The `usage` object of a chat completion, its usage-only stream chunk, or an embedding."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None


def from_openai(usage: OpenAIUsage) -> TokenUsage:
    prompt = usage.prompt_tokens_details
    completion = usage.completion_tokens_details
    return TokenUsage(
        input_tokens=usage.prompt_tokens,
        output_tokens=usage.completion_tokens,
        cache_read_tokens=(prompt.cached_tokens or 0) if prompt else 0,
        cache_write_tokens=(prompt.cache_write_tokens or 0) if prompt else 0,
        reasoning_tokens=(completion.reasoning_tokens or 0) if completion else 0,
    )


class _OpenAIAnswer(msgspec.Struct):
    model: str | None = None
    usage: OpenAIUsage | None = None


_openai_answer = msgspec.json.Decoder(_OpenAIAnswer)


class MalformedAnswer(Exception):
    """A provider's 2xx answer that is not JSON at all (an HTML error page, a body cut short):
    no answer to pass on, but the provider failing."""


def openai_answer(data: bytes) -> tuple[TokenUsage | None, str | None]:
    """Usage and served model of an OpenAI chat completion or embeddings answer body;
    `MalformedAnswer` when the body is not JSON."""
    try:
        answer = _openai_answer.decode(data)
    except (msgspec.ValidationError, RecursionError):
        return None, None  # JSON, shaped otherwise than expected: its usage is estimated
    except msgspec.DecodeError:
        raise MalformedAnswer from None
    return (from_openai(answer.usage) if answer.usage else None), answer.model


# -- OpenAI's Responses API --------------------------------------------------------------------


class ResponsesInputDetails(msgspec.Struct):
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None


class ResponsesOutputDetails(msgspec.Struct):
    reasoning_tokens: int | None = None


class ResponsesUsage(msgspec.Struct):
    """A response's `usage`: input counts cached tokens in, output counts reasoning in."""

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    input_tokens_details: ResponsesInputDetails | None = None
    output_tokens_details: ResponsesOutputDetails | None = None


def from_responses(usage: ResponsesUsage) -> TokenUsage:
    given = usage.input_tokens_details
    made = usage.output_tokens_details
    return TokenUsage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_read_tokens=(given.cached_tokens or 0) if given else 0,
        cache_write_tokens=(given.cache_write_tokens or 0) if given else 0,
        reasoning_tokens=(made.reasoning_tokens or 0) if made else 0,
    )


class ResponseFacts(msgspec.Struct):
    """What the gateway reads of a response object: its id (to seal), model and usage."""

    id: str | None = None
    model: str | None = None
    usage: ResponsesUsage | None = None


_response_facts = msgspec.json.Decoder(ResponseFacts)


def response_facts(data: bytes) -> ResponseFacts:
    """A response object's id, model and usage; empty for JSON of another shape, and
    `MalformedAnswer` when the body is not JSON."""
    try:
        return _response_facts.decode(data)
    except (msgspec.ValidationError, RecursionError):
        return ResponseFacts()
    except msgspec.DecodeError:
        raise MalformedAnswer from None


def responses_answer(data: bytes) -> tuple[TokenUsage | None, str | None]:
    """Usage and served model of a response object; `MalformedAnswer` when it is not JSON."""
    facts = response_facts(data)
    return (from_responses(facts.usage) if facts.usage else None), facts.model


# -- Anthropic --------------------------------------------------------------------------------


class OutputTokensDetails(msgspec.Struct):
    thinking_tokens: int | None = None


class AnthropicUsage(msgspec.Struct):
    """A message's `usage`, or a `message_delta`'s (where every count is cumulative).

    None means "not reported here": a `message_delta` may leave the input counts out.
    """

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    output_tokens_details: OutputTokensDetails | None = None


def from_anthropic(usage: AnthropicUsage) -> TokenUsage:
    cache_read = usage.cache_read_input_tokens or 0
    cache_write = usage.cache_creation_input_tokens or 0
    details = usage.output_tokens_details
    return TokenUsage(
        input_tokens=(usage.input_tokens or 0) + cache_read + cache_write,
        output_tokens=usage.output_tokens or 0,
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
        reasoning_tokens=(details.thinking_tokens or 0) if details else 0,
    )


def updated(usage: AnthropicUsage | None, delta: AnthropicUsage) -> AnthropicUsage:
    """`usage` with every count `delta` reports replaced: stream counts are cumulative."""
    if usage is None:
        return delta
    return AnthropicUsage(
        input_tokens=_latest(delta.input_tokens, usage.input_tokens),
        output_tokens=_latest(delta.output_tokens, usage.output_tokens),
        cache_creation_input_tokens=_latest(
            delta.cache_creation_input_tokens, usage.cache_creation_input_tokens
        ),
        cache_read_input_tokens=_latest(
            delta.cache_read_input_tokens, usage.cache_read_input_tokens
        ),
        output_tokens_details=delta.output_tokens_details or usage.output_tokens_details,
    )


def _latest(new: int | None, old: int | None) -> int | None:
    return old if new is None else new


class _AnthropicAnswer(msgspec.Struct):
    model: str | None = None
    usage: AnthropicUsage | None = None


_anthropic_answer = msgspec.json.Decoder(_AnthropicAnswer)


def anthropic_answer(data: bytes) -> tuple[TokenUsage | None, str | None]:
    """Usage and served model of an Anthropic message body; `MalformedAnswer` when the body is
    not JSON."""
    try:
        answer = _anthropic_answer.decode(data)
    except (msgspec.ValidationError, RecursionError):
        return None, None  # JSON, shaped otherwise than expected: its usage is estimated
    except msgspec.DecodeError:
        raise MalformedAnswer from None
    return (from_anthropic(answer.usage) if answer.usage else None), answer.model


class _StartMessage(msgspec.Struct):
    model: str | None = None
    usage: AnthropicUsage | None = None


class _UsageEvent(msgspec.Struct):
    """`message_start` and `message_delta` events: nothing else of an event is decoded."""

    type: str = ""
    message: _StartMessage | None = None
    usage: AnthropicUsage | None = None


_usage_event = msgspec.json.Decoder(_UsageEvent)
_MESSAGE_START = b"message_start"
_MESSAGE_DELTA = b"message_delta"


class AnthropicStreamUsage:
    """Watches an Anthropic stream passing through for its usage and served model.

    On the hot path of every streamed Anthropic-to-Anthropic request: a chunk costs a search
    for the last event terminator and two substring checks; events are split and decoded only
    in a stretch of complete events that mentions `message_start` or `message_delta`.
    """

    __slots__ = ("_reported", "_tail", "model", "usage")

    def __init__(self) -> None:
        self._tail = b""
        self._reported: AnthropicUsage | None = None
        self.usage: TokenUsage | None = None
        self.model: str | None = None

    def feed(self, chunk: bytes) -> None:
        buffer = self._tail + chunk if self._tail else chunk
        end = events_end(buffer)
        if end <= 0:
            self._tail = buffer
            return
        self._tail = buffer[end:]
        if buffer.find(_MESSAGE_START, 0, end) >= 0 or buffer.find(_MESSAGE_DELTA, 0, end) >= 0:
            self._read(buffer[:end])

    def _read(self, complete: bytes) -> None:
        if b"\r" in complete:
            complete = complete.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        for event in complete.split(b"\n\n"):
            if _MESSAGE_START not in event and _MESSAGE_DELTA not in event:
                continue
            data = b"\n".join(
                line[5:].removeprefix(b" ")
                for line in event.split(b"\n")
                if line.startswith(b"data:")
            )
            try:
                decoded = _usage_event.decode(data)
            except msgspec.DecodeError:
                continue
            if decoded.type == "message_start" and decoded.message is not None:
                self.model = decoded.message.model or self.model
                if decoded.message.usage is not None:
                    self._report(decoded.message.usage)
            elif decoded.type == "message_delta" and decoded.usage is not None:
                self._report(decoded.usage)

    def _report(self, usage: AnthropicUsage) -> None:
        self._reported = updated(self._reported, usage)
        self.usage = from_anthropic(self._reported)


def events_end(buffer: bytes) -> int:
    """Where the last complete event of `buffer` ends (0 when none does)."""
    lf = buffer.rfind(b"\n\n")
    end = lf + 2 if lf >= 0 else 0
    if b"\r" in buffer:
        crlf = buffer.rfind(b"\r\n\r\n")
        cr = buffer.rfind(b"\r\r")
        end = max(end, crlf + 4 if crlf >= 0 else 0, cr + 2 if cr >= 0 else 0)
    return end

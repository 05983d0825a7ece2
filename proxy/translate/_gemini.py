"""Google's Gemini API on the way back: answers, errors and SSE streams, read; and what both
request translators to it share.

Tool call ids: Gemini 3 models sign a turn's function calls (`thoughtSignature`) and refuse the
next request of the conversation if the signature does not come back with the call. OpenAI and
Anthropic clients keep nothing of a tool call but its id, name and arguments, so the signature
travels in the id: `<id>__thought__<signature>`, the signature in base64's URL-safe alphabet
without padding (so the id stays within the letters, digits, `_` and `-` every format takes).
A request's tool call whose id carries one gives it back to Gemini, byte for byte.
"""

from __future__ import annotations

import os

import msgspec

from proxy.errors import ProxyError
from proxy.sse import Event, EventReader
from proxy.translate._answers import (
    Answer,
    Block,
    Stop,
    StreamWriter,
    Text,
    Thinking,
    ToolCall,
)
from proxy.translate._common import provider_error
from proxy.usage import MalformedAnswer, TokenUsage
from vkgate.errors import ErrorCode

GEMINI = "Google's Gemini API"

_FILTERED = frozenset(
    {
        "SAFETY",
        "RECITATION",
        "BLOCKLIST",
        "PROHIBITED_CONTENT",
        "SPII",
        "IMAGE_SAFETY",
        "IMAGE_PROHIBITED_CONTENT",
        "IMAGE_RECITATION",
    }
)
_SIGNED = "__thought__"
_TO_URLSAFE = str.maketrans("+/", "-_")
_FROM_URLSAFE = str.maketrans("-_", "+/")
_NULL = msgspec.Raw(b"null")


def stop_of(finish_reason: str | None, called: bool) -> Stop:
    """Gemini's `finishReason` (one stop covers stop sequences too); a safety filter's
    stop is `FILTERED`; a finished turn that called tools, `TOOL_USE`."""
    if finish_reason == "MAX_TOKENS":
        return Stop.MAX_TOKENS
    if finish_reason in _FILTERED:
        return Stop.FILTERED
    return Stop.TOOL_USE if called else Stop.END


# -- tool call ids --------------------------------------------------------------------------------


def new_call_id() -> str:
    return "call_" + os.urandom(12).hex()


def call_id(call: str | None, signature: str | None) -> str:
    """The id a client gets for a Gemini function call (see the module's docstring)."""
    base = call or new_call_id()
    if not signature:
        return base
    return base + _SIGNED + signature.translate(_TO_URLSAFE).rstrip("=")


def signature_of(tool_call_id: str) -> str | None:
    """The thought signature a tool call id carries back, if it carries one."""
    _, signed, encoded = tool_call_id.partition(_SIGNED)
    if not signed or not encoded:
        return None
    return encoded.translate(_FROM_URLSAFE) + "=" * (-len(encoded) % 4)


# -- usage --------------------------------------------------------------------------------------
# The structs below name their fields as Google does (camelCase): msgspec decodes by name.


class UsageMetadata(msgspec.Struct):
    promptTokenCount: int = 0
    candidatesTokenCount: int = 0
    cachedContentTokenCount: int = 0
    thoughtsTokenCount: int = 0
    toolUsePromptTokenCount: int = 0


def token_usage(usage: UsageMetadata) -> TokenUsage:
    """Gemini counts cached input inside `promptTokenCount` (as OpenAI does) and the thoughts
    apart from `candidatesTokenCount`; a tool's prompt (a search's results) is input."""
    thoughts = usage.thoughtsTokenCount
    return TokenUsage(
        input_tokens=usage.promptTokenCount + usage.toolUsePromptTokenCount,
        output_tokens=usage.candidatesTokenCount + thoughts,
        cache_read_tokens=usage.cachedContentTokenCount,
        reasoning_tokens=thoughts,
    )


class _UsageOnly(msgspec.Struct):
    usageMetadata: UsageMetadata | None = None
    modelVersion: str | None = None
    totalTokens: int | None = None
    """`countTokens` answers this, and nothing is spent."""


_usage_only = msgspec.json.Decoder(_UsageOnly)


def usage_of(data: bytes) -> tuple[TokenUsage | None, str | None]:
    """A Gemini answer's usage and served model, for the spend record; a `countTokens` answer
    spends nothing. `MalformedAnswer` when the body is not JSON."""
    try:
        answer = _usage_only.decode(data)
    except (msgspec.ValidationError, RecursionError):
        return None, None
    except msgspec.DecodeError:
        raise MalformedAnswer from None
    if answer.usageMetadata is not None:
        return token_usage(answer.usageMetadata), answer.modelVersion
    if answer.totalTokens is not None:
        return TokenUsage(), None
    return None, answer.modelVersion


# -- a plain answer -------------------------------------------------------------------------------


class _FunctionCall(msgspec.Struct):
    name: str = ""
    args: msgspec.Raw = _NULL
    id: str | None = None


class _Part(msgspec.Struct):
    text: str | None = None
    thought: bool | None = None
    thoughtSignature: str | None = None
    functionCall: _FunctionCall | None = None


class _Content(msgspec.Struct):
    parts: list[_Part] = []


class _Candidate(msgspec.Struct):
    content: _Content | None = None
    finishReason: str | None = None
    index: int = 0


class _PromptFeedback(msgspec.Struct):
    blockReason: str | None = None
    blockReasonMessage: str | None = None


class _ErrorDetail(msgspec.Struct):
    code: int = 0
    message: str = ""
    status: str = ""


class _Response(msgspec.Struct):
    candidates: list[_Candidate] = []
    promptFeedback: _PromptFeedback | None = None
    usageMetadata: UsageMetadata | None = None
    modelVersion: str = ""
    responseId: str = ""
    error: _ErrorDetail | None = None


_response = msgspec.json.Decoder(_Response)


def _arguments(raw: msgspec.Raw) -> str:
    text = bytes(raw)
    return "{}" if text in (b"null", b"") else text.decode()


def blocked(feedback: _PromptFeedback) -> ProxyError:
    """A prompt Gemini's safety filters refused to answer: the client's to change."""
    reason = feedback.blockReason or "OTHER"
    detail = f": {feedback.blockReasonMessage}" if feedback.blockReasonMessage else ""
    return ProxyError(
        ErrorCode.INVALID_REQUEST,
        f"the provider's safety filters blocked the prompt ({reason}){detail}",
        param="messages",
    )


def _blocks(parts: list[_Part]) -> tuple[list[Block], bool]:
    blocks: list[Block] = []
    called = False
    for part in parts:
        if part.functionCall is not None:
            called = True
            call = part.functionCall
            blocks.append(
                ToolCall(call_id(call.id, part.thoughtSignature), call.name, _arguments(call.args))
            )
        elif part.text is not None:
            if part.thought:
                blocks.append(Thinking(part.text, part.thoughtSignature or ""))
            else:
                blocks.append(Text(part.text))
    return blocks, called


def answer(data: bytes, answer_id: str, model: str, id_prefix: str) -> Answer:
    """A generateContent answer, its first candidate read. Its `responseId` (after
    `id_prefix`) and `modelVersion` are the answer's when it has them."""
    try:
        response = _response.decode(data)
    except msgspec.DecodeError:
        raise provider_error("a Gemini answer was expected") from None
    feedback = response.promptFeedback
    if not response.candidates and feedback is not None and feedback.blockReason:
        raise blocked(feedback)
    candidate = response.candidates[0] if response.candidates else _Candidate()
    blocks, called = _blocks(candidate.content.parts if candidate.content else [])
    usage = response.usageMetadata
    return Answer(
        id=id_prefix + response.responseId if response.responseId else answer_id,
        model=response.modelVersion or model,
        blocks=blocks,
        stop=stop_of(candidate.finishReason, called),
        usage=token_usage(usage) if usage is not None else None,
    )


class _ErrorBody(msgspec.Struct):
    error: _ErrorDetail | None = None


_error = msgspec.json.Decoder(_ErrorBody | list[_ErrorBody])


def error_message(status: int, data: bytes) -> str:
    """The message of a Google error body (`{"error": {"code", "message", "status"}}`, or a
    list of them as some streams send it), or one that names the status."""
    try:
        decoded = _error.decode(data)
    except msgspec.DecodeError:
        decoded = _ErrorBody()
    if isinstance(decoded, list):
        decoded = decoded[0] if decoded else _ErrorBody()
    if decoded.error is not None and decoded.error.message:
        return decoded.error.message
    return f"the provider answered with HTTP status {status}"


# -- a stream ---------------------------------------------------------------------------------------


class StreamReader:
    """`streamGenerateContent?alt=sse` events, cut anywhere, written by `writer` in the client's
    format. Each event is a partial answer: text pieces, whole function calls, and on the last
    the finish reason; the usage of each is cumulative."""

    def __init__(self, writer: StreamWriter, answer_id: str, model: str, id_prefix: str) -> None:
        self._writer = writer
        self._reader = EventReader()
        self._id = answer_id
        self._prefix = id_prefix
        self._begun = False
        self._stop: Stop | None = None
        self._calls = 0
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
        return self._translate(self._reader.feed(data))

    def finish(self) -> bytes:
        out = self._translate(self._reader.flush())
        if self._ended:
            return out
        if self._stop is not None:
            self._ended = True
            return out + self._writer.end()
        return out + self._fail(502, "the provider's stream ended before its answer")

    def _translate(self, events: list[Event]) -> bytes:
        out: list[bytes] = []
        for event in events:
            if self._ended:
                break
            try:
                response = _response.decode(event.data)
            except msgspec.DecodeError:
                out.append(self._fail(502, "the provider sent an event that is not JSON"))
                break
            out.append(self._event(response))
        return b"".join(out)

    def _event(self, response: _Response) -> bytes:
        if response.error is not None:
            return self._fail(response.error.code or 502, response.error.message)
        out = [self._begin(response)]
        if response.usageMetadata is not None:
            self.usage = token_usage(response.usageMetadata)
            self._writer.usage(self.usage)
        feedback = response.promptFeedback
        if not response.candidates and feedback is not None and feedback.blockReason:
            out.append(self._fail(400, blocked(feedback).message))
            return b"".join(out)
        for candidate in response.candidates[:1]:
            if candidate.content is not None:
                for part in candidate.content.parts:
                    out.append(self._part(part))
            if candidate.finishReason is not None and self._stop is None:
                self._stop = stop_of(candidate.finishReason, self._calls > 0)
                out.append(self._writer.stop(self._stop))
        return b"".join(out)

    def _part(self, part: _Part) -> bytes:
        writer = self._writer
        call = part.functionCall
        if call is not None:
            key = self._calls
            self._calls += 1
            started = writer.tool_call(key, call_id(call.id, part.thoughtSignature), call.name)
            return started + writer.tool_arguments(key, _arguments(call.args))
        if part.text is None:
            return b""
        if part.thought:
            return writer.thinking(part.text)
        return writer.text(part.text)

    def _begin(self, response: _Response) -> bytes:
        if self._begun:
            return b""
        self._begun = True
        if response.responseId:
            self._id = self._prefix + response.responseId
        self.model = response.modelVersion or self.model
        return self._writer.begin(self._id, self.model or "")

    def _fail(self, status: int, message: str) -> bytes:
        self.errored = self._ended = True
        return self._writer.fail(status, message)

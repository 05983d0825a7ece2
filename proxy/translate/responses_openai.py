"""A client speaking OpenAI's Responses API, a provider speaking only OpenAI's chat completions
(an OpenAI-compatible server without the Responses API, or the `mock` provider).

Requests: `instructions` and system or developer messages become system messages, in order;
input items become chat messages: a `function_call` joins the assistant message before it (as
one of its `tool_calls`), a `function_call_output` becomes a tool message. Function tools,
`tool_choice`, `parallel_tool_calls`, `text.format` (as `response_format`), `text.verbosity`,
`max_output_tokens`, `reasoning.effort` (as `reasoning_effort`), `temperature`, `top_p`, `user`,
`safety_identifier` and `prompt_cache_key` carry over. Refused with a 400 naming them: built-in
tools, reasoning summaries and reasoning items (chat completions returns neither), files, and
what only a stored response can do (`previous_response_id`, `store: true`, `background`).
`metadata` is not sent on: the response object repeats it, as OpenAI's does.

Answers: the message's text (or refusal) becomes a message item, each tool call a
`function_call` item; `finish_reason` `length` makes the response `incomplete`
(`max_output_tokens`), `content_filter` too (`content_filter`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from proxy.errors import ProxyError
from proxy.sse import EventReader
from proxy.translate._common import provider_error, refused
from proxy.translate._responses_answer import (
    REFUSAL,
    Frame,
    ResponseBuilder,
    encode,
)
from proxy.translate._responses_request import (
    FunctionCall,
    FunctionCallOutput,
    FunctionTool,
    InputImage,
    InputText,
    Message,
    NamedFunction,
    Parsed,
    Reasoning,
    image_url,
    output_text,
)
from proxy.usage import OpenAIUsage, TokenUsage, from_openai
from vkgate.errors import ErrorCode

CHAT = "OpenAI's chat completions API"
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def request(
    parsed: Parsed, model: str, *, max_tokens_field: str = "max_tokens", stream_usage: bool = True
) -> bytes:
    """A Responses request as a chat completions request for `model`."""
    fields = parsed.request
    reasoning = fields.reasoning
    if reasoning is not None:
        for name in ("summary", "generate_summary"):
            if getattr(reasoning, name) is not None:
                raise refused(f"reasoning.{name}", CHAT, ": it returns no reasoning summaries")
    out: dict[str, Any] = {"model": model, "messages": _messages(parsed)}
    if fields.max_output_tokens is not None:
        out[max_tokens_field] = fields.max_output_tokens
    for name in ("temperature", "top_p", "user", "safety_identifier", "prompt_cache_key"):
        value = getattr(fields, name)
        if value is not None:
            out[name] = value
    if reasoning is not None and reasoning.effort is not None:
        out["reasoning_effort"] = reasoning.effort
    text = fields.text
    if text is not None:
        if text.format is not None and text.format.type != "text":
            out["response_format"] = _response_format(text.format)
        if text.verbosity is not None:
            out["verbosity"] = text.verbosity
    if parsed.tools:
        out["tools"] = [_tool(tool) for tool in parsed.tools]
        if fields.parallel_tool_calls is not None:
            out["parallel_tool_calls"] = fields.parallel_tool_calls
    choice = fields.tool_choice
    if isinstance(choice, NamedFunction):
        out["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None:
        out["tool_choice"] = choice
    if fields.stream:
        out["stream"] = True
        if stream_usage:
            out["stream_options"] = {"include_usage": True}
    return encode(out)


def _response_format(format: Any) -> dict[str, Any]:
    if format.type == "json_object":
        return {"type": "json_object"}
    schema: dict[str, Any] = {"name": format.name or "response"}
    if format.description is not None:
        schema["description"] = format.description
    if bytes(format.schema) != b"null":
        schema["schema"] = format.schema
    if format.strict is not None:
        schema["strict"] = format.strict
    return {"type": "json_schema", "json_schema": schema}


def _tool(tool: FunctionTool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    if bytes(tool.parameters) != b"null":
        function["parameters"] = tool.parameters
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def _messages(parsed: Parsed) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if parsed.request.instructions is not None:
        messages.append({"role": "system", "content": parsed.request.instructions})
    for i, item in enumerate(parsed.items):
        at = f"input[{i}]"
        if isinstance(item, Message):
            if item.role == "assistant":
                messages.append(
                    {"role": "assistant", "content": output_text(item.content, at, CHAT)}
                )
            else:
                # `developer` is OpenAI's newer name for `system`; not every server knows it.
                role = "system" if item.role == "developer" else item.role
                messages.append({"role": role, "content": _content(item, at)})
        elif isinstance(item, FunctionCall):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutput):
            messages.append(
                {"role": "tool", "tool_call_id": item.call_id, "content": _output(item, at)}
            )
        elif isinstance(item, Reasoning):
            raise refused(at, CHAT, ": it takes no reasoning items")
    return messages


def _content(message: Message, at: str) -> str | list[dict[str, Any]]:
    if isinstance(message.content, str):
        return message.content
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(message.content):
        here = f"{at}.content[{j}]"
        if isinstance(part, InputImage):
            if message.role != "user":
                raise refused(here, CHAT, f": a {message.role} message holds text only")
            image: dict[str, Any] = {"url": image_url(part, here, CHAT)}
            if part.detail is not None:
                image["detail"] = part.detail
            parts.append({"type": "image_url", "image_url": image})
        elif isinstance(part, InputText):
            parts.append({"type": "text", "text": part.text})
        else:
            raise refused(here, CHAT, f": a {message.role} message holds no {part.__class__}")
    return parts


def _output(item: FunctionCallOutput, at: str) -> str | list[dict[str, Any]]:
    if isinstance(item.output, str):
        return item.output
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(item.output):
        if isinstance(part, InputImage):
            raise refused(f"{at}.output[{j}]", CHAT, ": a tool message holds text only")
        parts.append({"type": "text", "text": part.text})
    return parts


# -- the answer, as chat completions gives it --------------------------------------------------


class _Function(msgspec.Struct):
    name: str = ""
    arguments: str = ""


class _Call(msgspec.Struct):
    index: int = 0
    id: str | None = None
    function: _Function | None = None


class _Message(msgspec.Struct):
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[_Call] | None = None


class _Choice(msgspec.Struct):
    message: _Message | None = None
    delta: _Message | None = None
    finish_reason: str | None = None


class _ErrorDetail(msgspec.Struct):
    message: str = ""
    type: str | None = None
    code: str | int | None = None


class _Completion(msgspec.Struct):
    """A chat completion, or one chunk of a streamed one."""

    id: str = ""
    model: str = ""
    choices: list[_Choice] = []
    usage: OpenAIUsage | None = None
    error: _ErrorDetail | None = None


_completion = msgspec.json.Decoder(_Completion)


def response(data: bytes, frame: Frame) -> bytes:
    """A chat completion as a response object."""
    try:
        completion = _completion.decode(data)
    except msgspec.DecodeError:
        raise provider_error("a chat completion was expected") from None
    builder = ResponseBuilder(frame, events=False)
    builder.start(completion.id, completion.model)
    choice = completion.choices[0] if completion.choices else _Choice()
    message = choice.message or _Message()
    if message.content:
        builder.text("text", message.content)
    if message.refusal:
        builder.text(REFUSAL, message.refusal)
    for index, call in enumerate(message.tool_calls or ()):
        function = call.function or _Function()
        builder.call(("call", index), call.id or "", function.name)
        builder.arguments(("call", index), function.arguments)
    usage = from_openai(completion.usage) if completion.usage else None
    builder.finish(usage, _INCOMPLETE.get(choice.finish_reason or ""))
    return encode(builder.final)


class StreamTranslator:
    """Chat completion chunks, cut anywhere, as a Responses stream's typed events.

    Items are closed when the provider's stream ends (chat completions says where an answer
    ends, not where each of its parts does), then `response.completed` carries the usage of the
    stream's usage chunk. An error chunk, an unreadable one, or a stream that ends before its
    answer did, ends the stream with `response.failed` (an `error` event before the response
    began); `errored` tells.
    """

    def __init__(self, frame: Frame) -> None:
        self._builder = ResponseBuilder(frame)
        self._reader = EventReader()
        self._finish_reason: str | None = None
        self.usage: TokenUsage | None = None
        self.model: str | None = None
        self.errored = False

    @property
    def sequence(self) -> int:
        return self._builder.sequence

    def feed(self, chunk: bytes) -> bytes:
        return self._translate(self._reader.feed(chunk))

    def finish(self) -> bytes:
        out = self._translate(self._reader.flush())
        if self._builder.ended:
            return out
        if self._finish_reason is not None:
            return out + self._end()
        return out + self._fail(
            ProxyError(ErrorCode.PROVIDER_ERROR, "the provider's stream ended before its answer")
        )

    def _translate(self, events: list[Any]) -> bytes:
        out: list[bytes] = []
        for event in events:
            if self._builder.ended:
                break
            if event.data == b"[DONE]":
                out.append(self._end() if self._finish_reason is not None else b"")
                continue
            try:
                chunk = _completion.decode(event.data)
            except msgspec.DecodeError:
                out.append(self._fail(provider_error("a stream chunk was not JSON")))
                break
            out.append(self._chunk(chunk))
        return b"".join(out)

    def _chunk(self, chunk: _Completion) -> bytes:
        builder = self._builder
        if chunk.error is not None:
            message = chunk.error.message or "the provider's stream failed"
            return self._fail(ProxyError(ErrorCode.PROVIDER_ERROR, message))
        out = b""
        if not builder.started:
            self.model = chunk.model or None
            out += builder.start(chunk.id, chunk.model)
        if chunk.usage is not None:
            self.usage = from_openai(chunk.usage)
        for choice in chunk.choices[:1]:
            delta = choice.delta or _Message()
            if delta.content:
                out += builder.text("text", delta.content)
            if delta.refusal:
                out += builder.text(REFUSAL, delta.refusal)
            for call in delta.tool_calls or ():
                key = ("call", call.index)
                function = call.function or _Function()
                if builder.item(key) is None:
                    out += builder.call(key, call.id or "", function.name)
                out += builder.arguments(key, function.arguments)
            if choice.finish_reason is not None:
                self._finish_reason = choice.finish_reason
        return out

    def _end(self) -> bytes:
        return self._builder.finish(self.usage, _INCOMPLETE.get(self._finish_reason or ""))

    def _fail(self, error: ProxyError) -> bytes:
        self.errored = True
        return self._builder.fail(error)

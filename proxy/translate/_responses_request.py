"""The Responses API request as a client sends it, decoded strictly for translation.

A field this module does not know is refused with a 400 naming it, as is a value with no
equivalent in chat completions or Anthropic's Messages API. Labels that earlier output items
carry when a client sends them back as input (`id`, `status`, `phase`, an output text's
`annotations` and `logprobs`) are accepted and not sent on: they describe that earlier output,
not what to generate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from proxy.errors import ProxyError, invalid
from proxy.translate._common import refused, request_fields

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

"""A client speaking Anthropic's Messages API, a provider speaking Bedrock's Converse API.

Requests: a field or block with no Converse equivalent is refused with a 400 naming it, never
dropped; so is anything Anthropic's schema does not have. Decisions where the two APIs differ:

- `system`, text, images (base64), documents (base64 PDF, plain text), tool uses, tool results
  (`is_error` as `status: error`) and thinking blocks (with their signatures; redacted ones
  too) become Converse's blocks of the same meaning. A URL image or document is refused:
  Converse fetches no URL.
- `cache_control` on a block, a system block or a tool becomes a `cachePoint` right after it
  (its `ttl` kept); the request's own `cache_control` (automatic caching) one after the last
  message's content.
- `max_tokens`, `temperature`, `top_p` and `stop_sequences` become `inferenceConfig`; `top_k`
  and `thinking` go in `additionalModelRequestFields`, as Anthropic's models on Bedrock take
  them; `output_config` (effort, a JSON schema format) becomes `outputConfig`.
- `tool_choice` `none` leaves the tools out (Converse cannot forbid calls otherwise); it is
  refused when the conversation holds tool blocks, which Converse takes only with tools.
  `disable_parallel_tool_use: true` is refused: Converse cannot ask for it.
- `metadata.user_id` names the end user to vkgate (budgets, spend) and is not sent: Converse
  has no such field.

Answers: text, tool uses and reasoning come back as text, `tool_use` and thinking (or
redacted thinking) blocks; Converse's stop reasons as Anthropic's, a guardrail's intervention
as `refusal`.
"""

from __future__ import annotations

import base64
from typing import Any

import msgspec

from proxy.errors import invalid
from proxy.translate import _anthropic_request as A
from proxy.translate import _converse
from proxy.translate._answers import AnthropicEvents, anthropic_error, anthropic_message
from proxy.translate._common import anthropic_error_type, refused, request_fields
from proxy.translate._converse import BEDROCK
from proxy.translate.openai_converse import EFFORTS, IMAGE_FORMATS

_encode = msgspec.json.Encoder().encode
_DOCUMENTS = {"application/pdf": "pdf", "text/plain": "txt", "text/csv": "csv", "text/html": "html"}


def request(body: bytes, model: str) -> bytes:
    """An Anthropic Messages request as a Converse request (the model goes in the URL)."""
    fields = request_fields(A.request, body, BEDROCK)
    for name in ("container", "mcp_servers", "context_management"):
        if getattr(fields, name) is not None:
            raise refused(name, BEDROCK)
    if fields.service_tier not in (None, "auto", "standard_only"):
        raise refused("service_tier", BEDROCK, ": only `auto` and `standard_only` can be")
    documents = _Documents()
    messages: list[dict[str, Any]] = []
    for i, message in enumerate(fields.messages):
        at = f"messages[{i}]"
        content = (
            [{"text": message.content}]
            if isinstance(message.content, str)
            else _blocks(message.content, at, documents)
        )
        if messages and messages[-1]["role"] == message.role:
            messages[-1]["content"].extend(content)
        else:
            messages.append({"role": message.role, "content": content})
    if fields.cache_control is not None and messages:
        messages[-1]["content"].append(_cache_point(fields.cache_control))
    out: dict[str, Any] = {"messages": messages}
    if fields.system:
        out["system"] = _system(fields.system)
    inference: dict[str, Any] = {"maxTokens": fields.max_tokens}
    if fields.temperature is not None:
        inference["temperature"] = fields.temperature
    if fields.top_p is not None:
        inference["topP"] = fields.top_p
    if fields.stop_sequences:
        inference["stopSequences"] = fields.stop_sequences
    out["inferenceConfig"] = inference
    if (tools := _tool_config(fields, messages)) is not None:
        out["toolConfig"] = tools
    additional: dict[str, Any] = {}
    if fields.top_k is not None:
        additional["top_k"] = fields.top_k
    if fields.thinking is not None and fields.thinking.type != "disabled":
        additional["thinking"] = msgspec.structs.asdict(fields.thinking)
        additional["thinking"] = {k: v for k, v in additional["thinking"].items() if v is not None}
    if additional:
        out["additionalModelRequestFields"] = additional
    if fields.output_config is not None and (output := _output(fields.output_config)):
        out["outputConfig"] = output
    return _encode(out)


def _cache_point(cache: A.CacheControl) -> dict[str, Any]:
    point: dict[str, Any] = {"type": "default"}
    if cache.ttl is not None:
        point["ttl"] = cache.ttl
    return {"cachePoint": point}


def _system(system: str | list[A.TextBlock]) -> list[dict[str, Any]]:
    if isinstance(system, str):
        return [{"text": system}]
    out: list[dict[str, Any]] = []
    for i, block in enumerate(system):
        if block.citations:
            raise refused(f"system[{i}].citations", BEDROCK)
        out.append({"text": block.text})
        if block.cache_control is not None:
            out.append(_cache_point(block.cache_control))
    return out


class _Documents:
    """Converse wants every document of a request named, each name different, in a narrow
    alphabet (a client's title may not fit it): `document-1`, `document-2`, …"""

    def __init__(self) -> None:
        self.count = 0

    def name(self) -> str:
        self.count += 1
        return f"document-{self.count}"


def _blocks(blocks: list[A.Block], at: str, documents: _Documents) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        here = f"{at}.content[{j}]"
        if isinstance(block, A.TextBlock):
            if block.citations:
                raise refused(f"{here}.citations", BEDROCK)
            out.append({"text": block.text})
        elif isinstance(block, A.ImageBlock):
            out.append(_image(block, here))
        elif isinstance(block, A.DocumentBlock):
            out.append(_document(block, here, documents))
        elif isinstance(block, A.ToolUseBlock):
            if not bytes(block.input).lstrip().startswith(b"{"):
                raise invalid(f"`{here}.input` must be an object", param=f"{here}.input")
            if block.caller is not None and block.caller.type != "direct":
                raise refused(f"{here}.caller", BEDROCK, ": only the model's own calls can be")
            out.append(
                {"toolUse": {"toolUseId": block.id, "name": block.name, "input": block.input}}
            )
        elif isinstance(block, A.ToolResultBlock):
            out.append(_tool_result(block, here, documents))
        elif isinstance(block, A.ThinkingBlock):
            text: dict[str, Any] = {"text": block.thinking}
            if block.signature:
                text["signature"] = block.signature
            out.append({"reasoningContent": {"reasoningText": text}})
        else:
            out.append({"reasoningContent": {"redactedContent": block.data}})
        cache = getattr(block, "cache_control", None)
        if cache is not None:
            out.append(_cache_point(cache))
    return out


def _image(block: A.ImageBlock, at: str) -> dict[str, Any]:
    source = block.source
    if isinstance(source, A.URLSource):
        raise refused(f"{at}.source", BEDROCK, ": it fetches no URL; send the image as base64")
    image_format = IMAGE_FORMATS.get(source.media_type.lower())
    if image_format is None:
        raise invalid(
            f"`{at}.source.media_type` is an image type Bedrock does not take",
            param=f"{at}.source.media_type",
        )
    return {"image": {"format": image_format, "source": {"bytes": source.data}}}


def _document(block: A.DocumentBlock, at: str, documents: _Documents) -> dict[str, Any]:
    source = block.source
    if isinstance(source, A.URLSource):
        raise refused(f"{at}.source", BEDROCK, ": it fetches no URL; send the document as base64")
    if block.citations is not None:
        raise refused(f"{at}.citations", BEDROCK)
    document_format = _DOCUMENTS.get(source.media_type.lower())
    if document_format is None:
        raise invalid(
            f"`{at}.source.media_type` is a document type Bedrock does not take",
            param=f"{at}.source.media_type",
        )
    data = source.data
    if isinstance(source, A.PlainTextSource):
        data = base64.b64encode(source.data.encode()).decode()
    document: dict[str, Any] = {
        "format": document_format,
        "name": documents.name(),
        "source": {"bytes": data},
    }
    if block.context:
        document["context"] = block.context
    return {"document": document}


def _tool_result(block: A.ToolResultBlock, at: str, documents: _Documents) -> dict[str, Any]:
    content: list[dict[str, Any]]
    if block.content is None or isinstance(block.content, str):
        content = [{"text": block.content or ""}]
    else:
        content = []
        for k, part in enumerate(block.content):
            here = f"{at}.content[{k}]"
            if isinstance(part, A.TextBlock):
                content.append({"text": part.text})
            elif isinstance(part, A.ImageBlock):
                content.append(_image(part, here))
            else:
                content.append(_document(part, here, documents))
    result: dict[str, Any] = {"toolUseId": block.tool_use_id, "content": content}
    if block.is_error:
        result["status"] = "error"
    return {"toolResult": result}


def _has_tool_blocks(messages: list[dict[str, Any]]) -> bool:
    return any(
        "toolUse" in block or "toolResult" in block
        for message in messages
        for block in message["content"]
    )


def _tool_config(fields: A.Request, messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    choice = fields.tool_choice
    if choice is not None and getattr(choice, "disable_parallel_tool_use", None):
        raise refused(
            "tool_choice.disable_parallel_tool_use", BEDROCK, ": it cannot forbid parallel calls"
        )
    if not fields.tools:
        return None
    if isinstance(choice, A.ChoiceNone):
        if _has_tool_blocks(messages):
            raise refused(
                "tool_choice",
                BEDROCK,
                ": `none` leaves the tools out, and Converse takes a conversation holding tool "
                "blocks only with its tools",
            )
        return None
    tools: list[dict[str, Any]] = []
    for i, raw in enumerate(fields.tools):
        at = f"tools[{i}]"
        kind = request_fields(A.tool_kind, raw, BEDROCK, at).type
        if kind not in (None, "custom"):
            raise refused(f"{at}.type", BEDROCK, ": only custom tools can be, not Anthropic's own")
        tool = request_fields(A.tool, raw, BEDROCK, at)
        spec: dict[str, Any] = {"name": tool.name}
        if tool.description is not None:
            spec["description"] = tool.description
        spec["inputSchema"] = {"json": tool.input_schema}
        if tool.strict:
            spec["strict"] = True
        tools.append({"toolSpec": spec})
        if tool.cache_control is not None:
            tools.append(_cache_point(tool.cache_control))
    config: dict[str, Any] = {"tools": tools}
    if isinstance(choice, A.ChoiceAuto):
        config["toolChoice"] = {"auto": {}}
    elif isinstance(choice, A.ChoiceAny):
        config["toolChoice"] = {"any": {}}
    elif isinstance(choice, A.ChoiceTool):
        config["toolChoice"] = {"tool": {"name": choice.name}}
    return config


def _output(config: A.OutputConfig) -> dict[str, Any]:
    output: dict[str, Any] = {}
    if config.effort is not None:
        if config.effort not in EFFORTS and config.effort != "max":
            raise refused("output_config.effort", BEDROCK)
        output["effort"] = config.effort
    if config.format is not None:
        schema = _encode(config.format.schema).decode()
        output["textFormat"] = {
            "type": "json_schema",
            "structure": {"jsonSchema": {"schema": schema}},
        }
    return output


# -- answers --------------------------------------------------------------------------------------


def response(data: bytes, answer_id: str, model: str) -> bytes:
    """A Converse answer as an Anthropic message (Converse names no id and no model: `answer_id`
    and the credential's `model` stand in)."""
    return anthropic_message(_converse.answer(data, answer_id, model))


def error(status: int, data: bytes) -> bytes:
    """A Bedrock error body as Anthropic's, keeping Bedrock's message."""
    return anthropic_error(_converse.error_message(status, data), anthropic_error_type(status))


def stream(answer_id: str, model: str) -> _converse.StreamReader:
    """ConverseStream frames as Anthropic's stream events."""
    return _converse.StreamReader(AnthropicEvents(), answer_id, model)

"""A client speaking Anthropic's Messages API, a provider speaking Google's Gemini API.

Requests: a field or block with no Gemini equivalent is refused with a 400 naming it, never
dropped; so is anything Anthropic's schema does not have. Decisions where the two APIs differ:

- `system` becomes `systemInstruction`; assistant turns are the `model` role. Text, images and
  documents (base64 as `inlineData`, a URL as `fileData` typed by its extension, plain text as
  text), tool uses (`functionCall`) and tool results (`functionResponse`, named after the call
  they answer; `is_error` as `{"error": …}`) become Gemini's parts. Thinking blocks go back as
  thought parts with their signatures; redacted thinking, which Gemini never gives, is refused.
- `cache_control` markers are accepted and left out: Gemini caches repeated prompt prefixes by
  itself, and the cached tokens still come back in the usage.
- `max_tokens`, `temperature`, `top_p`, `top_k` and `stop_sequences` become
  `generationConfig`; `thinking` `enabled` becomes `thinkingConfig` (its budget, thoughts
  included), `adaptive` thoughts included at Gemini's own budget; `output_config`'s JSON schema
  becomes `responseJsonSchema`, its effort `thinkingLevel`.
- `tool_choice` `auto`/`any`/`none` is `AUTO`/`ANY`/`NONE`, a named tool `ANY` limited to it;
  `disable_parallel_tool_use: true` is refused: Gemini cannot ask for it.
- `metadata.user_id` names the end user to vkgate (budgets, spend) and is not sent.

Answers: thoughts come back as thinking blocks, text as text, function calls as `tool_use`
(with ids that carry Gemini's thought signatures back); a safety stop is `refusal`, a prompt the
safety filters blocked a 400.
"""

from __future__ import annotations

from typing import Any

import msgspec

from proxy.errors import invalid
from proxy.translate import _anthropic_request as A
from proxy.translate import _gemini
from proxy.translate._answers import AnthropicEvents, anthropic_error, anthropic_message
from proxy.translate._common import anthropic_error_type, refused, request_fields
from proxy.translate._gemini import GEMINI
from proxy.translate.openai_gemini import EFFORT_LEVELS, file_part, function_call, response_object

_encode = msgspec.json.Encoder().encode


def request(body: bytes, model: str) -> bytes:
    """An Anthropic Messages request as a Gemini `generateContent` request (the model goes in
    the URL)."""
    fields = request_fields(A.request, body, GEMINI)
    for name in ("container", "mcp_servers", "context_management"):
        if getattr(fields, name) is not None:
            raise refused(name, GEMINI)
    if fields.service_tier not in (None, "auto", "standard_only"):
        raise refused("service_tier", GEMINI, ": only `auto` and `standard_only` can be")
    contents: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for i, message in enumerate(fields.messages):
        role = "model" if message.role == "assistant" else "user"
        parts = (
            [{"text": message.content}]
            if isinstance(message.content, str)
            else _parts(message.content, f"messages[{i}]", names)
        )
        if contents and contents[-1]["role"] == role:
            contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": role, "parts": parts})
    out: dict[str, Any] = {"contents": contents}
    if fields.system:
        out["systemInstruction"] = {"parts": _system(fields.system)}
    out["generationConfig"] = _generation_config(fields)
    if fields.tools:
        out["tools"] = [{"functionDeclarations": _declarations(fields.tools)}]
    if fields.tool_choice is not None:
        out["toolConfig"] = {"functionCallingConfig": _mode(fields.tool_choice)}
    return _encode(out)


def _system(system: str | list[A.TextBlock]) -> list[dict[str, Any]]:
    if isinstance(system, str):
        return [{"text": system}]
    out = []
    for i, block in enumerate(system):
        if block.citations:
            raise refused(f"system[{i}].citations", GEMINI)
        out.append({"text": block.text})
    return out


def _parts(blocks: list[A.Block], at: str, names: dict[str, str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        here = f"{at}.content[{j}]"
        if isinstance(block, A.TextBlock):
            if block.citations:
                raise refused(f"{here}.citations", GEMINI)
            out.append({"text": block.text})
        elif isinstance(block, A.ImageBlock | A.DocumentBlock):
            out.append(_media(block, here))
        elif isinstance(block, A.ToolUseBlock):
            if not bytes(block.input).lstrip().startswith(b"{"):
                raise invalid(f"`{here}.input` must be an object", param=f"{here}.input")
            if block.caller is not None and block.caller.type != "direct":
                raise refused(f"{here}.caller", GEMINI, ": only the model's own calls can be")
            names[block.id] = block.name
            out.append(function_call(block.id, block.name, block.input))
        elif isinstance(block, A.ToolResultBlock):
            out.append(_function_response(block, here, names))
        elif isinstance(block, A.ThinkingBlock):
            part: dict[str, Any] = {"text": block.thinking, "thought": True}
            if block.signature:
                part["thoughtSignature"] = block.signature
            out.append(part)
        else:
            raise refused(here, GEMINI, ": redacted thinking is Anthropic's own")
    return out


def _media(block: A.ImageBlock | A.DocumentBlock, at: str) -> dict[str, Any]:
    if isinstance(block, A.DocumentBlock) and block.citations is not None:
        raise refused(f"{at}.citations", GEMINI)
    source = block.source
    if isinstance(source, A.URLSource):
        return file_part(source.url, f"{at}.source.url")
    if isinstance(source, A.PlainTextSource):
        return {"text": source.data}
    return {"inlineData": {"mimeType": source.media_type.lower(), "data": source.data}}


def _function_response(block: A.ToolResultBlock, at: str, names: dict[str, str]) -> dict[str, Any]:
    name = names.get(block.tool_use_id)
    if name is None:
        raise invalid(
            f"`{at}.tool_use_id` answers no tool_use of an earlier assistant turn "
            "(Gemini needs the function's name)",
            param=f"{at}.tool_use_id",
        )
    if block.content is None or isinstance(block.content, str):
        text = block.content or ""
    else:
        texts = []
        for k, part in enumerate(block.content):
            if not isinstance(part, A.TextBlock):
                raise refused(f"{at}.content[{k}]", GEMINI, ": its function results hold text")
            texts.append(part.text)
        text = "".join(texts)
    result: msgspec.Raw | dict[str, str] = (
        {"error": text} if block.is_error else response_object(text)
    )
    return {"functionResponse": {"name": name, "response": result}}


def _generation_config(fields: A.Request) -> dict[str, Any]:
    config: dict[str, Any] = {"maxOutputTokens": fields.max_tokens}
    for name, value in (
        ("temperature", fields.temperature),
        ("topP", fields.top_p),
        ("topK", fields.top_k),
    ):
        if value is not None:
            config[name] = value
    if fields.stop_sequences:
        config["stopSequences"] = fields.stop_sequences
    thinking = fields.thinking
    if thinking is not None and thinking.type != "disabled":
        config["thinkingConfig"] = {"includeThoughts": True}
        if thinking.type == "enabled" and thinking.budget_tokens is not None:
            config["thinkingConfig"]["thinkingBudget"] = thinking.budget_tokens
    output = fields.output_config
    if output is not None:
        if output.format is not None:
            config["responseMimeType"] = "application/json"
            config["responseJsonSchema"] = output.format.schema
        if output.effort is not None:
            if output.effort not in EFFORT_LEVELS:
                raise refused(
                    "output_config.effort", GEMINI, ": it takes minimal, low, medium, high"
                )
            config.setdefault("thinkingConfig", {})["thinkingLevel"] = output.effort
    return config


def _declarations(tools: list[msgspec.Raw]) -> list[dict[str, Any]]:
    declarations = []
    for i, raw in enumerate(tools):
        at = f"tools[{i}]"
        kind = request_fields(A.tool_kind, raw, GEMINI, at).type
        if kind not in (None, "custom"):
            raise refused(f"{at}.type", GEMINI, ": only custom tools can be, not Anthropic's own")
        tool = request_fields(A.tool, raw, GEMINI, at)
        declaration: dict[str, Any] = {"name": tool.name}
        if tool.description is not None:
            declaration["description"] = tool.description
        declaration["parametersJsonSchema"] = tool.input_schema
        declarations.append(declaration)
    return declarations


def _mode(choice: A.ToolChoice) -> dict[str, Any]:
    if getattr(choice, "disable_parallel_tool_use", None):
        raise refused(
            "tool_choice.disable_parallel_tool_use", GEMINI, ": it cannot forbid parallel calls"
        )
    if isinstance(choice, A.ChoiceAuto):
        return {"mode": "AUTO"}
    if isinstance(choice, A.ChoiceNone):
        return {"mode": "NONE"}
    if isinstance(choice, A.ChoiceAny):
        return {"mode": "ANY"}
    return {"mode": "ANY", "allowedFunctionNames": [choice.name]}


# -- answers --------------------------------------------------------------------------------------

ID_PREFIX = "msg_"


def response(data: bytes, answer_id: str, model: str) -> bytes:
    """A Gemini answer as an Anthropic message."""
    return anthropic_message(_gemini.answer(data, answer_id, model, ID_PREFIX))


def error(status: int, data: bytes) -> bytes:
    """A Google error body as Anthropic's, keeping Google's message."""
    return anthropic_error(_gemini.error_message(status, data), anthropic_error_type(status))


def stream(answer_id: str, model: str) -> _gemini.StreamReader:
    """Gemini's SSE events as Anthropic's stream events."""
    return _gemini.StreamReader(AnthropicEvents(), answer_id, model, ID_PREFIX)

"""A client speaking OpenAI's Responses API, a provider speaking Google's Gemini API
(`generateContent`, as AI Studio and Vertex AI both serve it).

Requests: `instructions` and system or developer messages become `systemInstruction`, in order;
input items become `contents`, merged where roles repeat (assistant turns are the `model` role):
a `function_call` is a `functionCall` part (with the thought signature its `call_id` carries
back, see `_gemini`), a `function_call_output` a `functionResponse` part of a user turn, named
after the call it answers (Gemini matches results by name); a result that is a JSON object is
the response itself, any other text `{"content": text}`. A reasoning item this gateway
returned is the thought part it came from, its signature kept. Images: a base64 `data:` URL as
`inlineData`, a `gs://` or http(s) URL as `fileData`. Function tools and `tool_choice`,
`max_output_tokens`, `temperature` and `top_p` carry over; `text.format` json_schema becomes
`responseMimeType: application/json` with `responseJsonSchema`, json_object the MIME type
alone; `reasoning.effort` becomes `thinkingConfig.thinkingLevel` (`none`: `thinkingBudget: 0`)
and a `reasoning.summary` `thinkingConfig.includeThoughts`. `user` and `safety_identifier` name
the end user to vkgate and are not sent. Refused with a 400 naming them:
`parallel_tool_calls: false`, `reasoning.effort` `xhigh`, `prompt_cache_key` (Gemini caches by
`cachedContent`), a tool result holding images, files, built-in tools, and what only a stored
response can do (`previous_response_id`, `store: true`, `background`). `text.verbosity` is
accepted and not sent, as for Anthropic: a hint about length with no Gemini equivalent.

Answers: read by `_gemini` into the neutral answer (thoughts as reasoning items), written by
`_responses_cloud`; a prompt Gemini's safety filters blocked is a 400.
"""

from __future__ import annotations

from typing import Any

import msgspec

from proxy.errors import invalid
from proxy.translate._common import data_url, join_turn, refused
from proxy.translate._gemini import GEMINI
from proxy.translate._responses_answer import encode
from proxy.translate._responses_request import (
    FunctionCall,
    FunctionCallOutput,
    FunctionTool,
    InputImage,
    InputText,
    Message,
    NamedFunction,
    OutputText,
    Parsed,
    Reasoning,
    Refusal,
    image_url,
)
from proxy.translate.openai_converse import arguments_object
from proxy.translate.openai_gemini import (
    EFFORT_LEVELS,
    file_part,
    function_call,
    response_object,
)

_EMPTY_SCHEMA = msgspec.Raw(b'{"type":"object","properties":{}}')

Parts = list[dict[str, Any]]


def request(parsed: Parsed) -> bytes:
    """A Responses request as a Gemini `generateContent` request (the model goes in the URL)."""
    fields = parsed.request
    if fields.prompt_cache_key is not None:
        raise refused("prompt_cache_key", GEMINI, ": it caches by `cachedContent`")
    system, contents = _conversation(parsed)
    out: dict[str, Any] = {"contents": contents}
    if system:
        out["systemInstruction"] = {"parts": system}
    if config := _generation_config(parsed):
        out["generationConfig"] = config
    if parsed.tools:
        out["tools"] = [{"functionDeclarations": [_declaration(tool) for tool in parsed.tools]}]
    if (tool_config := _tool_config(parsed)) is not None:
        out["toolConfig"] = tool_config
    return encode(out)


def _generation_config(parsed: Parsed) -> dict[str, Any]:
    fields = parsed.request
    config: dict[str, Any] = {}
    if fields.max_output_tokens is not None:
        config["maxOutputTokens"] = fields.max_output_tokens
    if fields.temperature is not None:
        config["temperature"] = fields.temperature
    if fields.top_p is not None:
        config["topP"] = fields.top_p
    text = fields.text
    format = text.format if text is not None else None
    if format is not None and format.type != "text":
        config["responseMimeType"] = "application/json"
        if format.type == "json_schema":
            if not bytes(format.schema).lstrip().startswith(b"{"):
                raise invalid(
                    "`text.format.schema` must be a JSON schema object",
                    param="text.format.schema",
                )
            config["responseJsonSchema"] = format.schema
    reasoning = fields.reasoning
    thinking: dict[str, Any] = {}
    if reasoning is not None:
        effort = reasoning.effort
        if effort == "none":
            thinking["thinkingBudget"] = 0
        elif effort in EFFORT_LEVELS:
            thinking["thinkingLevel"] = effort
        elif effort is not None:
            raise refused("reasoning.effort", GEMINI, ": it takes none, minimal, low, medium, high")
        if reasoning.summary or reasoning.generate_summary:
            thinking["includeThoughts"] = True
    if thinking:
        config["thinkingConfig"] = thinking
    return config


def _declaration(tool: FunctionTool) -> dict[str, Any]:
    declaration: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        declaration["description"] = tool.description
    absent = bytes(tool.parameters) == b"null"
    declaration["parametersJsonSchema"] = _EMPTY_SCHEMA if absent else tool.parameters
    return declaration


def _tool_config(parsed: Parsed) -> dict[str, Any] | None:
    if parsed.request.parallel_tool_calls is False and parsed.tools:
        raise refused("parallel_tool_calls", GEMINI, ": it cannot forbid parallel calls")
    choice = parsed.request.tool_choice
    if choice is None:
        return None
    if not parsed.tools and choice != "none":
        raise invalid("`tool_choice` needs `tools`", param="tool_choice")
    if isinstance(choice, NamedFunction):
        mode: dict[str, Any] = {"mode": "ANY", "allowedFunctionNames": [choice.name]}
    else:
        mode = {"mode": {"auto": "AUTO", "none": "NONE", "required": "ANY"}[choice]}
    return {"functionCallingConfig": mode}


def _conversation(parsed: Parsed) -> tuple[Parts, list[dict[str, Any]]]:
    system: Parts = []
    if parsed.request.instructions:
        system.append({"text": parsed.request.instructions})
    contents: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    """Each call's function name by its `call_id`: a result names the function it answers."""
    for i, item in enumerate(parsed.items):
        at = f"input[{i}]"
        if isinstance(item, Message):
            if item.role in ("system", "developer"):
                system.extend(_text_parts(item, at))
            elif item.role == "user":
                _append(contents, "user", _user_parts(item.content, f"{at}.content"))
            else:
                _append(contents, "model", _text_parts(item, at))
        elif isinstance(item, FunctionCall):
            names[item.call_id] = item.name
            arguments = arguments_object(item.arguments, f"{at}.arguments")
            _append(contents, "model", [function_call(item.call_id, item.name, arguments)])
        elif isinstance(item, FunctionCallOutput):
            _append(contents, "user", [_function_response(item, at, names)])
        elif isinstance(item, Reasoning):
            _append(contents, "model", [_thought(item)])
    return system, contents


def _append(contents: list[dict[str, Any]], role: str, parts: Parts) -> None:
    """Turns of one role are merged; a message with nothing to say (empty text) makes no turn:
    Gemini refuses one without parts."""
    if parts:
        join_turn(contents, role, parts, key="parts")


def _text(text: str) -> Parts:
    return [{"text": text}] if text else []


def _text_parts(message: Message, at: str) -> Parts:
    if isinstance(message.content, str):
        return _text(message.content)
    parts: Parts = []
    for j, part in enumerate(message.content):
        if isinstance(part, InputText | OutputText):
            parts.extend(_text(part.text))
        elif isinstance(part, Refusal):
            parts.extend(_text(part.refusal))
        else:
            raise refused(
                f"{at}.content[{j}]", GEMINI, f": a {message.role} message holds text only"
            )
    return parts


def _user_parts(content: str | list[Any], at: str) -> Parts:
    if isinstance(content, str):
        return _text(content)
    parts: Parts = []
    for j, part in enumerate(content):
        here = f"{at}[{j}]"
        if isinstance(part, InputImage):
            parts.append(_image(part, here))
        elif isinstance(part, InputText | OutputText):
            parts.extend(_text(part.text))
        else:
            raise refused(here, GEMINI, ": a user message holds text and images")
    return parts


def _image(part: InputImage, at: str) -> dict[str, Any]:
    if part.detail not in (None, "auto"):
        raise refused(f"{at}.detail", GEMINI, ": it has no image detail levels")
    url = image_url(part, at, GEMINI)
    if url.startswith("data:"):
        media_type, data = data_url(url, f"{at}.image_url")
        return {"inlineData": {"mimeType": media_type, "data": data}}
    return file_part(url, f"{at}.image_url")


def _function_response(item: FunctionCallOutput, at: str, names: dict[str, str]) -> dict[str, Any]:
    name = names.get(item.call_id)
    if name is None:
        raise invalid(
            f"`{at}.call_id` answers no `function_call` item before it "
            "(Gemini needs the function's name)",
            param=f"{at}.call_id",
        )
    if isinstance(item.output, str):
        text = item.output
    else:
        texts = []
        for j, part in enumerate(item.output):
            if isinstance(part, InputImage):
                raise refused(f"{at}.output[{j}]", GEMINI, ": a function's response is text only")
            texts.append(part.text)
        text = "".join(texts)
    return {"functionResponse": {"name": name, "response": response_object(text)}}


def _thought(item: Reasoning) -> dict[str, Any]:
    """The thought part a reasoning item of this gateway's came from."""
    part: dict[str, Any] = {"text": "".join(s.text for s in item.summary), "thought": True}
    if item.encrypted_content:
        part["thoughtSignature"] = item.encrypted_content
    return part

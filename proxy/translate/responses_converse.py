"""A client speaking OpenAI's Responses API, a provider speaking Bedrock's Converse API.

Requests: `instructions` and system or developer messages become Converse's `system` blocks,
in order; input items become turns, merged where Converse's roles must alternate: a
`function_call` is a `toolUse` block of the assistant turn, a `function_call_output` a
`toolResult` block of a user turn (its text and images), a reasoning item this gateway returned
the reasoning block it came from (its `encrypted_content` holds the signature, when the model
gave one). Images: a base64
`data:` URL as bytes, an `s3://` URL as an S3 location. Function tools and `tool_choice`
(`none` leaves the tools out, as Converse cannot forbid calls otherwise), `max_output_tokens`,
`temperature` and `top_p` carry over; `text.format` json_schema becomes
`outputConfig.textFormat`, `reasoning.effort` `outputConfig.effort` (`minimal` as `low`; `none`
sends nothing), and a `reasoning.summary` turns on Anthropic's adaptive thinking (in
`additionalModelRequestFields`, as Anthropic's models on Bedrock take it). `user` and
`safety_identifier` name the end user to vkgate and are not sent. Refused with a 400 naming
them: `text.format` json_object (Converse takes a schema), `parallel_tool_calls: false`,
`prompt_cache_key`, an http(s) image URL (Converse fetches none), files, built-in tools, and
what only a stored response can do (`previous_response_id`, `store: true`, `background`).
`text.verbosity` is accepted and not sent, as for Anthropic: a hint about length with no
Converse equivalent.

Answers: read by `_converse` into the neutral answer, written by `_responses_cloud`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from proxy.errors import invalid
from proxy.translate._common import join_turn, refused
from proxy.translate._converse import BEDROCK
from proxy.translate._responses_answer import REDACTED, encode
from proxy.translate._responses_request import (
    Format,
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
from proxy.translate.openai_converse import EFFORTS, arguments_object, image_block

_EMPTY_SCHEMA = msgspec.Raw(b'{"type":"object","properties":{}}')
_EFFORT = {"minimal": "low", **{effort: effort for effort in EFFORTS}}

Blocks = list[dict[str, Any]]


def request(parsed: Parsed, model: str) -> bytes:
    """A Responses request as a Converse request (the model goes in the URL, not the body)."""
    fields = parsed.request
    if fields.prompt_cache_key is not None:
        raise refused("prompt_cache_key", BEDROCK, ": it caches at `cachePoint` blocks")
    system, messages = _conversation(parsed)
    out: dict[str, Any] = {"messages": messages}
    if system:
        out["system"] = system
    inference: dict[str, Any] = {}
    if fields.max_output_tokens is not None:
        inference["maxTokens"] = fields.max_output_tokens
    if fields.temperature is not None:
        inference["temperature"] = fields.temperature
    if fields.top_p is not None:
        inference["topP"] = fields.top_p
    if inference:
        out["inferenceConfig"] = inference
    if (tools := _tool_config(parsed, messages)) is not None:
        out["toolConfig"] = tools
    if output := _output_config(parsed):
        out["outputConfig"] = output
    reasoning = fields.reasoning
    if reasoning is not None and (reasoning.summary or reasoning.generate_summary):
        out["additionalModelRequestFields"] = {"thinking": {"type": "adaptive"}}
    return encode(out)


def _output_config(parsed: Parsed) -> dict[str, Any]:
    output: dict[str, Any] = {}
    text = parsed.request.text
    if text is not None and text.format is not None and text.format.type != "text":
        output["textFormat"] = _format(text.format)
    reasoning = parsed.request.reasoning
    if reasoning is not None and reasoning.effort not in (None, "none"):
        output["effort"] = _EFFORT[reasoning.effort]
    return output


def _format(format: Format) -> dict[str, Any]:
    if format.type == "json_object":
        raise refused(
            "text.format", BEDROCK, ": it takes a JSON schema (`json_schema`), not json_object"
        )
    schema = bytes(format.schema)
    if not schema.lstrip().startswith(b"{"):
        raise invalid(
            "`text.format.schema` must be a JSON schema object", param="text.format.schema"
        )
    # Converse takes the schema as a JSON string.
    definition: dict[str, Any] = {"schema": schema.decode(), "name": format.name or "response"}
    if format.description is not None:
        definition["description"] = format.description
    return {"type": "json_schema", "structure": {"jsonSchema": definition}}


def _tool_config(parsed: Parsed, messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    fields = parsed.request
    if fields.parallel_tool_calls is False and parsed.tools:
        raise refused("parallel_tool_calls", BEDROCK, ": it cannot forbid parallel calls")
    choice = fields.tool_choice
    if not parsed.tools:
        if choice not in (None, "none", "auto"):
            raise invalid("`tool_choice` needs `tools`", param="tool_choice")
        return None
    if choice == "none":
        if any("toolUse" in b or "toolResult" in b for m in messages for b in m["content"]):
            raise refused(
                "tool_choice",
                BEDROCK,
                ': `"none"` leaves the tools out, and Converse takes a conversation holding '
                "tool calls only with its tools",
            )
        return None
    config: dict[str, Any] = {"tools": [_tool(tool) for tool in parsed.tools]}
    if isinstance(choice, NamedFunction):
        config["toolChoice"] = {"tool": {"name": choice.name}}
    elif choice == "required":
        config["toolChoice"] = {"any": {}}
    elif choice == "auto":
        config["toolChoice"] = {"auto": {}}
    return config


def _tool(tool: FunctionTool) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        spec["description"] = tool.description
    absent = bytes(tool.parameters) == b"null"
    spec["inputSchema"] = {"json": _EMPTY_SCHEMA if absent else tool.parameters}
    if tool.strict:
        spec["strict"] = True
    return {"toolSpec": spec}


def _conversation(parsed: Parsed) -> tuple[Blocks, list[dict[str, Any]]]:
    system: Blocks = []
    if parsed.request.instructions:
        system.append({"text": parsed.request.instructions})
    turns: list[dict[str, Any]] = []
    for i, item in enumerate(parsed.items):
        at = f"input[{i}]"
        if isinstance(item, Message):
            if item.role in ("system", "developer"):
                system.extend(_text_blocks(item, at))
            elif item.role == "user":
                _append(turns, "user", _user_blocks(item.content, f"{at}.content"))
            else:
                _append(turns, "assistant", _text_blocks(item, at))
        elif isinstance(item, FunctionCall):
            arguments = arguments_object(item.arguments, f"{at}.arguments")
            use = {"toolUseId": item.call_id, "name": item.name, "input": arguments}
            _append(turns, "assistant", [{"toolUse": use}])
        elif isinstance(item, FunctionCallOutput):
            _append(turns, "user", [_tool_result(item, at)])
        elif isinstance(item, Reasoning):
            _append(turns, "assistant", [_reasoning(item)])
    return system, turns


def _append(turns: list[dict[str, Any]], role: str, blocks: Blocks) -> None:
    """Converse's roles alternate: blocks of the same role as the last turn join it. A message
    with nothing to say (empty text) makes no turn: Converse refuses an empty one."""
    if blocks:
        join_turn(turns, role, blocks)


def _text(text: str) -> Blocks:
    # Converse refuses blank text blocks.
    return [{"text": text}] if text else []


def _text_blocks(message: Message, at: str) -> Blocks:
    if isinstance(message.content, str):
        return _text(message.content)
    blocks: Blocks = []
    for j, part in enumerate(message.content):
        if isinstance(part, InputText | OutputText):
            blocks.extend(_text(part.text))
        elif isinstance(part, Refusal):
            blocks.extend(_text(part.refusal))
        else:
            raise refused(
                f"{at}.content[{j}]", BEDROCK, f": a {message.role} message holds text only"
            )
    return blocks


def _user_blocks(content: str | list[Any], at: str) -> Blocks:
    if isinstance(content, str):
        return _text(content)
    blocks: Blocks = []
    for j, part in enumerate(content):
        here = f"{at}[{j}]"
        if isinstance(part, InputImage):
            url = image_url(part, here, BEDROCK)
            blocks.append(image_block(url, part.detail, f"{here}.image_url", f"{here}.detail"))
        elif isinstance(part, InputText | OutputText):
            blocks.extend(_text(part.text))
        else:
            raise refused(here, BEDROCK, ": a user message holds text and images")
    return blocks


def _tool_result(item: FunctionCallOutput, at: str) -> dict[str, Any]:
    output = item.output
    content = (
        [{"text": output}] if isinstance(output, str) else _user_blocks(output, f"{at}.output")
    )
    return {"toolResult": {"toolUseId": item.call_id, "content": content}}


def _reasoning(item: Reasoning) -> dict[str, Any]:
    """The reasoning block a reasoning item of this gateway's came from: its text, with the
    signature its `encrypted_content` holds (Anthropic's models there need it back; models
    that sign nothing gave none), or the redacted reasoning."""
    sealed = item.encrypted_content
    if sealed and sealed.startswith(REDACTED):
        return {"reasoningContent": {"redactedContent": sealed[len(REDACTED) :]}}
    text: dict[str, Any] = {"text": "".join(summary.text for summary in item.summary)}
    if sealed:
        text["signature"] = sealed
    return {"reasoningContent": {"reasoningText": text}}

"""OpenAI's embeddings request (`POST /v1/embeddings`) as the cloud providers take it, and back.

Bedrock embeds through InvokeModel, in each model family's own body: Amazon Titan
(`inputText`, one text a call) and Cohere (`texts`, up to 96). Google embeds through
`batchEmbedContents`, one request per text. Decisions:

- `input` is a string or a list of strings; token arrays are refused (neither provider takes
  token ids), and so is a list for Titan, which embeds one text per call.
- `dimensions` becomes Titan's `dimensions`, Cohere's `output_dimension` and Gemini's
  `outputDimensionality`; `encoding_format: base64` is done here (little-endian float32, as
  OpenAI encodes it), the providers answering floats.
- Cohere needs an `input_type`, which OpenAI's request cannot say: `search_document`, as text
  embedded for a search index is.
- `user` names the end user to vkgate (budgets, spend) and is not sent.

Usage: Titan and Google (when they report it) give the input's token count in the body; Cohere
on Bedrock only in InvokeModel's `X-Amzn-Bedrock-Input-Token-Count` header, which the Bedrock
adapter writes into the body for this module to read (`vkgateInputTokenCount`). With neither,
the usage is estimated from the input.
"""

from __future__ import annotations

import base64
import struct
from typing import Any, Literal

import msgspec

from proxy.errors import invalid
from proxy.translate._common import provider_error, refused, request_fields
from proxy.usage import MalformedAnswer, TokenUsage

BEDROCK_EMBEDDINGS = "Bedrock's embedding models"
GOOGLE_EMBEDDINGS = "Google's embedding models"
COHERE_BATCH = 96

_encode = msgspec.json.Encoder().encode


class Request(msgspec.Struct, forbid_unknown_fields=True):
    input: str | list[Any]
    model: str | None = None
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = None
    user: str | None = None


_request = msgspec.json.Decoder(Request)


def fields_of(body: bytes, target: str) -> Request:
    """The request's fields, or a 400 naming what `target` cannot take."""
    fields = request_fields(_request, body, target)
    texts = fields.input
    if isinstance(texts, list) and any(not isinstance(item, str) for item in texts):
        raise refused("input", target, ": token arrays cannot be; send text")
    if isinstance(texts, list) and not texts:
        raise invalid("`input` must hold at least one text", param="input")
    return fields


def texts_of(fields: Request) -> list[str]:
    return [fields.input] if isinstance(fields.input, str) else list(fields.input)


def family(model: str) -> str:
    """The embedding model family of a Bedrock model id (or inference profile naming one)."""
    if "cohere.embed" in model:
        return "cohere"
    if "amazon.titan-embed" in model:
        return "titan"
    return ""


def bedrock_request(body: bytes, model: str) -> bytes:
    fields = fields_of(body, BEDROCK_EMBEDDINGS)
    texts = texts_of(fields)
    kind = family(model)
    if kind == "titan":
        if len(texts) != 1:
            raise refused("input", BEDROCK_EMBEDDINGS, ": Titan embeds one text per request")
        out: dict[str, Any] = {"inputText": texts[0]}
        if fields.dimensions is not None:
            out["dimensions"] = fields.dimensions
        return _encode(out)
    if kind == "cohere":
        if len(texts) > COHERE_BATCH:
            raise refused(
                "input", BEDROCK_EMBEDDINGS, f": Cohere embeds {COHERE_BATCH} texts at most"
            )
        out = {"texts": texts, "input_type": "search_document", "embedding_types": ["float"]}
        if fields.dimensions is not None:
            out["output_dimension"] = fields.dimensions
        return _encode(out)
    raise invalid(
        f"model {model!r} is not an embedding model vkgate can call on Bedrock "
        "(Amazon Titan and Cohere embedding models are)",
        param="model",
    )


def google_request(body: bytes, model_name: str | None) -> bytes:
    """A `batchEmbedContents` body; `model_name` (`models/…`) is named in each request for
    Google AI Studio, and left out for Vertex AI, which takes the model from the URL."""
    fields = fields_of(body, GOOGLE_EMBEDDINGS)
    requests = []
    for text in texts_of(fields):
        one: dict[str, Any] = {"content": {"parts": [{"text": text}]}}
        if model_name is not None:
            one["model"] = model_name
        if fields.dimensions is not None:
            one["outputDimensionality"] = fields.dimensions
        requests.append(one)
    return _encode({"requests": requests})


# -- answers --------------------------------------------------------------------------------------


class _Titan(msgspec.Struct):
    embedding: list[float] | None = None
    inputTextTokenCount: int | None = None


class _CohereFloats(msgspec.Struct):
    floats: list[list[float]] = msgspec.field(default_factory=list, name="float")


class _Cohere(msgspec.Struct):
    embeddings: list[list[float]] | _CohereFloats | None = None
    vkgateInputTokenCount: int | None = None
    """InvokeModel's header count, written in by the Bedrock adapter."""


class _Values(msgspec.Struct):
    values: list[float] = []


class _GoogleUsage(msgspec.Struct):
    promptTokenCount: int = 0


class _Google(msgspec.Struct):
    embeddings: list[_Values] | None = None
    embedding: _Values | None = None
    usageMetadata: _GoogleUsage | None = None


class _Bedrock(msgspec.Struct):
    """Either family's answer, read for its usage."""

    inputTextTokenCount: int | None = None
    vkgateInputTokenCount: int | None = None
    """InvokeModel's header count, written in by the Bedrock adapter."""


_titan = msgspec.json.Decoder(_Titan)
_cohere = msgspec.json.Decoder(_Cohere)
_google = msgspec.json.Decoder(_Google)
_bedrock_usage = msgspec.json.Decoder(_Bedrock)


def bedrock_usage(data: bytes) -> tuple[TokenUsage | None, str | None]:
    try:
        answer = _bedrock_usage.decode(data)
    except (msgspec.ValidationError, RecursionError):
        return None, None
    except msgspec.DecodeError:
        raise MalformedAnswer from None
    count = answer.inputTextTokenCount
    if count is None:
        count = answer.vkgateInputTokenCount
    if count is None:
        return None, None
    return TokenUsage(input_tokens=count), None


def google_usage(data: bytes) -> tuple[TokenUsage | None, str | None]:
    try:
        answer = _google.decode(data)
    except (msgspec.ValidationError, RecursionError):
        return None, None
    except msgspec.DecodeError:
        raise MalformedAnswer from None
    if answer.usageMetadata is None:
        return None, None
    return TokenUsage(input_tokens=answer.usageMetadata.promptTokenCount), None


def _vectors_of_bedrock(data: bytes, model: str) -> tuple[list[list[float]], int | None]:
    try:
        if family(model) == "titan":
            titan = _titan.decode(data)
            if titan.embedding is None:
                raise provider_error("the Titan answer holds no embedding")
            return [titan.embedding], titan.inputTextTokenCount
        cohere = _cohere.decode(data)
    except msgspec.DecodeError:
        raise provider_error("an embeddings answer was expected") from None
    embeddings, tokens = cohere.embeddings, cohere.vkgateInputTokenCount
    if isinstance(embeddings, _CohereFloats):
        return embeddings.floats, tokens
    if embeddings is None:
        raise provider_error("the Cohere answer holds no embeddings")
    return embeddings, tokens


def _vectors_of_google(data: bytes) -> tuple[list[list[float]], int | None]:
    try:
        answer = _google.decode(data)
    except msgspec.DecodeError:
        raise provider_error("an embeddings answer was expected") from None
    values = answer.embeddings
    if values is None:
        values = [answer.embedding] if answer.embedding is not None else []
    tokens = answer.usageMetadata.promptTokenCount if answer.usageMetadata else None
    return [v.values for v in values], tokens


class _Embedding(msgspec.Struct):
    index: int
    embedding: list[float] | str
    object: str = "embedding"


class _UsageOut(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int


class _ListOut(msgspec.Struct, kw_only=True):
    object: str = "list"
    data: list[_Embedding]
    model: str
    usage: _UsageOut


def _openai(
    vectors: list[list[float]], tokens: int | None, model: str, encoding: str | None
) -> bytes:
    data = []
    for index, vector in enumerate(vectors):
        embedding: list[float] | str = vector
        if encoding == "base64":
            embedding = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append(_Embedding(index, embedding))
    count = tokens or 0
    return _encode(_ListOut(data=data, model=model, usage=_UsageOut(count, count)))


def bedrock_response(data: bytes, model: str, encoding: str | None) -> bytes:
    """A Titan or Cohere answer as OpenAI's embeddings list."""
    vectors, tokens = _vectors_of_bedrock(data, model)
    return _openai(vectors, tokens, model, encoding)


def google_response(data: bytes, model: str, encoding: str | None) -> bytes:
    """A `batchEmbedContents` (or `embedContent`) answer as OpenAI's embeddings list."""
    vectors, tokens = _vectors_of_google(data)
    return _openai(vectors, tokens, model, encoding)

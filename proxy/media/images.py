"""`POST /v1/images/generations` (JSON) and `POST /v1/images/edits` (an upload of images and a
mask): measured in images made, with their size and quality, and in tokens by modality where
the provider reports them (GPT image models); streamed as typed events when asked."""

from __future__ import annotations

from typing import Annotated

import msgspec

from proxy import body as B
from proxy import multipart
from proxy.asgi import Head
from proxy.errors import invalid
from proxy.limits.budgets import Worst
from proxy.limits.cost import (
    BYTES_PER_TOKEN_AT_MOST,
    BYTES_PER_TOKEN_TYPICAL,
    INLINE_DATA_TOKENS,
    Units,
    image_option,
)
from proxy.media._exchange import MediaExchange
from proxy.media._reading import Reading, json_answer
from proxy.media.audio import flag, model_field
from proxy.prepared import Prepared
from proxy.providers import Operation, Upstream
from proxy.runtime import KeyRuntime
from vkgate.spend import SpendRecord

MAX_IMAGES = 10
"""The most images one request may ask for (OpenAI's own bound)."""
IMAGE_OUTPUT_TOKENS_AT_MOST = 8_192
"""Output tokens a budget reserves per image on a model priced by tokens: above the largest
gpt-image-1 image (6,240 tokens, high quality at 1024x1536)."""

Count = Annotated[int, msgspec.Meta(ge=1, le=MAX_IMAGES)]
Option = Annotated[str, msgspec.Meta(min_length=1, max_length=32)]


class GenerationFields(msgspec.Struct):
    model: B.Model
    prompt: Annotated[str, msgspec.Meta(min_length=1)]
    n: Count | None = None
    size: Option | None = None
    quality: Option | None = None
    stream: bool | None = None
    user: str | None = None


_generation = msgspec.json.Decoder(GenerationFields)


class ImageExchange(MediaExchange):
    output_is = "image"

    def __init__(
        self,
        operation: Operation,
        *,
        stream: bool,
        size: str | None,
        quality: str | None,
        content_type: str | None = None,
    ) -> None:
        super().__init__(
            operation,
            stream=stream,
            events=stream,
            same_format_headers={"Content-Type": content_type} if content_type else None,
        )
        self._size = size
        self._quality = quality

    def read(self, data: bytes) -> Reading:
        return json_answer(data, output_is="image")

    def units(self, record: SpendRecord, reading: Reading) -> None:
        record.images = reading.images
        if reading.images:
            # What the provider says it made; else what was asked (`auto` stays `auto`).
            record.image_size = reading.image_size or self._size
            record.image_quality = reading.image_quality or self._quality


class GenerationExchange(ImageExchange):
    def __init__(self, body: bytes, fields: GenerationFields) -> None:
        super().__init__(
            Operation.IMAGE_GENERATION,
            stream=bool(fields.stream),
            size=fields.size,
            quality=fields.quality,
        )
        self._body = body
        self._requested = fields.model

    def patched(self, upstream: Upstream) -> bytes:
        return B.patch_model(self._body, self._requested, upstream.model_json)


class EditExchange(ImageExchange):
    def __init__(
        self,
        form: multipart.Form,
        model: multipart.Part,
        content_type: str,
        *,
        stream: bool,
        size: str | None,
        quality: str | None,
    ) -> None:
        super().__init__(
            Operation.IMAGE_EDIT,
            stream=stream,
            size=size,
            quality=quality,
            content_type=content_type,
        )
        self._form = form
        self._model = model

    def patched(self, upstream: Upstream) -> bytes:
        return self._form.with_value(self._model, upstream.model.encode())


def generation(runtime: KeyRuntime, head: Head, body: bytes) -> Prepared:
    fields = B.fields(_generation, body)
    exchange = GenerationExchange(body, fields)
    return _prepared(
        fields.model,
        exchange,
        head.end_user or fields.user or None,
        body,
        prompt=len(fields.prompt.encode()),
        uploads=0,
        n=fields.n or 1,
        size=fields.size,
        quality=fields.quality,
    )


def edit(runtime: KeyRuntime, head: Head, body: bytes) -> Prepared:
    form = multipart.parse(head.content_type, body)
    model, alias = model_field(form)
    images = form.files("image", "image[]")
    if not images:
        raise invalid("the form must carry the image to edit, as its `image` field", param="image")
    prompt = form.text("prompt")
    if not prompt:
        raise invalid("the form has no `prompt` field", param="prompt")
    n = _count(form.text("n"))
    size, quality = form.text("size") or None, form.text("quality") or None
    exchange = EditExchange(
        form,
        model,
        head.content_type.decode("latin-1") if head.content_type else "",
        stream=flag(form, "stream"),
        size=size,
        quality=quality,
    )
    return _prepared(
        alias,
        exchange,
        head.end_user or form.text("user") or None,
        body,
        prompt=len(prompt.encode()),
        uploads=len(images) + len(form.files("mask")),
        n=n,
        size=size,
        quality=quality,
    )


def _count(text: str | None) -> int:
    if text is None:
        return 1
    try:
        n = int(text.strip())
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_IMAGES:
        raise invalid(f"n must be a whole number from 1 to {MAX_IMAGES}", param="n")
    return n


def _prepared(
    alias: str,
    exchange: ImageExchange,
    end_user: str | None,
    body: bytes,
    *,
    prompt: int,
    uploads: int,
    n: int,
    size: str | None,
    quality: str | None,
) -> Prepared:
    # Each image at the dearest price its size and quality could turn out to have.
    worst = Worst(
        prompt // BYTES_PER_TOKEN_AT_MOST + 1 + uploads * INLINE_DATA_TOKENS,
        n * IMAGE_OUTPUT_TOKENS_AT_MOST,
        Units(images=n, image_options=(image_option(size, quality),)),
    )
    return Prepared(
        alias,
        exchange,
        end_user,
        body,
        max_output=n * IMAGE_OUTPUT_TOKENS_AT_MOST,
        meter=exchange,
        estimate=prompt // BYTES_PER_TOKEN_TYPICAL + 1 + uploads * INLINE_DATA_TOKENS,
        worst=worst,
    )

"""Wire types of the provider routes; credentials go in and never come out."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import msgspec

from controlplane.schemas import Ident, Name

Url = Annotated[str, msgspec.Meta(min_length=1, max_length=2000, pattern=r"^https?://\S+$")]
Secret = Annotated[str, msgspec.Meta(min_length=1, max_length=8000)]
Decimal = Annotated[str, msgspec.Meta(pattern=r"^\d{1,9}(\.\d{1,9})?$")]
ModelName = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
Region = Annotated[
    str,
    msgspec.Meta(pattern=r"^[a-z]{2}(-[a-z]+)+-\d{1,2}$", description="An AWS region: us-east-1."),
]
Project = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9.:_-]{0,127}$",
        description="A Google Cloud project id (or number).",
    ),
]
Location = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^[a-z][a-z0-9-]{0,39}$",
        description="A Vertex AI location: us-central1, europe-west4, global.",
    ),
]
AccessKeyId = Annotated[str, msgspec.Meta(pattern=r"^[A-Z0-9]{16,128}$")]
ServiceAccount = Annotated[str, msgspec.Meta(min_length=2, max_length=16_000)] | dict[str, Any]


class ProviderKind(StrEnum):
    OPENAI = "openai"
    AZURE_OPENAI = "azure_openai"
    ANTHROPIC = "anthropic"
    OPENAI_COMPATIBLE = "openai_compatible"
    MOCK = "mock"
    BEDROCK = "bedrock"
    GEMINI = "gemini"
    VERTEX_AI = "vertex_ai"


ImageKey = Annotated[
    str,
    msgspec.Meta(pattern=r"^(\*|auto|[1-9][0-9]{1,4}x[1-9][0-9]{1,4})(/[a-z][a-z0-9_-]{0,31})?$"),
]
"""`1024x1024/hd`, `1024x1024` (any quality), `*/hd` (any size) or `*` (any image)."""


class PriceOverride(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """A model's prices through one provider, in USD: tokens per million (the two text rates go
    together; a missing cache, audio or image rate is the text rate of its direction), and
    the units audio and image calls are priced in, each."""

    input_per_mtok: Decimal | None = None
    output_per_mtok: Decimal | None = None
    cache_read_per_mtok: Decimal | None = None
    cache_write_per_mtok: Decimal | None = None
    input_audio_per_mtok: Decimal | None = None
    output_audio_per_mtok: Decimal | None = None
    input_image_per_mtok: Decimal | None = None
    output_image_per_mtok: Decimal | None = None
    per_character: Decimal | None = None
    """Each character of text made into speech."""
    per_second: Decimal | None = None
    """Each second of audio transcribed or translated (priced to the millisecond)."""
    per_image: dict[ImageKey, Decimal] | None = None
    """Each image made, by its `size/quality`; the most specific key that matches applies."""

    def problem(self) -> str | None:
        """What makes this override unusable, or None."""
        if (self.input_per_mtok is None) != (self.output_per_mtok is None):
            missing = "input_per_mtok" if self.input_per_mtok is None else "output_per_mtok"
            return f"input_per_mtok and output_per_mtok go together: {missing} is missing"
        if self.input_per_mtok is None and (
            self.cache_read_per_mtok is not None or self.cache_write_per_mtok is not None
        ):
            return "a cache rate needs input_per_mtok and output_per_mtok"
        units = (
            self.input_per_mtok,
            self.input_audio_per_mtok,
            self.output_audio_per_mtok,
            self.input_image_per_mtok,
            self.output_image_per_mtok,
            self.per_character,
            self.per_second,
        )
        if all(rate is None for rate in units) and not self.per_image:
            return (
                "a price override needs a price: input_per_mtok and output_per_mtok, "
                "per_character, per_second, per_image, or an audio or image token rate"
            )
        return None


class ProviderCreate(msgspec.Struct, forbid_unknown_fields=True):
    organization_id: Ident
    name: Name
    kind: ProviderKind
    base_url: Url | None = None
    api_key: Secret | None = None
    api_version: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] | None = None
    headers: dict[Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9-]{1,100}$")], Secret] | None = (
        None
    )
    price_overrides: dict[ModelName, PriceOverride] | None = None
    responses_api: bool | None = None
    """Whether an `openai`, `azure_openai` or `openai_compatible` provider serves the Responses
    API itself (the default); false has the proxy translate `/v1/responses` to chat for it."""
    # The cloud kinds' own fields (see controlplane/providers/cloud.py):
    region: Region | None = None
    project: Project | None = None
    location: Location | None = None
    aws_access_key_id: AccessKeyId | None = None
    aws_secret_access_key: Secret | None = None
    aws_session_token: Secret | None = None
    service_account_json: ServiceAccount | None = None


class ProviderUpdate(msgspec.Struct, forbid_unknown_fields=True):
    """Fields left out are unchanged; `null` clears an optional one."""

    name: Name | msgspec.UnsetType = msgspec.UNSET
    base_url: Url | msgspec.UnsetType | None = msgspec.UNSET
    api_key: Secret | msgspec.UnsetType | None = msgspec.UNSET
    api_version: (
        Annotated[str, msgspec.Meta(min_length=1, max_length=64)] | msgspec.UnsetType | None
    ) = msgspec.UNSET
    headers: (
        dict[Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9-]{1,100}$")], Secret]
        | msgspec.UnsetType
        | None
    ) = msgspec.UNSET
    price_overrides: dict[ModelName, PriceOverride] | msgspec.UnsetType | None = msgspec.UNSET
    responses_api: bool | msgspec.UnsetType = msgspec.UNSET
    region: Region | msgspec.UnsetType | None = msgspec.UNSET
    project: Project | msgspec.UnsetType | None = msgspec.UNSET
    location: Location | msgspec.UnsetType | None = msgspec.UNSET
    aws_access_key_id: AccessKeyId | msgspec.UnsetType | None = msgspec.UNSET
    """With the secret (and the token, if any): the stored AWS keys are replaced as a whole;
    `null` clears them, and the workload's own credentials are used."""
    aws_secret_access_key: Secret | msgspec.UnsetType | None = msgspec.UNSET
    aws_session_token: Secret | msgspec.UnsetType | None = msgspec.UNSET
    service_account_json: ServiceAccount | msgspec.UnsetType | None = msgspec.UNSET
    """Replaces the stored service account; `null` clears it, and the workload's own
    credentials are used."""


class ProviderRead(msgspec.Struct):
    id: str
    organization_id: str
    name: str
    kind: str
    base_url: str | None
    api_version: str | None
    has_api_key: bool
    header_names: list[str]
    price_overrides: dict[str, PriceOverride]
    responses_api: bool
    """Serves the Responses API itself; false for a provider the proxy translates it for."""
    created_at: str
    updated_at: str
    region: str | None = None
    project: str | None = None
    location: str | None = None
    cloud_credentials: str | None = None
    """For `bedrock` and `vertex_ai`: `stored` (keys or a service account, encrypted and never
    shown) or `workload` (the proxy's own AWS or Google credentials)."""

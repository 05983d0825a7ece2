"""Wire types of the provider routes; credentials go in and never come out."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import msgspec

from controlplane.schemas import Ident, Name

Url = Annotated[str, msgspec.Meta(min_length=1, max_length=2000, pattern=r"^https?://\S+$")]
Secret = Annotated[str, msgspec.Meta(min_length=1, max_length=8000)]
Decimal = Annotated[str, msgspec.Meta(pattern=r"^\d{1,9}(\.\d{1,9})?$")]
ModelName = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]


class ProviderKind(StrEnum):
    OPENAI = "openai"
    AZURE_OPENAI = "azure_openai"
    ANTHROPIC = "anthropic"
    OPENAI_COMPATIBLE = "openai_compatible"
    MOCK = "mock"


class PriceOverride(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """USD per million tokens."""

    input_per_mtok: Decimal
    output_per_mtok: Decimal
    cache_read_per_mtok: Decimal | None = None
    cache_write_per_mtok: Decimal | None = None


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
    created_at: str
    updated_at: str

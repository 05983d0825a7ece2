"""Wire types of the routing-policy routes."""

from __future__ import annotations

from typing import Annotated

import msgspec

from controlplane.schemas import Ident, Name

Alias = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:/@+-]+$")]
ModelName = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
MAX_CHAIN = 16


class Target(msgspec.Struct, forbid_unknown_fields=True):
    provider_id: Ident
    model: ModelName


Chain = Annotated[list[Target], msgspec.Meta(min_length=1, max_length=MAX_CHAIN)]
Aliases = Annotated[dict[Alias, Chain], msgspec.Meta(min_length=1, max_length=1000)]


class PolicyCreate(msgspec.Struct, forbid_unknown_fields=True):
    organization_id: Ident
    name: Name
    aliases: Aliases


class PolicyUpdate(msgspec.Struct, forbid_unknown_fields=True):
    """`aliases`, when given, replaces every alias of the policy."""

    name: Name | msgspec.UnsetType = msgspec.UNSET
    aliases: Aliases | msgspec.UnsetType = msgspec.UNSET


class PolicyRead(msgspec.Struct):
    id: str
    organization_id: str
    name: str
    aliases: dict[str, list[Target]]
    created_at: str
    updated_at: str

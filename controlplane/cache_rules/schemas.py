"""Wire types of the cache-rule routes."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import msgspec

from controlplane.schemas import Ident, Name

MAX_TTL_SECONDS = 30 * 86_400
ModelGlob = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=r"^\S+$")]
Models = Annotated[list[ModelGlob], msgspec.Meta(min_length=1, max_length=100)]
Ttl = Annotated[int, msgspec.Meta(ge=1, le=MAX_TTL_SECONDS)]


class CacheScopeKind(StrEnum):
    ORGANIZATION = "organization"
    TEAM = "team"
    PROJECT = "project"
    VIRTUAL_KEY = "virtual_key"


class CacheScope(msgspec.Struct, forbid_unknown_fields=True):
    """`id` names the team, project or key; an organization rule's is its organization's (and
    may be left out)."""

    kind: CacheScopeKind
    id: Annotated[str, msgspec.Meta(min_length=1, max_length=200)] | None = None


class CacheRuleCreate(msgspec.Struct, forbid_unknown_fields=True):
    organization_id: Ident
    name: Name
    scope: CacheScope
    models: Models
    """Globs over the alias a request names (`gpt-4o*`, `*`)."""
    ttl_seconds: Ttl
    enabled: bool = True


class CacheRuleUpdate(msgspec.Struct, forbid_unknown_fields=True):
    """The scope and organization of a rule never change; delete and create instead."""

    name: Name | msgspec.UnsetType = msgspec.UNSET
    models: Models | msgspec.UnsetType = msgspec.UNSET
    ttl_seconds: Ttl | msgspec.UnsetType = msgspec.UNSET
    enabled: bool | msgspec.UnsetType = msgspec.UNSET


class CacheRuleRead(msgspec.Struct):
    id: str
    organization_id: str
    name: str
    scope: CacheScope
    models: list[str]
    ttl_seconds: int
    enabled: bool
    created_at: str
    updated_at: str

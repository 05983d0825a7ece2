"""Wire types of the organization, team and project routes."""

from __future__ import annotations

import msgspec

from controlplane.schemas import Ident, Name, RateLimits


class OrganizationCreate(msgspec.Struct, forbid_unknown_fields=True):
    name: Name


class OrganizationRead(msgspec.Struct):
    id: str
    name: str
    created_at: str


class TeamCreate(msgspec.Struct, forbid_unknown_fields=True):
    organization_id: Ident
    name: Name
    limits: RateLimits | None = None
    """Shared by every key of the team's projects, on top of each key's own limits."""


class TeamUpdate(msgspec.Struct, forbid_unknown_fields=True):
    """Fields left out are unchanged; `limits` replaces every limit, and `null` clears them."""

    name: Name | msgspec.UnsetType = msgspec.UNSET
    limits: RateLimits | msgspec.UnsetType | None = msgspec.UNSET


class TeamRead(msgspec.Struct):
    id: str
    organization_id: str
    name: str
    limits: RateLimits
    created_at: str


class ProjectCreate(msgspec.Struct, forbid_unknown_fields=True):
    organization_id: Ident
    name: Name
    team_id: Ident | None = None


class ProjectRead(msgspec.Struct):
    id: str
    organization_id: str
    team_id: str | None
    name: str
    created_at: str

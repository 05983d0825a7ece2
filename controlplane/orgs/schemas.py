"""Wire types of the organization, team and project routes."""

from __future__ import annotations

import msgspec

from controlplane.schemas import Ident, Name


class OrganizationCreate(msgspec.Struct, forbid_unknown_fields=True):
    name: Name


class OrganizationRead(msgspec.Struct):
    id: str
    name: str
    created_at: str


class TeamCreate(msgspec.Struct, forbid_unknown_fields=True):
    organization_id: Ident
    name: Name


class TeamRead(msgspec.Struct):
    id: str
    organization_id: str
    name: str
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

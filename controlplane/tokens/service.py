"""Creating and revoking admin tokens: the admin API and the web console both call these."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import select

from controlplane.errors import conflict
from controlplane.models import AdminToken, Organization
from controlplane.security import Hasher, new_admin_token, new_id
from controlplane.state import Tx
from vkgate.keys import display_prefix

if TYPE_CHECKING:
    from controlplane.tokens.routes import TokenCreate


async def create(tx: Tx, hasher: Hasher, data: TokenCreate) -> tuple[AdminToken, str]:
    """The new token's row and the token itself (shown this once)."""
    token = new_admin_token()
    if data.organization_id is not None:
        await tx.get(Organization, data.organization_id, "organization", param="organization_id")
    if await tx.session.scalar(select(AdminToken.id).where(AdminToken.name == data.name)):
        raise conflict(f"an admin token named {data.name!r} already exists", param="name")
    row = AdminToken(
        id=new_id("tok"),
        name=data.name,
        role=data.role.value,
        organization_id=data.organization_id,
        token_hash=hasher.of_secret(token),
        pepper_id=hasher.pepper_id,
        prefix=display_prefix(token),
        created_at=tx.clock.now(),
        revoked_at=None,
    )
    tx.session.add(row)
    # A bound token's creation is its organization's entry: its admins see who got in.
    await tx.audit(
        "admin_token.create", "admin_token", row.id, row.organization_id, {"role": row.role}
    )
    return row, token


async def revoke(tx: Tx, token_id: str) -> AdminToken:
    row = await tx.get(AdminToken, token_id, "admin token")
    if row.revoked_at is None:
        row.revoked_at = tx.clock.now()
        await tx.audit("admin_token.revoke", "admin_token", row.id, row.organization_id)
    return row

"""Moving a key's or a token's stored hash to the current pepper when it is presented.

While `VKGATE_KEY_PEPPER` rotates, a hash made under a previous pepper is still found (the
lookup asks for the hash under every pepper at once); the first presentation then stores the
current pepper's hash in its place, so the previous pepper can be dropped once the keys in use
have been seen. Each move is its own short transaction after the lookup's: a lost race (another
replica moved it first) changes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Update, or_, select, update
from sqlalchemy.exc import SQLAlchemyError

from controlplane.db import Database
from controlplane.models import AdminToken, VirtualKey, VirtualKeySecret
from vkgate.logs import event

log = logging.getLogger("vkgate.controlplane.secrets")


async def rehash_key(
    db: Database, *, secret_id: int, vk_id: str, old: str, new: str, pepper_id: str
) -> None:
    statement = (
        update(VirtualKeySecret)
        .where(VirtualKeySecret.id == secret_id, VirtualKeySecret.key_hash == old)
        .values(key_hash=new, pepper_id=pepper_id)
    )
    if await _moved(db, statement):
        event(log, "hash_moved_to_current_pepper", kind="virtual_key", vk_id=vk_id)


async def rehash_token(db: Database, *, token_id: str, old: str, new: str, pepper_id: str) -> None:
    statement = (
        update(AdminToken)
        .where(AdminToken.id == token_id, AdminToken.token_hash == old)
        .values(token_hash=new, pepper_id=pepper_id)
    )
    if await _moved(db, statement):
        event(log, "hash_moved_to_current_pepper", kind="admin_token", resource_id=token_id)


async def _moved(db: Database, statement: Update) -> bool:
    """Whether this call moved the hash. A failure is logged, not raised: the key was found
    and its request is answered; the move is tried again at its next presentation."""
    try:
        async with db.transaction() as session:
            result = await session.execute(statement)
    except SQLAlchemyError as exc:
        event(log, "hash_move_failed", level=logging.WARNING, cause=type(exc).__name__)
        return False
    moved: int = result.rowcount  # type: ignore[attr-defined]
    return moved == 1


@dataclass(frozen=True, slots=True)
class PepperCounts:
    """Hashes still in use, by whether they are under the current pepper."""

    current: int
    not_yet: int
    """Under a previous pepper, or made before pepper ids were kept (then under whichever
    pepper was current): each stops working when its pepper is no longer listed."""


async def pepper_counts(
    db: Database, pepper_id: str, now: datetime
) -> tuple[PepperCounts, PepperCounts]:
    """(virtual keys, admin tokens) that can still be presented, by pepper."""
    # Here, not at the top: the keys' service imports the admin API's schemas, which import
    # the authentication that imports this module.
    from controlplane.keys.service import KeyStatus

    usable_keys = (
        select(VirtualKeySecret.pepper_id)
        .join(VirtualKey, VirtualKey.id == VirtualKeySecret.vk_id)
        .where(
            VirtualKey.status != KeyStatus.REVOKED,
            or_(VirtualKeySecret.valid_until.is_(None), VirtualKeySecret.valid_until > now),
        )
    )
    usable_tokens = select(AdminToken.pepper_id).where(AdminToken.revoked_at.is_(None))
    async with db.transaction() as session:
        keys = list(await session.scalars(usable_keys))
        tokens = list(await session.scalars(usable_tokens))
    return _counted(keys, pepper_id), _counted(tokens, pepper_id)


def _counted(ids: list[str | None], pepper_id: str) -> PepperCounts:
    current = sum(1 for found in ids if found == pepper_id)
    return PepperCounts(current=current, not_yet=len(ids) - current)

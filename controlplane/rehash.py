"""Moving a key's or a token's stored hash to the current pepper when it is presented.

While `VKGATE_KEY_PEPPER` rotates, a hash made under a previous pepper is still found (the
lookup asks for the hash under every pepper at once); the first presentation then stores the
current pepper's hash in its place, so the previous pepper can be dropped once the keys in use
have been seen. Each move is its own short transaction after the lookup's: a lost race (another
replica moved it first) changes nothing.
"""

from __future__ import annotations

import logging

from sqlalchemy import Update, update
from sqlalchemy.exc import SQLAlchemyError

from controlplane.db import Database
from controlplane.models import AdminToken, VirtualKeySecret
from vkgate.logs import event

log = logging.getLogger("vkgate.controlplane.secrets")


async def rehash_key(db: Database, *, secret_id: int, vk_id: str, old: str, new: str) -> None:
    statement = (
        update(VirtualKeySecret)
        .where(VirtualKeySecret.id == secret_id, VirtualKeySecret.key_hash == old)
        .values(key_hash=new)
    )
    if await _moved(db, statement):
        event(log, "hash_moved_to_current_pepper", kind="virtual_key", vk_id=vk_id)


async def rehash_token(db: Database, *, token_id: str, old: str, new: str) -> None:
    statement = (
        update(AdminToken)
        .where(AdminToken.id == token_id, AdminToken.token_hash == old)
        .values(token_hash=new)
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

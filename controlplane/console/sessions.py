"""Web console sessions: server-side rows in the control plane's database, so any replica can
serve any request of a session, and signing out or revoking the token ends it everywhere."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import delete, select

from controlplane.auth import ENV_TOKEN_ACTOR, Actor, Role
from controlplane.db import Database
from controlplane.models import AdminToken, ConsoleSession
from vkgate.clock import Clock

TOUCH_EVERY = timedelta(seconds=60)
"""How stale `last_seen_at` may get before a request writes it again: a page view costs no
write, and an idle timeout counted in minutes loses at most this much."""


def session_hash(session_id: str) -> str:
    # A random 256-bit id needs no pepper: its hash cannot be searched back to it.
    return hashlib.sha256(session_id.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Session:
    actor: Actor
    csrf_token: str

    def csrf_matches(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(
            presented.encode(), self.csrf_token.encode()
        )


class ConsoleSessions:
    """Opens, finds and ends sessions; one that sat idle past the timeout is gone.

    `env_token_hashes` are VKGATE_ADMIN_TOKEN's peppered hashes (`Hasher.candidates_of_secret`,
    the current pepper's first), none when it is unset. A session it opened stores the first
    and lives only while the variable still hashes to a stored one: a changed value ends it as
    a removed one does, and the hashes under earlier peppers keep it through a rotation."""

    def __init__(
        self, db: Database, clock: Clock, *, idle: timedelta, env_token_hashes: Sequence[str]
    ) -> None:
        self._db = db
        self._clock = clock
        self._idle = idle
        self._env_token_hashes = tuple(env_token_hashes)

    async def open(self, actor: Actor) -> str:
        """A new session for `actor`; its id (the cookie's value) exists only in the answer."""
        session_id = secrets.token_urlsafe(32)
        now = self._clock.now()
        async with self._db.transaction() as session:
            # Sign-in is rare: it also clears sessions that ended by sitting idle.
            await session.execute(
                delete(ConsoleSession).where(ConsoleSession.last_seen_at < now - self._idle)
            )
            session.add(
                ConsoleSession(
                    id_hash=session_hash(session_id),
                    token_id=actor.id,
                    role=actor.role.value,
                    organization_id=actor.organization_id,
                    token_hash=(self._env_token_hashes[0] if actor.id == ENV_TOKEN_ACTOR else None),
                    csrf_token=secrets.token_urlsafe(32),
                    created_at=now,
                    last_seen_at=now,
                )
            )
        return session_id

    async def find(self, session_id: str | None) -> Session | None:
        """The live session of this id, or None: unknown, idle too long, or its token revoked."""
        if not session_id or len(session_id) > 128:
            return None
        now = self._clock.now()
        async with self._db.transaction() as session:
            found = (
                await session.execute(
                    select(ConsoleSession, AdminToken.revoked_at)
                    .outerjoin(AdminToken, AdminToken.id == ConsoleSession.token_id)
                    .where(ConsoleSession.id_hash == session_hash(session_id))
                )
            ).first()
            if found is None:
                return None
            row, revoked_at = found
            token_gone = (
                not self._env_token_still(row.token_hash)
                if row.token_id == ENV_TOKEN_ACTOR
                else revoked_at is not None
            )
            if token_gone or now - row.last_seen_at >= self._idle:
                await session.delete(row)
                return None
            if now - row.last_seen_at >= TOUCH_EVERY:
                row.last_seen_at = now
            return Session(
                actor=Actor(
                    id=row.token_id, role=Role(row.role), organization_id=row.organization_id
                ),
                csrf_token=row.csrf_token,
            )

    def _env_token_still(self, stored: str | None) -> bool:
        """Whether VKGATE_ADMIN_TOKEN is still the value that opened a session; a session
        stored before its hash was (None) cannot say, and ends."""
        if stored is None:
            return False
        return any(hmac.compare_digest(stored, h) for h in self._env_token_hashes)

    async def close(self, session_id: str | None) -> None:
        if not session_id:
            return
        async with self._db.transaction() as session:
            await session.execute(
                delete(ConsoleSession).where(ConsoleSession.id_hash == session_hash(session_id))
            )

"""Moving every stored provider credential (API keys, headers, the cloud kinds' credential
documents) and guardrail webhook secret to the current encryption key (`vkgate secrets
reencrypt`), once `VKGATE_ENCRYPTION_KEY` has a new value and the old one is in
`VKGATE_ENCRYPTION_KEYS_PREVIOUS`."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import select, update
from sqlalchemy.orm import InstrumentedAttribute

from controlplane.db import Database
from controlplane.models import Guardrail, Provider
from controlplane.security import Cipher

BATCH = 200
"""Rows read per transaction: a large install never holds one long transaction."""
Sealed = tuple[tuple[InstrumentedAttribute[bytes | None], str], ...]
# Each table's id, its encrypted columns, and the associated data their ciphertexts are bound
# to (`<row id>:<name>`).
_TABLES: tuple[tuple[type[Provider] | type[Guardrail], InstrumentedAttribute[str], Sealed], ...] = (
    (
        Provider,
        Provider.id,
        (
            (Provider.api_key_encrypted, "api_key"),
            (Provider.headers_encrypted, "headers"),
            # The cloud kinds' credential document (Bedrock's keys, a service account).
            (Provider.credentials_encrypted, "credentials"),
        ),
    ),
    (Guardrail, Guardrail.id, ((Guardrail.secret_encrypted, "secret"),)),
)


@dataclass(slots=True)
class Reencrypted:
    moved: int = 0
    """Credentials sealed under a previous key, now under the current one (or, with
    `dry_run`, that would be)."""
    current: int = 0
    """Credentials already under the current key."""
    unreadable: list[str] = field(default_factory=list)
    """`provider_id:field` of credentials no key in force opens: left as they are."""
    changed_meanwhile: int = 0
    """Credentials replaced (through the admin API) between the read and the write: the new
    value was written under the current key already, and is left alone."""


async def reencrypt(db: Database, cipher: Cipher, *, dry_run: bool = False) -> Reencrypted:
    """Every provider credential and guardrail secret under the current key; each write is a
    compare-and-swap on the ciphertext read, so one replaced meanwhile through the admin API
    is never overwritten."""
    counts = Reencrypted()
    for model, ident, sealed in _TABLES:
        await _reencrypt_table(db, cipher, model, ident, sealed, counts, dry_run=dry_run)
    return counts


async def _reencrypt_table(
    db: Database,
    cipher: Cipher,
    model: type[Provider] | type[Guardrail],
    ident: InstrumentedAttribute[str],
    sealed: Sealed,
    counts: Reencrypted,
    *,
    dry_run: bool,
) -> None:
    after = ""
    while True:
        async with db.transaction() as session:
            rows = (
                await session.execute(
                    select(ident, *(column for column, _ in sealed))
                    .where(ident > after)
                    .order_by(ident)
                    .limit(BATCH)
                )
            ).all()
            for row_id, *blobs in rows:
                for (column, name), blob in zip(sealed, blobs, strict=True):
                    if blob is None:
                        continue
                    context = f"{row_id}:{name}"
                    try:
                        plaintext, is_current = cipher.opened(blob, context=context)
                    except ValueError:
                        counts.unreadable.append(context)
                        continue
                    if is_current:
                        counts.current += 1
                        continue
                    counts.moved += 1
                    if dry_run:
                        continue
                    result = await session.execute(
                        update(model)
                        .where(ident == row_id, column == blob)
                        .values({column.key: cipher.encrypt(plaintext, context=context)})
                    )
                    if result.rowcount == 0:  # type: ignore[attr-defined]
                        counts.moved -= 1
                        counts.changed_meanwhile += 1
        if len(rows) < BATCH:
            return
        after = rows[-1][0]

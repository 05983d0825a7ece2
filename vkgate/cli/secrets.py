"""`vkgate secrets`: rotating vkgate's own secrets (README "Rotating secrets")."""

from __future__ import annotations

import asyncio
import json

import click

from vkgate import env as E
from vkgate.cli._client import SECRETS_FILE
from vkgate.cli.serve import GENERATED, database_errors

# What `generate` makes, by the name an operator types.
_NAMES = {
    "internal-secret": "VKGATE_INTERNAL_SECRET",
    "jwt-secret": "VKGATE_JWT_SECRET",
    "key-pepper": "VKGATE_KEY_PEPPER",
    "encryption-key": "VKGATE_ENCRYPTION_KEY",
    "admin-token": "VKGATE_ADMIN_TOKEN",
}


@click.group("secrets")
def secrets() -> None:
    """Rotate vkgate's secrets: new values, and credentials moved to a new encryption key."""


@secrets.command("generate")
@click.argument("which", type=click.Choice(sorted(_NAMES)))
def generate(which: str) -> None:
    """Print a new random value for a secret, in the form its variable takes."""
    click.echo(GENERATED[_NAMES[which]]())


def _control_plane_env() -> dict[str, str]:
    environ = E.environment()
    # As `vkgate up` reads them: the secrets file it writes, overridden by the environment.
    return {**E.load_secrets_file(E.home(environ) / SECRETS_FILE), **environ}


@secrets.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(as_json: bool) -> None:
    """How far a rotation of VKGATE_ENCRYPTION_KEY and VKGATE_KEY_PEPPER has come.

    Counts the stored provider credentials by key, and the virtual keys and admin tokens still
    usable by pepper: those not yet under the current pepper stop working once the pepper they
    are under leaves VKGATE_KEY_PEPPERS_PREVIOUS. Run it with the control plane's settings.
    """
    from datetime import UTC, datetime

    from controlplane.db import Database, create_engine
    from controlplane.providers.reencrypt import Reencrypted
    from controlplane.providers.reencrypt import reencrypt as move
    from controlplane.rehash import PepperCounts, pepper_counts
    from controlplane.security import Cipher, Hasher
    from controlplane.settings import ControlPlaneSettings

    env = _control_plane_env()
    try:
        settings = ControlPlaneSettings.from_env(env)
    except E.SettingError as exc:
        raise click.ClickException(f"configuration: {exc}") from None
    cipher = Cipher(settings.encryption_key, previous=settings.encryption_keys_previous)
    hasher = Hasher(settings.key_pepper, previous=settings.key_peppers_previous)

    async def run() -> tuple[Reencrypted, PepperCounts, PepperCounts]:
        db = Database(create_engine(settings.database_url))
        try:
            credentials = await move(db, cipher, dry_run=True)
            keys, tokens = await pepper_counts(db, hasher.pepper_id, datetime.now(UTC))
            return credentials, keys, tokens
        finally:
            await db.close()

    with database_errors():
        credentials, keys, tokens = asyncio.run(run())
    if as_json:
        report = {
            "credentials": {
                "current": credentials.current,
                "previous": credentials.moved,
                "unreadable": credentials.unreadable,
            },
            "virtual_keys": {"current": keys.current, "not_yet": keys.not_yet},
            "admin_tokens": {"current": tokens.current, "not_yet": tokens.not_yet},
        }
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(
        f"stored credentials (providers', guardrail webhooks'): {credentials.current} under "
        "the current key, "
        f"{credentials.moved} under a previous one (`vkgate secrets reencrypt` moves them), "
        f"{len(credentials.unreadable)} unreadable"
    )
    for name, counts in (("virtual keys", keys), ("admin tokens", tokens)):
        click.echo(
            f"{name}: {counts.current} under the current pepper, {counts.not_yet} not yet "
            "(each moves when next presented)"
        )


@secrets.command("reencrypt")
@click.option("--dry-run", is_flag=True, help="Count what would move, and write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def reencrypt(dry_run: bool, as_json: bool) -> None:
    """Move every stored provider credential to the current VKGATE_ENCRYPTION_KEY.

    Run it where the control plane runs, with its settings (VKGATE_DATABASE_URL, the new
    VKGATE_ENCRYPTION_KEY and the old one in VKGATE_ENCRYPTION_KEYS_PREVIOUS), after every
    control plane has the new key. It can run while they serve, and again: what is moved
    already is counted as current. Exits 1 when a credential opens under no key given.
    """
    from controlplane.db import Database, create_engine
    from controlplane.providers.reencrypt import Reencrypted
    from controlplane.providers.reencrypt import reencrypt as move
    from controlplane.security import Cipher
    from controlplane.settings import database_url

    env = _control_plane_env()
    try:
        E.check_unknown(env)
        url = database_url(env, E.home(env))
        key = E.encryption_key(env, "VKGATE_ENCRYPTION_KEY")
        previous = E.previous_encryption_keys(
            env, "VKGATE_ENCRYPTION_KEYS_PREVIOUS", "VKGATE_ENCRYPTION_KEY"
        )
    except E.SettingError as exc:
        raise click.ClickException(f"configuration: {exc}") from None

    async def run() -> Reencrypted:
        db = Database(create_engine(url))
        try:
            return await move(db, Cipher(key, previous=previous), dry_run=dry_run)
        finally:
            await db.close()

    with database_errors():
        counts = asyncio.run(run())
    report = {
        "moved": counts.moved,
        "current": counts.current,
        "unreadable": counts.unreadable,
        "changed_meanwhile": counts.changed_meanwhile,
        "dry_run": dry_run,
    }
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        verb = "would move" if dry_run else "moved"
        click.echo(
            f"stored credentials (providers', guardrail webhooks'): {counts.moved} {verb} to the "
            "current key, "
            f"{counts.current} under it already, {len(counts.unreadable)} unreadable"
            + (
                f", {counts.changed_meanwhile} replaced meanwhile (under the current key)"
                if counts.changed_meanwhile
                else ""
            )
        )
    if counts.unreadable:
        raise click.ClickException(
            f"{len(counts.unreadable)} credentials open under no key given "
            f"({', '.join(counts.unreadable[:10])}): add the key they were sealed with to "
            "VKGATE_ENCRYPTION_KEYS_PREVIOUS, or set them again with `vkgate providers update`"
        )
    if not dry_run and previous and not as_json:
        click.echo(
            "every readable credential is under VKGATE_ENCRYPTION_KEY now: take the old key out "
            "of VKGATE_ENCRYPTION_KEYS_PREVIOUS once no control plane runs with it as current"
        )

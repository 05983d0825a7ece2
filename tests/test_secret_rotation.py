"""Rotating each secret without downtime: the new value in force, the old one still accepted,
and what was made under the old one moved to the new."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import jwt
import pytest
from click.testing import CliRunner
from sqlalchemy import select

from controlplane.app import create_app
from controlplane.db import Database
from controlplane.internal.resolve import verify_jwt
from controlplane.models import AdminToken, Guardrail, Provider, VirtualKeySecret
from controlplane.security import Cipher, Hasher
from controlplane.settings import ControlPlaneSettings
from proxy.control import ControlPlaneClient, Unreachable
from proxy.settings import ProxySettings
from tests.conftest import Internal, seed_world, serve_in_loop
from tests.support.api import create
from tests.support.clock import ManualClock
from tests.support.env import (
    ENCRYPTION_KEY,
    INTERNAL_SECRET,
    JWT_SECRET,
    KEY_PEPPER,
    secrets_env,
)
from vkgate import env as E
from vkgate import signing
from vkgate.cli import main
from vkgate.keys import key_sha256

NEW_INTERNAL = "new-internal-secret-0123456789abcdef01"
NEW_JWT = "new-jwt-secret-0123456789abcdef0123456"
NEW_PEPPER = "new-key-pepper-0123456789abcdef0123456"
NEW_KEY = base64.urlsafe_b64encode(bytes(range(100, 132))).decode()
RESOLVE = "/api/internal/gateway/resolve-key"
HEALTH = "/api/internal/gateway/health"


def rotated(settings: ControlPlaneSettings, **changes: Any) -> ControlPlaneSettings:
    return dataclasses.replace(settings, **changes)


@pytest.fixture
def old(settings: ControlPlaneSettings) -> ControlPlaneSettings:
    return settings


@pytest.fixture
def new(settings: ControlPlaneSettings) -> ControlPlaneSettings:
    """Every secret rotated: the new values current, the old ones previous."""
    return rotated(
        settings,
        internal_secret=NEW_INTERNAL,
        internal_secret_previous=INTERNAL_SECRET,
        jwt_secret=NEW_JWT,
        jwt_secret_previous=JWT_SECRET,
        key_pepper=NEW_PEPPER,
        key_peppers_previous=(KEY_PEPPER,),
        encryption_key=base64.urlsafe_b64decode(NEW_KEY),
        encryption_keys_previous=(base64.urlsafe_b64decode(ENCRYPTION_KEY),),
    )


async def serving(
    settings: ControlPlaneSettings, clock: ManualClock, database: Database
) -> AsyncIterator[httpx.AsyncClient]:
    async with serve_in_loop(
        create_app(settings, clock=clock, database=database), "http://controlplane.test"
    ) as http:
        yield http


async def resolve(client: httpx.AsyncClient, clock: ManualClock, secret: str, key: str) -> Any:
    internal = Internal(client, clock, secret)
    return await internal.call("POST", RESOLVE, {"key_sha256": key_sha256(key)})


# -- settings -------------------------------------------------------------------------------


def test_previous_secrets_are_read_from_their_variables() -> None:
    env = {
        **secrets_env("sqlite:///x.db"),
        "VKGATE_INTERNAL_SECRET_PREVIOUS": NEW_INTERNAL,
        "VKGATE_JWT_SECRET_PREVIOUS": NEW_JWT,
        "VKGATE_KEY_PEPPERS_PREVIOUS": f"{NEW_PEPPER}, {'p' * 32}",
        "VKGATE_ENCRYPTION_KEYS_PREVIOUS": NEW_KEY,
    }
    settings = ControlPlaneSettings.from_env(env)
    assert settings.internal_secrets == (INTERNAL_SECRET, NEW_INTERNAL)
    assert settings.jwt_secrets == (JWT_SECRET, NEW_JWT)
    assert settings.key_peppers_previous == (NEW_PEPPER, "p" * 32)
    assert settings.encryption_keys_previous == (base64.urlsafe_b64decode(NEW_KEY),)
    proxy = ProxySettings.from_env(env)
    assert proxy.internal_secrets == (INTERNAL_SECRET, NEW_INTERNAL)


def test_without_previous_values_only_the_current_secrets_are_in_force() -> None:
    settings = ControlPlaneSettings.from_env(secrets_env("sqlite:///x.db"))
    assert settings.internal_secrets == (INTERNAL_SECRET,)
    assert settings.key_peppers_previous == ()
    assert settings.encryption_keys_previous == ()
    assert ProxySettings.from_env(secrets_env("sqlite:///x.db")).internal_secrets == (
        INTERNAL_SECRET,
    )


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "VKGATE_INTERNAL_SECRET_PREVIOUS",
            "short",
            "VKGATE_INTERNAL_SECRET_PREVIOUS must be at least 32 characters long",
        ),
        (
            "VKGATE_INTERNAL_SECRET_PREVIOUS",
            INTERNAL_SECRET,
            "VKGATE_INTERNAL_SECRET_PREVIOUS repeats VKGATE_INTERNAL_SECRET",
        ),
        (
            "VKGATE_JWT_SECRET_PREVIOUS",
            JWT_SECRET,
            "VKGATE_JWT_SECRET_PREVIOUS repeats VKGATE_JWT_SECRET",
        ),
        (
            "VKGATE_KEY_PEPPERS_PREVIOUS",
            f"{NEW_PEPPER},tooshort",
            "VKGATE_KEY_PEPPERS_PREVIOUS: value 2 of 2 is shorter than 32 characters",
        ),
        (
            "VKGATE_KEY_PEPPERS_PREVIOUS",
            f"{NEW_PEPPER},{KEY_PEPPER}",
            "VKGATE_KEY_PEPPERS_PREVIOUS lists VKGATE_KEY_PEPPER itself",
        ),
        (
            "VKGATE_KEY_PEPPERS_PREVIOUS",
            f"{NEW_PEPPER},{NEW_PEPPER}",
            "VKGATE_KEY_PEPPERS_PREVIOUS lists the same value twice",
        ),
        (
            "VKGATE_ENCRYPTION_KEYS_PREVIOUS",
            f"{NEW_KEY},AAAA",
            "VKGATE_ENCRYPTION_KEYS_PREVIOUS (key 2 of 2) must decode to exactly 32 bytes, got 3",
        ),
        (
            "VKGATE_ENCRYPTION_KEYS_PREVIOUS",
            "not base64!",
            "VKGATE_ENCRYPTION_KEYS_PREVIOUS (key 1 of 1) must be URL-safe base64",
        ),
        (
            "VKGATE_ENCRYPTION_KEYS_PREVIOUS",
            ENCRYPTION_KEY,
            "VKGATE_ENCRYPTION_KEYS_PREVIOUS lists VKGATE_ENCRYPTION_KEY itself",
        ),
    ],
)
def test_a_malformed_previous_value_stops_start_up_naming_its_variable(
    name: str, value: str, message: str
) -> None:
    env = {**secrets_env("sqlite:///x.db"), name: value}
    with pytest.raises(E.SettingError) as raised:
        ControlPlaneSettings.from_env(env)
    assert message in str(raised.value)
    if name == "VKGATE_INTERNAL_SECRET_PREVIOUS":
        with pytest.raises(E.SettingError, match=name):
            ProxySettings.from_env(env)


# -- the internal API's secret ---------------------------------------------------------------


def test_a_signature_made_with_the_previous_secret_verifies_only_while_it_is_listed() -> None:
    headers = signing.signed_headers(INTERNAL_SECRET, "GET", HEALTH, b"", 1000.0)
    args = ("GET", HEALTH, b"", headers[signing.TIMESTAMP_HEADER])
    signature = headers[signing.SIGNATURE_HEADER]
    assert (
        signing.verify(NEW_INTERNAL, *args, signature, 1000.0, previous=[INTERNAL_SECRET]) is None
    )
    assert (
        signing.verify(NEW_INTERNAL, *args, signature, 1000.0) is signing.SignatureProblem.MISMATCH
    )


async def test_a_control_plane_with_a_previous_internal_secret_takes_signatures_made_with_either(
    new: ControlPlaneSettings, clock: ManualClock, clean_database: Database
) -> None:
    async for http in serving(new, clock, clean_database):
        for secret in (NEW_INTERNAL, INTERNAL_SECRET):
            assert (await Internal(http, clock, secret).call("GET", HEALTH)).status_code == 200
        stranger = Internal(http, clock, "another-secret-0123456789abcdef0123")
        assert (await stranger.call("GET", HEALTH)).json()["error"]["code"] == "bad_signature"


@pytest.mark.parametrize("knows", ["old", "new"])
async def test_a_proxy_signs_with_whichever_of_its_two_secrets_the_control_plane_takes(
    knows: str, old: ControlPlaneSettings, clock: ManualClock, clean_database: Database
) -> None:
    """A proxy rolled before the control planes (the control plane knows only the old secret),
    or after they dropped the old one (it knows only the new): either way no call fails."""
    only = old if knows == "old" else rotated(old, internal_secret=NEW_INTERNAL)
    app = create_app(only, clock=clock, database=clean_database)
    async for _ in serving(only, clock, clean_database):
        control = ControlPlaneClient(
            "http://controlplane.test",
            NEW_INTERNAL,
            clock,
            previous_secret=INTERNAL_SECRET,
            transport=httpx.ASGITransport(app=app),
        )
        try:
            for _ in range(3):
                health = await control.health()
                assert health.status == "ok"
        finally:
            await control.close()


async def test_a_proxy_with_no_secret_the_control_plane_takes_is_told_to_check_it(
    old: ControlPlaneSettings, clock: ManualClock, clean_database: Database
) -> None:
    app = create_app(old, clock=clock, database=clean_database)
    async for _ in serving(old, clock, clean_database):
        control = ControlPlaneClient(
            "http://controlplane.test",
            NEW_INTERNAL,
            clock,
            previous_secret="yet-another-secret-0123456789abcdef012",
            transport=httpx.ASGITransport(app=app),
        )
        try:
            with pytest.raises(Unreachable, match="VKGATE_INTERNAL_SECRET"):
                await control.health()
        finally:
            await control.close()


# -- the key pepper --------------------------------------------------------------------------


async def test_a_key_hashed_under_the_previous_pepper_resolves_and_moves_to_the_current_one(
    old: ControlPlaneSettings,
    new: ControlPlaneSettings,
    clock: ManualClock,
    clean_database: Database,
) -> None:
    async for http in serving(old, clock, clean_database):
        world = await seed_world(http)
    async for http in serving(new, clock, clean_database):
        answer = await resolve(http, clock, NEW_INTERNAL, world.key)
        assert answer.status_code == 200, answer.text
        assert answer.json()["vk_id"] == world.key_id
    async with clean_database.transaction() as session:
        stored = await session.scalar(
            select(VirtualKeySecret.key_hash).where(VirtualKeySecret.vk_id == world.key_id)
        )
    assert stored == Hasher(NEW_PEPPER).of_secret(world.key)
    # Moved: a control plane that no longer knows the old pepper finds it.
    only_new = rotated(new, key_peppers_previous=())
    async for http in serving(only_new, clock, clean_database):
        assert (await resolve(http, clock, NEW_INTERNAL, world.key)).status_code == 200


async def test_a_key_not_presented_during_the_rotation_is_unknown_once_its_pepper_is_dropped(
    old: ControlPlaneSettings,
    new: ControlPlaneSettings,
    clock: ManualClock,
    clean_database: Database,
) -> None:
    async for http in serving(old, clock, clean_database):
        world = await seed_world(http)
    async for http in serving(rotated(new, key_peppers_previous=()), clock, clean_database):
        answer = await resolve(http, clock, NEW_INTERNAL, world.key)
        assert answer.json()["error"]["code"] == "invalid_api_key"


async def test_an_admin_token_made_under_the_previous_pepper_works_and_moves_to_the_current_one(
    old: ControlPlaneSettings,
    new: ControlPlaneSettings,
    clock: ManualClock,
    clean_database: Database,
) -> None:
    async for http in serving(old, clock, clean_database):
        made = await create(http, "/api/admin/tokens", {"name": "ops", "role": "finance"})
    token = made["token"]
    async for http in serving(new, clock, clean_database):
        answer = await http.get(
            "/api/admin/organizations", headers={"Authorization": f"Bearer {token}"}
        )
        assert answer.status_code == 200, answer.text
    async with clean_database.transaction() as session:
        stored = await session.scalar(select(AdminToken.token_hash).where(AdminToken.name == "ops"))
    assert stored == Hasher(NEW_PEPPER).of_secret(token)


# -- the encryption key ----------------------------------------------------------------------


def test_a_credential_sealed_under_a_previous_key_opens_and_new_ones_are_sealed_under_the_current() -> (
    None
):
    old_key, new_key = bytes(range(32)), bytes(range(100, 132))
    sealed = Cipher(old_key).encrypt("sk-1", context="prov_1:api_key")
    keyring = Cipher(new_key, previous=[old_key])
    assert keyring.opened(sealed, context="prov_1:api_key") == ("sk-1", False)
    resealed = keyring.encrypt("sk-1", context="prov_1:api_key")
    assert Cipher(new_key).decrypt(resealed, context="prov_1:api_key") == "sk-1"
    with pytest.raises(
        ValueError, match="VKGATE_ENCRYPTION_KEY or VKGATE_ENCRYPTION_KEYS_PREVIOUS"
    ):
        Cipher(bytes(32), previous=[bytes(range(1, 33))]).decrypt(sealed, context="prov_1:api_key")


async def test_bundles_carry_credentials_sealed_under_either_key_during_the_rotation(
    old: ControlPlaneSettings,
    new: ControlPlaneSettings,
    clock: ManualClock,
    clean_database: Database,
) -> None:
    async for http in serving(old, clock, clean_database):
        world = await seed_world(http)
    async for http in serving(new, clock, clean_database):
        config = await Internal(http, clock, NEW_INTERNAL).call(
            "GET", f"/api/internal/gateway/config/{world.key_id}"
        )
        assert config.status_code == 200, config.text
        (target,) = config.json()["aliases"]["fast"]
        assert target["api_key"] == "sk-test-provider-credential-7d1f"


async def reencrypt_cli(env: dict[str, str], *args: str) -> Any:
    # The command runs its own event loop: on a thread, as from a shell.
    return await asyncio.to_thread(
        CliRunner().invoke, main, ["secrets", "reencrypt", *args], env=env
    )


async def test_reencrypt_moves_every_credential_to_the_current_key_and_reports_counts(
    old: ControlPlaneSettings,
    clock: ManualClock,
    clean_database: Database,
    database_url: str,
    tmp_path: Any,
) -> None:
    async for http in serving(old, clock, clean_database):
        world = await seed_world(http)
        await create(
            http,
            "/api/admin/providers",
            {
                "organization_id": world.org,
                "name": "with-headers",
                "kind": "openai_compatible",
                "base_url": "http://vllm.internal/v1",
                "headers": {"x-tenant": "t-1"},
            },
        )
        cloud = await create(
            http,
            "/api/admin/providers",
            {
                "organization_id": world.org,
                "name": "bedrock-stored",
                "kind": "bedrock",
                "region": "us-east-1",
                "aws_access_key_id": "AKIAROTATEDALONG0001",
                "aws_secret_access_key": "rotated-along-secret-access-key-0001",
            },
        )
        hook = await create(
            http,
            "/api/admin/guardrails",
            {
                "organization_id": world.org,
                "name": "hook",
                "kind": "webhook",
                "config": {"url": "https://guard.example.com/check"},
                "secret": "whsec-rotated-along-0123",
            },
        )
    env = {
        **secrets_env(database_url),
        "VKGATE_HOME": str(tmp_path),
        "VKGATE_ENCRYPTION_KEY": NEW_KEY,
        "VKGATE_ENCRYPTION_KEYS_PREVIOUS": ENCRYPTION_KEY,
    }
    dry = await reencrypt_cli(env, "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.output) | {"unreadable": []} == {
        "moved": 4,
        "current": 0,
        "unreadable": [],
        "changed_meanwhile": 0,
        "dry_run": True,
    }
    moved = await reencrypt_cli(env)
    assert moved.exit_code == 0, moved.output
    assert (
        "stored credentials (providers', guardrail webhooks'): 4 moved to the current key, "
        "0 under it already" in moved.output
    )
    again = await reencrypt_cli(env, "--json")
    assert json.loads(again.output)["current"] == 4
    assert json.loads(again.output)["moved"] == 0
    only_new = Cipher(base64.urlsafe_b64decode(NEW_KEY))
    async with clean_database.transaction() as session:
        row = await session.get(Provider, world.provider)
        assert row is not None and row.api_key_encrypted is not None
        sealed = row.api_key_encrypted
    assert only_new.decrypt(sealed, context=f"{world.provider}:api_key") == (
        "sk-test-provider-credential-7d1f"
    )
    async with clean_database.transaction() as session:
        cloud_row = await session.get(Provider, cloud["id"])
        assert cloud_row is not None and cloud_row.credentials_encrypted is not None
        document = cloud_row.credentials_encrypted
    assert json.loads(only_new.decrypt(document, context=f"{cloud['id']}:credentials")) == {
        "aws_access_key_id": "AKIAROTATEDALONG0001",
        "aws_secret_access_key": "rotated-along-secret-access-key-0001",
    }
    async with clean_database.transaction() as session:
        guardrail = await session.get(Guardrail, hook["id"])
        assert guardrail is not None and guardrail.secret_encrypted is not None
        secret = guardrail.secret_encrypted
    assert only_new.decrypt(secret, context=f"{hook['id']}:secret") == "whsec-rotated-along-0123"


async def test_reencrypt_names_credentials_no_key_opens_and_exits_1(
    old: ControlPlaneSettings,
    clock: ManualClock,
    clean_database: Database,
    database_url: str,
    tmp_path: Any,
) -> None:
    async for http in serving(old, clock, clean_database):
        world = await seed_world(http)
    env = {
        **secrets_env(database_url),
        "VKGATE_HOME": str(tmp_path),
        "VKGATE_ENCRYPTION_KEY": NEW_KEY,
    }
    result = await reencrypt_cli(env)
    assert result.exit_code == 1
    assert f"{world.provider}:api_key" in result.output
    assert "VKGATE_ENCRYPTION_KEYS_PREVIOUS" in result.output


def test_secrets_generate_prints_a_value_each_variable_takes() -> None:
    result = CliRunner().invoke(main, ["secrets", "generate", "encryption-key"])
    assert result.exit_code == 0
    assert E.encryption_key({"K": result.output.strip()}, "K")
    pepper = CliRunner().invoke(main, ["secrets", "generate", "key-pepper"]).output.strip()
    assert len(pepper) >= E.SECRET_MIN_LENGTH


# -- the JWT secret --------------------------------------------------------------------------


async def test_jwts_are_signed_with_the_current_secret_and_verify_with_the_previous_too(
    old: ControlPlaneSettings,
    new: ControlPlaneSettings,
    clock: ManualClock,
    clean_database: Database,
) -> None:
    async for http in serving(old, clock, clean_database):
        world = await seed_world(http)
        before = (await resolve(http, clock, INTERNAL_SECRET, world.key)).json()["jwt"]
    async for http in serving(new, clock, clean_database):
        after = (await resolve(http, clock, NEW_INTERNAL, world.key)).json()["jwt"]
    now = clock.now()
    in_force = (NEW_JWT, JWT_SECRET)
    for token in (before, after):
        assert verify_jwt(token, in_force, now=now)["sub"] == world.key_id
    assert jwt.get_unverified_header(after)["alg"] == "HS256"
    assert verify_jwt(after, (NEW_JWT,), now=now)["sub"] == world.key_id
    with pytest.raises(jwt.InvalidSignatureError):
        verify_jwt(before, (NEW_JWT,), now=now)
    with pytest.raises(jwt.ExpiredSignatureError):
        verify_jwt(before, in_force, now=now + timedelta(minutes=16))


async def test_a_bundles_etag_is_the_same_on_control_planes_before_and_during_the_rotation(
    old: ControlPlaneSettings,
    new: ControlPlaneSettings,
    clock: ManualClock,
    clean_database: Database,
) -> None:
    """A proxy revalidating its bundles against either replica keeps getting 304s."""
    async for http in serving(old, clock, clean_database):
        world = await seed_world(http)
        path = f"/api/internal/gateway/config/{world.key_id}"
        before = (await Internal(http, clock).call("GET", path)).headers["etag"]
    async for http in serving(new, clock, clean_database):
        during = await Internal(http, clock, NEW_INTERNAL).call(
            "GET", path, headers={"If-None-Match": before}
        )
    assert during.status_code == 304


async def status_cli(env: dict[str, str]) -> Any:
    result = await asyncio.to_thread(
        CliRunner().invoke, main, ["secrets", "status", "--json"], env=env
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


async def test_status_counts_what_is_still_under_a_previous_key_or_pepper_until_it_moves(
    old: ControlPlaneSettings,
    new: ControlPlaneSettings,
    clock: ManualClock,
    clean_database: Database,
    database_url: str,
    tmp_path: Any,
) -> None:
    async for http in serving(old, clock, clean_database):
        world = await seed_world(http)
        await create(http, "/api/admin/tokens", {"name": "ops", "role": "finance"})
        await create(
            http,
            "/api/admin/providers",
            {
                "organization_id": world.org,
                "name": "bedrock-stored",
                "kind": "bedrock",
                "region": "us-east-1",
                "aws_access_key_id": "AKIASTATUSCOUNTED001",
                "aws_secret_access_key": "status-counted-secret-access-key-001",
            },
        )
    env = {
        **secrets_env(database_url),
        "VKGATE_HOME": str(tmp_path),
        "VKGATE_ENCRYPTION_KEY": NEW_KEY,
        "VKGATE_ENCRYPTION_KEYS_PREVIOUS": ENCRYPTION_KEY,
        "VKGATE_KEY_PEPPER": NEW_PEPPER,
        "VKGATE_KEY_PEPPERS_PREVIOUS": KEY_PEPPER,
    }
    before = await status_cli(env)
    assert before == {
        "credentials": {"current": 0, "previous": 2, "unreadable": []},
        "virtual_keys": {"current": 0, "not_yet": 1},
        "admin_tokens": {"current": 0, "not_yet": 1},
    }
    async for http in serving(new, clock, clean_database):
        assert (await resolve(http, clock, NEW_INTERNAL, world.key)).status_code == 200
        await create(http, "/api/admin/tokens", {"name": "new", "role": "finance"})
    assert (await reencrypt_cli(env)).exit_code == 0
    after = await status_cli(env)
    assert after == {
        "credentials": {"current": 2, "previous": 0, "unreadable": []},
        "virtual_keys": {"current": 1, "not_yet": 0},
        "admin_tokens": {"current": 1, "not_yet": 1},
    }

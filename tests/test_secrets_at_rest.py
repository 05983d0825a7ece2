"""Secrets at rest: no credential, header value, virtual key or admin token in any row or log."""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from controlplane.db import Database
from controlplane.models import Base, Provider
from controlplane.providers.service import open_api_key
from controlplane.security import Cipher
from controlplane.settings import ControlPlaneSettings
from tests.conftest import Internal
from tests.support.api import ADMIN, create
from tests.support.env import ADMIN_TOKEN
from vkgate.keys import key_sha256

Client = httpx.AsyncClient
OPENAI_CREDENTIAL = "sk-at-rest-openai-credential-9f3a71c2"
VLLM_CREDENTIAL = "sk-at-rest-vllm-credential-2b8e04d5"
ROTATED_CREDENTIAL = "sk-at-rest-rotated-credential-c61f9a0e"
REFUSED_CREDENTIAL = "sk-at-rest-refused-credential-77d3e5b1"
HEADER_VALUE = "hdr-at-rest-header-value-4e2a9c"


async def every_cell(database: Database) -> dict[str, list[Any]]:
    """table name → every value of every row, as the database returns it."""
    cells: dict[str, list[Any]] = {}
    async with database.engine.connect() as conn:
        for table in Base.metadata.sorted_tables:
            rows = (await conn.execute(select(table))).all()
            cells[table.name] = [value for row in rows for value in row]
    return cells


def contains(cell: Any, secret: str) -> bool:
    if cell is None:
        return False
    if isinstance(cell, bytes | bytearray | memoryview):
        return secret.encode() in bytes(cell)
    if isinstance(cell, dict | list):
        return secret in json.dumps(cell, default=str)
    return secret in str(cell)


def logged_during_setup(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The records of the `secrets_made` fixture, which runs in the setup phase."""
    return caplog.get_records("setup")


def log_text(records: list[logging.LogRecord]) -> str:
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    lines: list[str] = []
    for record in records:
        lines.append(formatter.format(record))
        lines.append(repr(record.args))
    return "\n".join(lines)


@pytest.fixture
async def secrets_made(
    client: Client, internal: Internal, caplog: pytest.LogCaptureFixture
) -> dict[str, str]:
    """Every kind of secret the admin API takes or issues, made while logging at DEBUG."""
    caplog.set_level(logging.DEBUG)
    # SQLAlchemy pins its own root logger at WARNING; open it up to see statements and parameters.
    caplog.set_level(logging.DEBUG, logger="sqlalchemy")
    org = (await create(client, "/api/admin/organizations", {"name": "acme"}))["id"]
    project = await create(client, "/api/admin/projects", {"organization_id": org, "name": "p"})
    openai = await create(
        client,
        "/api/admin/providers",
        {
            "organization_id": org,
            "name": "openai",
            "kind": "openai",
            "api_key": OPENAI_CREDENTIAL,
            "headers": {"X-Tenant-Secret": HEADER_VALUE},
        },
    )
    vllm = await create(
        client,
        "/api/admin/providers",
        {
            "organization_id": org,
            "name": "vllm",
            "kind": "openai_compatible",
            "base_url": "http://vllm.internal:8000/v1",
            "api_key": VLLM_CREDENTIAL,
            "headers": {"Authorization-Extra": HEADER_VALUE},
        },
    )
    patched = await client.patch(
        f"/api/admin/providers/{vllm['id']}", json={"api_key": ROTATED_CREDENTIAL}, headers=ADMIN
    )
    assert patched.status_code == 200
    refused = await client.post(
        "/api/admin/providers",
        json={"organization_id": org, "name": "m", "kind": "mock", "api_key": REFUSED_CREDENTIAL},
        headers=ADMIN,
    )
    assert refused.status_code == 422
    assert REFUSED_CREDENTIAL not in refused.text

    policy = await create(
        client,
        "/api/admin/routing-policies",
        {
            "organization_id": org,
            "name": "default",
            "aliases": {
                "fast": [
                    {"provider_id": openai["id"], "model": "gpt-4o-mini"},
                    {"provider_id": vllm["id"], "model": "llama"},
                ]
            },
        },
    )
    key = await create(
        client,
        "/api/admin/virtual-keys",
        {"project_id": project["id"], "name": "app", "routing_policy_id": policy["id"]},
    )
    rotated = await client.post(
        f"/api/admin/virtual-keys/{key['id']}/rotate", json={"grace_seconds": 0}, headers=ADMIN
    )
    assert rotated.status_code == 200, rotated.text
    admin_token = await create(client, "/api/admin/tokens", {"name": "ops", "role": "admin"})
    used = await client.get(
        "/api/admin/providers", headers={"Authorization": f"Bearer {admin_token['token']}"}
    )
    assert used.status_code == 200
    wrong = await client.get("/api/admin/providers", headers={"Authorization": "Bearer vka-wrong"})
    assert wrong.status_code == 401

    # The proxy's side: resolving a key and fetching the bundle that carries the credentials.
    resolved = await internal.call(
        "POST",
        "/api/internal/gateway/resolve-key",
        {"key_sha256": key_sha256(rotated.json()["key"])},
    )
    assert resolved.status_code == 200, resolved.text
    bundle = await internal.call("GET", f"/api/internal/gateway/config/{key['id']}")
    assert bundle.status_code == 200
    assert OPENAI_CREDENTIAL in bundle.text and ROTATED_CREDENTIAL in bundle.text

    return {
        "openai credential": OPENAI_CREDENTIAL,
        "vllm credential": VLLM_CREDENTIAL,
        "replacement credential": ROTATED_CREDENTIAL,
        "refused credential": REFUSED_CREDENTIAL,
        "header value": HEADER_VALUE,
        "virtual key": key["key"],
        "rotated virtual key": rotated.json()["key"],
        "configured admin token": ADMIN_TOKEN,
        "created admin token": admin_token["token"],
    }


async def test_no_secret_is_stored_in_any_cell(
    secrets_made: dict[str, str], database: Database
) -> None:
    cells = await every_cell(database)
    assert cells["providers"] and cells["virtual_key_secrets"] and cells["admin_tokens"]
    for table, values in cells.items():
        for label, secret in secrets_made.items():
            assert not any(contains(v, secret) for v in values), f"{label} found in {table}"


async def test_unpeppered_hashes_of_keys_and_tokens_are_not_stored(
    secrets_made: dict[str, str], database: Database
) -> None:
    # A bare SHA-256 in the database would let its thief test guesses without the pepper.
    cells = await every_cell(database)
    for label in ("virtual key", "rotated virtual key", "created admin token"):
        digest = key_sha256(secrets_made[label])
        for table, values in cells.items():
            assert not any(contains(v, digest) for v in values), f"sha256 of {label} in {table}"


async def test_no_secret_reaches_the_logs(
    secrets_made: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    records = logged_during_setup(caplog)
    # SQLAlchemy logged every statement and its parameters: the writes were watched.
    assert any(
        r.name.startswith("sqlalchemy.engine") and "INSERT INTO providers" in r.getMessage()
        for r in records
    )
    logged = log_text(records)
    for label, secret in secrets_made.items():
        assert secret not in logged, f"{label} was logged"
        # The bare SHA-256 is what resolve-key accepts: as good as the key to a signed caller.
        assert hashlib.sha256(secret.encode()).hexdigest() not in logged


async def test_credentials_are_sealed_to_their_own_row(
    secrets_made: dict[str, str], database: Database, settings: ControlPlaneSettings
) -> None:
    cipher = Cipher(settings.encryption_key)
    async with database.transaction() as session:
        rows = {p.name: p for p in await session.scalars(select(Provider))}
    assert open_api_key(cipher, rows["openai"]) == OPENAI_CREDENTIAL
    assert open_api_key(cipher, rows["vllm"]) == ROTATED_CREDENTIAL

    # A ciphertext copied onto another provider's row does not open there.
    moved = rows["vllm"]
    moved.api_key_encrypted = rows["openai"].api_key_encrypted
    with pytest.raises(ValueError, match="does not decrypt"):
        open_api_key(cipher, moved)

"""Admin API: the cloud kinds (bedrock, gemini, vertex_ai), their own fields checked with 422s that
name the field, and their credentials sealed at rest, never returned, handed to proxies."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from controlplane.db import Database
from controlplane.providers.cloud import open_credentials
from controlplane.security import Cipher
from controlplane.settings import ControlPlaneSettings
from tests.conftest import Internal, World
from tests.support.api import ADMIN, create, error_of
from tests.support.fake_gemini import CLIENT_EMAIL, PRIVATE_KEY_PEM
from tests.test_admin_providers import PROVIDERS, chain_of, get_provider, stored
from tests.test_secrets_at_rest import contains, every_cell

Client = httpx.AsyncClient
KEY_ID = "AKIAADMINTESTKEY0001"
SECRET = "admin/test/secret+key/abcdefghijklmnopqrstuv"
SESSION = "FwoGZXIvYXdzEAdminTestSessionToken"
ACCOUNT: dict[str, str] = {
    "type": "service_account",
    "project_id": "acme-ml",
    "private_key_id": "abc123",
    "private_key": PRIVATE_KEY_PEM,
    "client_email": CLIENT_EMAIL,
    "token_uri": "https://oauth2.googleapis.com/token",
}


def bedrock(org: str, **fields: Any) -> dict[str, Any]:
    body = {"organization_id": org, "name": "bedrock", "kind": "bedrock", "region": "us-east-1"}
    body.update(fields)
    return {k: v for k, v in body.items() if v is not None}


def vertex(org: str, **fields: Any) -> dict[str, Any]:
    body = {
        "organization_id": org,
        "name": "vertex",
        "kind": "vertex_ai",
        "project": "acme-ml",
        "location": "europe-west4",
    }
    body.update(fields)
    return {k: v for k, v in body.items() if v is not None}


@pytest.fixture
def cipher(settings: ControlPlaneSettings) -> Cipher:
    return Cipher(settings.encryption_key)


async def test_bedrock_with_stored_keys_keeps_them_sealed_and_never_shows_them(
    client: Client, world: World, cipher: Cipher, clean_database: Database
) -> None:
    created = await create(
        client,
        PROVIDERS,
        bedrock(
            world.org,
            aws_access_key_id=KEY_ID,
            aws_secret_access_key=SECRET,
            aws_session_token=SESSION,
        ),
    )
    assert created["region"] == "us-east-1"
    assert created["cloud_credentials"] == "stored"
    assert created["has_api_key"] is False and created["base_url"] is None
    shown = json.dumps(await get_provider(client, created["id"]))
    for secret in (KEY_ID, SECRET, SESSION):
        assert secret not in shown
        for cells in (await every_cell(clean_database)).values():
            assert not any(contains(cell, secret) for cell in cells)
    row = await stored(clean_database, created["id"])
    assert open_credentials(cipher, row) == {
        "aws_access_key_id": KEY_ID,
        "aws_secret_access_key": SECRET,
        "aws_session_token": SESSION,
    }


async def test_the_bundle_carries_a_cloud_credentials_fields_and_keys(
    client: Client, world: World, internal: Internal
) -> None:
    provider = await create(
        client,
        PROVIDERS,
        vertex(world.org, service_account_json=json.dumps(ACCOUNT)),
    )
    response = await client.patch(
        f"/api/admin/routing-policies/{world.policy}",
        json={"aliases": {"fast": [{"provider_id": provider["id"], "model": "gemini-2.5-flash"}]}},
        headers=ADMIN,
    )
    assert response.status_code == 200, response.text
    (target,) = await chain_of(internal, world)
    assert target["kind"] == "vertex_ai"
    assert target["settings"] == {"project": "acme-ml", "location": "europe-west4"}
    assert json.loads(target["credentials"]["service_account_json"]) == ACCOUNT
    assert target["price"] is not None, "genai-prices knows Gemini under google"


async def test_without_stored_credentials_the_workload_is_named_and_updates_switch_between(
    client: Client, world: World
) -> None:
    created = await create(client, PROVIDERS, bedrock(world.org))
    assert created["cloud_credentials"] == "workload"
    path = f"{PROVIDERS}/{created['id']}"
    keys = {"aws_access_key_id": KEY_ID, "aws_secret_access_key": SECRET}
    response = await client.patch(path, json={**keys, "region": "eu-west-1"}, headers=ADMIN)
    assert response.status_code == 200, response.text
    assert response.json()["cloud_credentials"] == "stored"
    assert response.json()["region"] == "eu-west-1"
    response = await client.patch(path, json={"aws_access_key_id": None}, headers=ADMIN)
    assert response.json()["cloud_credentials"] == "workload"
    gemini = await create(
        client,
        PROVIDERS,
        {"organization_id": world.org, "name": "studio", "kind": "gemini", "api_key": "AIza-x"},
    )
    assert gemini["base_url"] == "https://generativelanguage.googleapis.com"
    assert gemini["cloud_credentials"] is None


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (lambda org: bedrock(org, region=None), "region"),
        (lambda org: bedrock(org, region="mars-north"), "region"),
        (lambda org: bedrock(org, api_key="sk-nope"), "api_key"),
        (lambda org: bedrock(org, aws_access_key_id=KEY_ID), "aws_secret_access_key"),
        (lambda org: bedrock(org, aws_secret_access_key=SECRET), "aws_access_key_id"),
        (lambda org: bedrock(org, aws_session_token=SESSION), "aws_access_key_id"),
        (lambda org: bedrock(org, aws_access_key_id="lowercase-id"), "aws_access_key_id"),
        (
            lambda org: bedrock(org, aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET + "\n"),
            "aws_secret_access_key",
        ),
        (lambda org: bedrock(org, project="acme"), "project"),
        (lambda org: vertex(org, location=None), "location"),
        (lambda org: vertex(org, project=None), "project"),
        (lambda org: vertex(org, region="us-east-1"), "region"),
        (lambda org: vertex(org, api_key="AIza-x"), "api_key"),
        (lambda org: vertex(org, service_account_json="{not json"), "service_account_json"),
        (
            lambda org: vertex(org, service_account_json={**ACCOUNT, "type": "authorized_user"}),
            "service_account_json",
        ),
        (
            lambda org: vertex(org, service_account_json={**ACCOUNT, "client_email": ""}),
            "service_account_json.client_email",
        ),
        (
            lambda org: vertex(
                org, service_account_json={**ACCOUNT, "private_key": PRIVATE_KEY_PEM[:300]}
            ),
            "service_account_json.private_key",
        ),
        (
            lambda org: vertex(org, service_account_json={**ACCOUNT, "token_uri": "file:///x"}),
            "service_account_json.token_uri",
        ),
        (
            lambda org: {"organization_id": org, "name": "g", "kind": "gemini"},
            "api_key",
        ),
        (
            lambda org: {
                "organization_id": org,
                "name": "g",
                "kind": "gemini",
                "api_key": "AIza-x",
                "aws_access_key_id": KEY_ID,
            },
            "aws_access_key_id",
        ),
    ],
    ids=[
        "bedrock-no-region",
        "bedrock-bad-region",
        "bedrock-api-key",
        "bedrock-id-without-secret",
        "bedrock-secret-without-id",
        "bedrock-token-alone",
        "bedrock-malformed-id",
        "bedrock-secret-with-newline",
        "bedrock-vertex-field",
        "vertex-no-location",
        "vertex-no-project",
        "vertex-bedrock-field",
        "vertex-api-key",
        "vertex-account-not-json",
        "vertex-account-not-a-service-account",
        "vertex-account-no-email",
        "vertex-account-key-cut-short",
        "vertex-account-token-uri-not-http",
        "gemini-no-api-key",
        "gemini-aws-field",
    ],
)
async def test_a_cloud_field_that_does_not_fit_is_refused_naming_it(
    client: Client, world: World, body: Any, param: str
) -> None:
    response = await client.post(PROVIDERS, json=body(world.org), headers=ADMIN)
    error = error_of(response, 422, "validation_error", param=param)
    assert PRIVATE_KEY_PEM[40:80] not in error["message"], "nothing of a key is repeated"

"""`POST resolve-key`: a presented key's SHA-256 in; its identity, a JWT and its bundle out."""

from __future__ import annotations

import hashlib
from typing import Any

import httpx
import pytest
from litestar import Litestar

from controlplane.ledger.client import LedgerError
from tests.conftest import Internal, World, create
from vkgate import signing
from vkgate.keys import key_sha256

RESOLVE = "/api/internal/gateway/resolve-key"


def error(response: httpx.Response) -> dict[str, Any]:
    detail: dict[str, Any] = response.json()["error"]
    return detail


async def test_the_sha256_of_a_key_resolves_to_the_key_and_its_organization(
    internal: Internal, world: World
) -> None:
    response = await internal.call("POST", RESOLVE, {"key_sha256": key_sha256(world.key)})

    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["vk_id"] == world.key_id
    assert answer["organization_id"] == world.org
    assert answer["revision"] >= 1
    assert answer["jwt"].count(".") == 2
    assert world.key not in response.text


async def test_hex_digits_of_either_case_name_the_same_key(
    internal: Internal, world: World
) -> None:
    response = await internal.call("POST", RESOLVE, {"key_sha256": key_sha256(world.key).upper()})
    assert response.status_code == 200, response.text
    assert response.json()["vk_id"] == world.key_id


async def test_an_unknown_hash_is_401_invalid_api_key(internal: Internal, world: World) -> None:
    unknown = hashlib.sha256(b"vk-never-issued").hexdigest()
    response = await internal.call("POST", RESOLVE, {"key_sha256": unknown})

    assert response.status_code == 401
    assert error(response)["code"] == "invalid_api_key"
    assert error(response)["type"] == "authentication_error"


async def test_a_key_of_another_secret_with_the_same_prefix_is_unknown(
    internal: Internal, world: World
) -> None:
    forged = world.key[:-1] + ("A" if world.key[-1] != "A" else "B")
    response = await internal.call("POST", RESOLVE, {"key_sha256": key_sha256(forged)})
    assert response.status_code == 401
    assert error(response)["code"] == "invalid_api_key"


@pytest.mark.parametrize(
    "malformed",
    ["", "abc", "0" * 63, "0" * 65, "g" * 64, " " + "0" * 63, "0" * 63 + "\n"],
    ids=["empty", "short", "63-digits", "65-digits", "not-hex", "leading-space", "newline"],
)
async def test_a_key_sha256_that_is_not_64_hex_digits_is_400(
    internal: Internal, world: World, malformed: str
) -> None:
    response = await internal.call("POST", RESOLVE, {"key_sha256": malformed})

    assert response.status_code == 400, response.text
    assert error(response)["code"] == "invalid_request"
    assert error(response)["param"] == "key_sha256"


async def test_the_raw_key_is_refused_in_place_of_its_sha256(
    internal: Internal, world: World
) -> None:
    response = await internal.call("POST", RESOLVE, {"key_sha256": world.key})

    assert response.status_code == 400
    assert error(response)["param"] == "key_sha256"
    assert world.key not in response.text


async def test_an_unknown_field_is_422(internal: Internal, world: World) -> None:
    response = await internal.call(
        "POST", RESOLVE, {"key_sha256": key_sha256(world.key), "key": world.key}
    )

    assert response.status_code == 422
    assert error(response)["code"] == "validation_error"
    assert error(response)["param"] == "key"
    assert world.key not in response.text


@pytest.mark.parametrize("body", [{}, {"key_sha256": 7}, [key_sha256("vk-x")]], ids=str)
async def test_a_body_without_a_key_sha256_string_is_422(
    internal: Internal, world: World, body: Any
) -> None:
    response = await internal.call("POST", RESOLVE, body)
    assert response.status_code == 422
    assert error(response)["code"] == "validation_error"


async def test_a_body_that_is_not_json_is_400(internal: Internal, world: World) -> None:
    raw = b"key_sha256=" + key_sha256(world.key).encode()
    headers = signing.signed_headers(internal.secret, "POST", RESOLVE, raw, internal.clock.time())
    response = await internal.client.post(
        RESOLVE, content=raw, headers={**headers, "content-type": "application/json"}
    )
    assert response.status_code == 400
    assert error(response)["code"] == "invalid_request"


async def budgeted(client: httpx.AsyncClient, world: World) -> None:
    body = {
        "organization_id": world.org,
        "scope": {"kind": "virtual_key", "id": world.key_id},
        "window": "month",
        "limit_usd": "25",
    }
    await create(client, "/api/admin/budgets", body)


async def test_the_resolution_brings_the_bundle_and_etag_config_would_give(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    await budgeted(client, world)
    resolved = await internal.call("POST", RESOLVE, {"key_sha256": key_sha256(world.key)})
    config = await internal.call("GET", f"/api/internal/gateway/config/{world.key_id}")

    assert resolved.status_code == config.status_code == 200, resolved.text
    answer = resolved.json()
    assert answer["bundle"] == config.json()
    assert answer["bundle"]["vk_id"] == world.key_id
    assert [b["limit_usd"] for b in answer["bundle"]["budgets"]] == ["25"]
    assert answer["etag"] == config.headers["etag"]
    unchanged = await internal.call(
        "GET",
        f"/api/internal/gateway/config/{world.key_id}",
        headers={"If-None-Match": answer["etag"]},
    )
    assert unchanged.status_code == 304


async def test_with_the_ledger_down_a_key_resolves_without_its_bundle(
    app: Litestar,
    client: httpx.AsyncClient,
    internal: Internal,
    world: World,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its budgets' spend cannot be read: the resolution still renews (a proxy keeps serving
    what it cached), and `config` says what is wrong."""
    await budgeted(client, world)

    async def down(*args: object) -> list[int]:
        raise LedgerError("connection refused", cause="ConnectError")

    monkeypatch.setattr(app.state["vk"].ledger, "spend", down)
    resolved = await internal.call("POST", RESOLVE, {"key_sha256": key_sha256(world.key)})
    config = await internal.call("GET", f"/api/internal/gateway/config/{world.key_id}")

    assert resolved.status_code == 200, resolved.text
    answer = resolved.json()
    assert answer["vk_id"] == world.key_id
    assert answer["bundle"] is None
    assert answer["etag"] is None
    assert config.status_code == 503
    assert "ledger" in error(config)["message"]

"""The control plane's structured logs: admin mutations and spend as allowlisted JSON events."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import httpx
import msgspec
import pytest

from controlplane.app import create_app
from controlplane.db import Database
from controlplane.ledger.store import Ledger
from controlplane.settings import ControlPlaneSettings, LedgerLocation
from tests.conftest import World, serve_in_loop
from tests.support.api import ADMIN, create
from tests.support.captured import Captured, controlplane_logs
from tests.support.clock import ManualClock
from tests.support.env import ADMIN_TOKEN
from tests.support.ledger import request, segment, ship

PROVIDER_CREDENTIAL = "sk-test-provider-credential-7d1f"
ENVELOPE = {"time", "level", "logger", "event"}


@pytest.fixture
def logged() -> Iterator[Captured]:
    with controlplane_logs() as captured:
        yield captured


async def test_admin_mutations_are_logged_with_allowlisted_fields_and_no_secret(
    logged: Captured, client: httpx.AsyncClient, world: World
) -> None:
    token = await create(client, "/api/admin/tokens", {"name": "ci", "role": "admin"})
    as_token = {"Authorization": f"Bearer {token['token']}"}
    revoked = await client.post(f"/api/admin/virtual-keys/{world.key_id}/revoke", headers=as_token)
    assert revoked.status_code == 200, revoked.text
    # Refused before anything is written: no mutation, so no line.
    refused = await client.post("/api/admin/teams", json={"name": "x"}, headers=ADMIN)
    assert refused.status_code in (400, 422)

    lines = logged.events("admin_mutation")
    audit = (await client.get("/api/admin/audit-log", headers=ADMIN)).json()["data"]
    assert [(line["action"], line["resource_id"]) for line in lines] == [
        (entry["action"], entry["resource_id"]) for entry in audit
    ]
    for line in lines:
        assert line["logger"] == "vkgate.controlplane.audit"
        assert set(line) <= ENVELOPE | {
            "actor",
            "action",
            "resource_kind",
            "resource_id",
            "organization_id",
        }
    by_action = {line["action"]: line for line in lines}
    assert by_action["virtual_key.create"] == {
        "time": by_action["virtual_key.create"]["time"],
        "level": "info",
        "logger": "vkgate.controlplane.audit",
        "event": "admin_mutation",
        "actor": "env",  # the configured token's name, never the token
        "action": "virtual_key.create",
        "resource_kind": "virtual_key",
        "resource_id": world.key_id,
        "organization_id": world.org,
    }
    assert by_action["virtual_key.revoke"]["actor"] == token["id"]
    assert "organization_id" not in by_action["admin_token.create"]  # tokens belong to no org
    for secret in (ADMIN_TOKEN, token["token"], world.key, PROVIDER_CREDENTIAL):
        assert secret not in logged.text


async def test_an_ingested_segment_is_logged_once_with_its_counts(
    logged: Captured, client: httpx.AsyncClient, clock: ManualClock, world: World
) -> None:
    shipped = segment(
        request(clock.now() - timedelta(minutes=5), organization_id=world.org),
        segment_id="seg-logged-1",
    )
    assert (await ship(client, clock, shipped)).status_code == 200
    assert (await ship(client, clock, shipped)).status_code == 200
    assert (await ship(client, clock, b'{"segment_id": 7}')).status_code in (400, 422)

    first, again = logged.events("spend_ingested")
    assert {k: first[k] for k in ("segment", "records", "ingested", "duplicates")} == {
        "segment": "seg-logged-1",
        "records": 2,  # an admit and its confirm
        "ingested": 2,
        "duplicates": 0,
    }
    assert first["duration_ms"] >= 0
    assert (again["records"], again["ingested"], again["duplicates"]) == (2, 0, 2)
    (rejected,) = logged.events("spend_segment_rejected")
    assert rejected["level"] == "warning"
    assert rejected["code"] in ("invalid_request", "validation_error")
    assert rejected["bytes"] == len(b'{"segment_id": 7}')


async def test_a_failed_ledger_write_is_logged_without_the_ledger_credentials(
    logged: Captured,
    settings: ControlPlaneSettings,
    clock: ManualClock,
    clean_database: Database,
) -> None:
    password = "ledger-password-7f3a"
    ledger = Ledger(
        LedgerLocation(kind="http", host="127.0.0.1", port=9, database="spend", password=password)
    )
    app = create_app(settings, clock=clock, database=clean_database, ledger=ledger)
    try:
        async with serve_in_loop(app, "http://cp.test") as client:
            org = (await create(client, "/api/admin/organizations", {"name": "o"}))["id"]
            body = msgspec.json.encode(
                segment(request(clock.now(), organization_id=org), segment_id="seg-down-1")
            )
            assert (await ship(client, clock, body)).status_code == 503
    finally:
        await ledger.close()

    (failed,) = logged.events("ledger_write_failed")
    assert failed["level"] == "error"
    assert failed["segment"] == "seg-down-1"
    assert failed["records"] == 2
    assert failed["cause"]
    (unavailable,) = logged.events("ledger_unavailable")
    assert unavailable["route"] == "/api/internal/gateway/spend-commands"
    assert password not in logged.text

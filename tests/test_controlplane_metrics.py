"""The control plane's /metrics: every family named, labelled by bounded values only."""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta
from pathlib import Path

import httpx
import msgspec
from litestar import Litestar
from prometheus_client.parser import text_string_to_metric_families

import vkgate
from controlplane.app import create_app
from controlplane.db import Database
from controlplane.ledger.store import Ledger
from controlplane.settings import ControlPlaneSettings, LedgerLocation
from tests.conftest import Internal, World, serve_in_loop
from tests.support.api import ADMIN, create
from tests.support.clock import ManualClock
from tests.support.env import ADMIN_TOKEN
from tests.support.ledger import request, segment, ship
from vkgate.keys import key_sha256

RESOLVE = "/api/internal/gateway/resolve-key"
PREFIX = "vkgate_controlplane_"
README = Path(__file__).resolve().parents[1] / "README.md"


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of the sample `name` whose labels include `labels`, or None."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


async def scrape(client: httpx.AsyncClient) -> str:
    response = await client.get("/metrics")
    assert response.status_code == 200
    return response.text


async def exercise(client: httpx.AsyncClient, internal: Internal, world: World) -> None:
    """Admin, internal and spend calls of every outcome the metrics count."""
    await internal.call("POST", RESOLVE, {"key_sha256": key_sha256(world.key)})
    await internal.call("POST", RESOLVE, {"key_sha256": hashlib.sha256(b"nobody").hexdigest()})
    await internal.call("POST", RESOLVE, {"key_sha256": "not-hex"})
    config = f"/api/internal/gateway/config/{world.key_id}"
    etag = (await internal.call("GET", config)).headers["etag"]
    await internal.call("GET", config, headers={"If-None-Match": etag})
    await internal.call("GET", "/api/internal/gateway/config/vk_unknown0000")
    await internal.call("GET", "/api/internal/gateway/changes?since=0&timeout_s=0")

    shipped = segment(
        request(
            internal.clock.now() - timedelta(minutes=5),
            organization_id=world.org,
            project_id=world.project,
            virtual_key_id=world.key_id,
        )
    )
    for body in (shipped, shipped):  # the second time, a duplicate
        assert (await ship(client, internal.clock, body)).status_code == 200
    assert (await ship(client, internal.clock, b"{not json")).status_code == 400

    revoked = await client.post(f"/api/admin/virtual-keys/{world.key_id}/revoke", headers=ADMIN)
    assert revoked.status_code == 200, revoked.text
    await internal.call("POST", RESOLVE, {"key_sha256": key_sha256(world.key)})
    assert (await client.get("/no/such/route?key=vk-secret-in-a-query")).status_code == 404


async def test_every_metric_is_there_with_its_label_values(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    await exercise(client, internal, world)
    text = await scrape(client)

    def count(name: str, **labels: str) -> float | None:
        return sample(text, name, **labels)

    requests = "vkgate_controlplane_http_requests_total"
    assert count(requests, route="/api/admin/organizations", method="POST", status="201") == 1
    config = "/api/internal/gateway/config/{vk_id}"
    assert count(requests, route=config, method="GET", status="200") == 1
    assert count(requests, route=config, method="GET", status="304") == 1
    assert count(requests, route=config, method="GET", status="404") == 1
    assert count(requests, route="unmatched", method="GET", status="404") == 1
    duration = "vkgate_controlplane_http_request_duration_seconds_count"
    assert count(duration, route=config) == 3
    assert count(duration, route="/api/internal/gateway/changes") == 1

    resolve = "vkgate_controlplane_resolve_key_total"
    assert count(resolve, result="ok") == 1
    assert count(resolve, result="unknown") == 1
    assert count(resolve, result="invalid") == 1
    assert count(resolve, result="revoked") == 1
    configs = "vkgate_controlplane_config_total"
    assert count(configs, result="full") == 1
    assert count(configs, result="not_modified") == 1
    assert count(configs, result="refused") == 1

    segments = "vkgate_controlplane_spend_segments_total"
    assert count(segments, result="accepted") == 1
    assert count(segments, result="duplicate") == 1
    assert count(segments, result="rejected") == 1
    assert count("vkgate_controlplane_spend_records_total") == 2  # an admit and its confirm
    assert count("vkgate_controlplane_ledger_write_duration_seconds_count") == 2
    assert count("vkgate_controlplane_ledger_errors_total") == 0

    # As the last poll read it: the world's three events (the revoke came after it).
    assert count("vkgate_controlplane_feed_revision") == 3
    assert count("vkgate_controlplane_feed_waiting_polls") == 0
    mutations = "vkgate_controlplane_admin_mutations_total"
    assert count(mutations, resource_kind="organization", action="organization.create") == 1
    assert count(mutations, resource_kind="virtual_key", action="virtual_key.create") == 1
    assert count(mutations, resource_kind="virtual_key", action="virtual_key.revoke") == 1

    assert count("vkgate_controlplane_up") == 1
    assert count("vkgate_controlplane_build_info", version=vkgate.__version__) == 1


async def test_metric_names_are_prefixed_and_labels_carry_no_secret_or_id(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    token = (await create(client, "/api/admin/tokens", {"name": "ci", "role": "finance"}))["token"]
    await client.get("/api/admin/organizations", headers={"Authorization": f"Bearer {token}"})
    await client.get(f"/api/admin/virtual-keys/{world.key_id}", headers=ADMIN)
    await exercise(client, internal, world)
    text = await scrape(client)

    for family in text_string_to_metric_families(text):
        assert family.name.startswith(PREFIX), family.name
    secrets = {
        world.key,
        key_sha256(world.key),
        ADMIN_TOKEN,
        token,
        "sk-test-provider-credential-7d1f",
        "vk-secret-in-a-query",
    }
    ids = {world.org, world.team, world.project, world.provider, world.policy, world.key_id}
    for value in secrets | ids | {"vk_unknown0000", "/no/such/route"}:
        assert value not in text, value


async def test_a_ledger_outage_is_counted_and_timed(
    settings: ControlPlaneSettings, clock: ManualClock, clean_database: Database
) -> None:
    ledger = Ledger(LedgerLocation(kind="http", host="127.0.0.1", port=9, database="spend"))
    app: Litestar = create_app(settings, clock=clock, database=clean_database, ledger=ledger)
    try:
        async with serve_in_loop(app, "http://cp.test") as client:
            org = (await create(client, "/api/admin/organizations", {"name": "o"}))["id"]
            body = msgspec.json.encode(segment(request(clock.now(), organization_id=org)))
            assert (await ship(client, clock, body)).status_code == 503
            text = await scrape(client)
    finally:
        await ledger.close()
    assert sample(text, "vkgate_controlplane_ledger_errors_total") == 1
    assert sample(text, "vkgate_controlplane_ledger_write_duration_seconds_count") == 1
    assert sample(text, "vkgate_controlplane_spend_segments_total", result="accepted") is None


async def test_the_readme_documents_exactly_the_metrics_served(
    client: httpx.AsyncClient, internal: Internal, world: World
) -> None:
    await exercise(client, internal, world)
    served = {
        f"{family.name}_total" if family.type == "counter" else family.name
        for family in text_string_to_metric_families(await scrape(client))
        # prometheus_client adds a `_created` gauge beside each counter: a timestamp, not a metric.
        if family.name.startswith(PREFIX) and not family.name.endswith("_created")
    }
    assert documented_metrics("### Control plane metrics") == served


def documented_metrics(section: str) -> set[str]:
    """The metric names in the README's table under the heading `section`."""
    text = README.read_text()
    start = text.index(section)
    end = text.find("\n#", start + len(section))
    return set(re.findall(r"^\| `(vkgate_[a-z_]+)`", text[start:end], re.MULTILINE))

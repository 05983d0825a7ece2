"""`vkgate spend report|ledger`: finance's commands, against a real control plane process."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from tests.support.env import ADMIN_TOKEN, INTERNAL_SECRET
from tests.support.ledger import SPEND_COMMANDS, request, segment
from tests.support.processes import clean_env, sqlite_controlplane, vkgate
from vkgate import signing

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
DAY = datetime(2026, 3, 9, 10, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def controlplane_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A control plane on SQLite with its own embedded ledger, migrated by --migrate."""
    with sqlite_controlplane(tmp_path_factory.mktemp("spend-cli")) as service:
        yield service.url


def post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{url}{path}", json=body, headers=ADMIN)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


@pytest.fixture(scope="module")
def organization(controlplane_url: str) -> str:
    """An organization with two teams' spend on two models, shipped as a proxy ships it."""
    url = controlplane_url
    org = post(url, "/api/admin/organizations", {"name": "cli-spend"})["id"]
    teams = [post(url, "/api/admin/teams", {"organization_id": org, "name": n})["id"] for n in "ab"]
    provider = post(
        url,
        "/api/admin/providers",
        {
            "organization_id": org,
            "name": "vllm",
            "kind": "openai_compatible",
            "base_url": "http://vllm.internal/v1",
            "price_overrides": {
                "small": {"input_per_mtok": "1", "output_per_mtok": "2"},
                "large": {"input_per_mtok": "10", "output_per_mtok": "20"},
            },
        },
    )["id"]
    records = []
    for team, model, tokens in [(0, "small", 1000), (0, "large", 100), (1, "small", 10)]:
        records += request(
            DAY,
            organization_id=org,
            team_id=teams[team],
            model=model,
            served_model=model,
            provider_id=provider,
            provider_kind="openai_compatible",
            input_tokens=tokens,
            output_tokens=tokens,
        )
    body = msgspec.json.encode(segment(records))
    headers = signing.signed_headers(
        INTERNAL_SECRET, "POST", SPEND_COMMANDS, body, datetime.now(UTC).timestamp()
    )
    shipped = httpx.post(f"{url}{SPEND_COMMANDS}", content=body, headers=headers)
    assert shipped.status_code == 200, shipped.text
    assert shipped.json()["accepted"] == 6
    return org


def spend(url: str, tmp_path: Path, *args: str) -> str:
    env = clean_env(VKGATE_HOME=str(tmp_path / "empty-home"))
    result = vkgate("--url", url, "--token", ADMIN_TOKEN, "spend", *args, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return str(result.stdout)


def test_spend_report_groups_and_totals_as_a_table(
    controlplane_url: str, organization: str, tmp_path: Path
) -> None:
    out = spend(
        controlplane_url, tmp_path, "report", "--org", organization, "--group-by", "team,model"
    )
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["TEAM_ID", "MODEL", "REQUESTS"]
    assert len(lines) == 1 + 3 + 1
    assert lines[-1].split()[0] == "TOTAL"
    total = dict(zip(lines[0].split(), lines[-1].split(), strict=True))
    # 1000 * (1 + 2) + 100 * (10 + 20) + 10 * (1 + 2) micro-dollars
    assert total["COST_USD"] == "0.00603"
    # No request was answered from the response cache.
    assert (total["CACHE_HITS"], total["SAVED_USD"]) == ("0", "0")


def test_spend_report_as_csv_for_a_period(
    controlplane_url: str, organization: str, tmp_path: Path
) -> None:
    out = spend(
        controlplane_url, tmp_path, "report", "--org", organization, "--group-by", "model",
        "--from", "2026-03-09", "--to", "2026-03-10T00:00:00Z", "--csv",
    )  # fmt: skip
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["model"] for r in rows] == ["large", "small"]
    assert [r["cost_usd"] for r in rows] == ["0.003", "0.00303"]
    assert list(rows[0])[:2] == ["model", "requests"]

    empty = spend(
        controlplane_url,
        tmp_path,
        "report",
        "--org",
        organization,
        "--from",
        "2026-03-10",
        "--json",
    )
    assert json.loads(empty)["rows"] == []


def test_spend_ledger_prints_every_row(
    controlplane_url: str, organization: str, tmp_path: Path
) -> None:
    rows = json.loads(spend(controlplane_url, tmp_path, "ledger", "--org", organization, "--json"))
    assert len(rows) == 3
    assert {r["price_source"] for r in rows} == {"override"}
    table = spend(controlplane_url, tmp_path, "ledger", "--org", organization, "--limit", "2")
    assert len(table.splitlines()) == 3
    as_csv = list(csv.DictReader(io.StringIO(
        spend(controlplane_url, tmp_path, "ledger", "--org", organization, "--csv")
    )))  # fmt: skip
    assert sorted(r["id"] for r in as_csv) == sorted(r["id"] for r in rows)


def test_spend_report_refuses_an_unknown_group(
    controlplane_url: str, organization: str, tmp_path: Path
) -> None:
    env = clean_env(VKGATE_HOME=str(tmp_path))
    result = vkgate(
        "--url", controlplane_url, "--token", ADMIN_TOKEN,
        "spend", "report", "--org", organization, "--group-by", "colour",
        env=env,
    )  # fmt: skip
    assert result.returncode != 0
    assert "--group-by" in result.stderr and "colour" in result.stderr
    server_side = vkgate(
        "--url", controlplane_url, "--token", ADMIN_TOKEN,
        "spend", "report", "--org", organization, "--from", "soon",
        env=env,
    )  # fmt: skip
    assert server_side.returncode != 0
    assert "422 validation_error" in server_side.stderr and "(field: from)" in server_side.stderr


def test_spend_report_shows_audio_units_and_unpriced_requests(
    controlplane_url: str, tmp_path: Path
) -> None:
    url = controlplane_url
    org = post(url, "/api/admin/organizations", {"name": "cli-audio"})["id"]
    provider = post(
        url,
        "/api/admin/providers",
        {
            "organization_id": org,
            "name": "speech",
            "kind": "openai_compatible",
            "base_url": "http://speech.internal/v1",
            "price_overrides": {"my-whisper": {"per_second": "0.0001"}},
        },
    )["id"]
    records = []
    for model, fields in [
        ("my-whisper", {"audio_seconds": 12.345}),
        ("my-tts", {"input_characters": 40}),  # no price covers characters of this model
    ]:
        records += request(
            DAY,
            organization_id=org,
            model=model,
            served_model=model,
            provider_id=provider,
            provider_kind="openai_compatible",
            route="/v1/audio/transcriptions",
            **fields,
        )
    body = msgspec.json.encode(segment(records))
    headers = signing.signed_headers(
        INTERNAL_SECRET, "POST", SPEND_COMMANDS, body, datetime.now(UTC).timestamp()
    )
    assert httpx.post(f"{url}{SPEND_COMMANDS}", content=body, headers=headers).status_code == 200

    table = spend(url, tmp_path, "report", "--org", org, "--group-by", "model").splitlines()
    columns = table[0].split()
    assert {"INPUT_CHARACTERS", "AUDIO_SECONDS", "UNPRICED"} <= set(columns)
    assert "IMAGES" not in columns  # no row has images: the table leaves the column out
    total = dict(zip(columns[1:], table[-1].split()[1:], strict=True))
    assert (total["AUDIO_SECONDS"], total["UNPRICED"], total["COST_USD"]) == (
        "12.345",
        "1",
        "0.0012345",
    )
    rows = list(csv.DictReader(io.StringIO(spend(url, tmp_path, "report", "--org", org, "--csv"))))
    assert (rows[0]["unpriced"], rows[0]["images"], rows[0]["audio_seconds"]) == (
        "1",
        "0",
        "12.345",
    )

"""Finance reads: `GET /api/spend/report` and `GET /api/spend/ledger`, in JSON and CSV."""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.conftest import World
from tests.support.api import ADMIN, create, error_of
from tests.support.clock import ManualClock
from tests.support.ledger import (
    ledger_rows,
    nanos,
    record,
    request,
    segment,
    shipped,
    spend_report,
)
from vkgate.money import nanos_to_usd
from vkgate.spend import SpendRecord

Client = httpx.AsyncClient
REPORT = "/api/spend/report"
LEDGER = "/api/spend/ledger"
DAY1 = datetime(2026, 3, 8, 9, 30, tzinfo=UTC)
DAY2 = datetime(2026, 3, 9, 17, 45, tzinfo=UTC)
MEASURES = [
    "requests",
    "refused",
    "failed",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "input_audio_tokens",
    "output_audio_tokens",
    "input_image_tokens",
    "output_image_tokens",
    "input_characters",
    "images",
    "audio_seconds",
    "unpriced",
    "cost_usd",
]
CACHE_MEASURES = ["cache_hits", "saved_usd"]
"""After the cost: requests the response cache answered, and what they spared."""
COUNTED = MEASURES[3:-3]
"""The measures that are sums of a record's counts (audio seconds are a decimal string)."""
EMPTY = {"cost_usd": "0", "audio_seconds": "0.000", "saved_usd": "0"}
GROUP_FIELDS = {
    "team": "team_id",
    "project": "project_id",
    "virtual_key": "virtual_key_id",
    "model": "model",
    "served_model": "served_model",
    "provider": "provider_id",
    "end_user": "end_user",
    "day": "day",
}


async def mixed_traffic(client: Client, world: World, clock: ManualClock) -> list[SpendRecord]:
    """Two days of an organization's requests over two teams, keys, models and providers:
    served, refused and failed; priced at round override rates. Returns the outcomes."""
    org = world.org
    team_b = (await create(client, "/api/admin/teams", {"organization_id": org, "name": "b"}))["id"]
    project_b = (
        await create(
            client, "/api/admin/projects", {"organization_id": org, "team_id": team_b, "name": "b"}
        )
    )["id"]
    vllm = (
        await create(
            client,
            "/api/admin/providers",
            {
                "organization_id": org,
                "name": "vllm",
                "kind": "openai_compatible",
                "base_url": "http://vllm.internal/v1",
                "price_overrides": {
                    "llama": {"input_per_mtok": "0.2", "output_per_mtok": "0.8"},
                },
            },
        )
    )["id"]
    patched = await client.patch(
        f"/api/admin/providers/{world.provider}",
        json={"price_overrides": {"gpt-4o-mini": {"input_per_mtok": "1", "output_per_mtok": "3"}}},
        headers=ADMIN,
    )
    assert patched.status_code == 200
    a = {"team_id": world.team, "project_id": world.project, "virtual_key_id": world.key_id}
    b = {"team_id": team_b, "project_id": project_b, "virtual_key_id": "vk_b"}
    openai = {
        "provider_id": world.provider,
        "provider_kind": "openai",
        "model": "fast",
        "upstream_model": "gpt-4o-mini",
        "served_model": "gpt-4o-mini-2024-07-18",
    }
    llama = {
        "provider_id": vllm,
        "provider_kind": "openai_compatible",
        "model": "cheap",
        "upstream_model": "llama",
        "served_model": "llama",
    }
    specs: list[tuple[datetime, dict[str, Any]]] = [
        (DAY1, {**a, **openai, "end_user": "alice", "input_tokens": 1000, "output_tokens": 100}),
        (DAY1, {**a, **openai, "end_user": "bob", "input_tokens": 333, "output_tokens": 7}),
        (DAY1, {**b, **llama, "end_user": "alice", "input_tokens": 5000, "output_tokens": 500}),
        (DAY2, {**a, **llama, "input_tokens": 12, "output_tokens": 1, "reasoning_tokens": 1}),
        (
            DAY2,
            {**b, **openai, "input_tokens": 700, "cache_read_tokens": 300, "output_tokens": 9},
        ),
        (DAY2, {**b, "model": "fast", "kind": "fail", "status": 429, "refused": True}),
        (DAY2, {**a, **openai, "kind": "fail", "status": 502, "error_code": "provider_error"}),
    ]
    records: list[SpendRecord] = []
    for at, fields in specs:
        records += request(at, organization_id=org, **fields)
    await shipped(client, clock, segment(records))
    return [r for r in records if r.kind != "admit"]


def expected_groups(
    outcomes: list[SpendRecord], costs: dict[str, int], field: str
) -> dict[Any, dict[str, Any]]:
    groups: dict[Any, dict[str, Any]] = defaultdict(lambda: defaultdict(int))
    for r in outcomes:
        key = r.at[:10] if field == "day" else getattr(r, field)
        group = groups[key]
        group["requests"] += r.kind == "confirm"
        group["refused"] += r.kind == "fail" and r.refused
        group["failed"] += r.kind == "fail" and not r.refused
        for tokens in COUNTED:
            group[tokens] += getattr(r, tokens)
        group["audio_seconds"] = "0.000"
        group["cost_nanos"] += costs[r.id]
    return groups


@pytest.mark.parametrize("group_by", list(GROUP_FIELDS))
async def test_report_groups_by_each_field(
    client: Client, world: World, clock: ManualClock, group_by: str
) -> None:
    outcomes = await mixed_traffic(client, world, clock)
    costs = {r["id"]: nanos(r["cost_usd"]) for r in await ledger_rows(client, world.org)}
    field = GROUP_FIELDS[group_by]

    report = await spend_report(client, world.org, group_by=group_by)

    expected = expected_groups(outcomes, costs, field)
    assert len(report["rows"]) == len(expected)
    for row in report["rows"]:
        assert list(row) == [field, *MEASURES, *CACHE_MEASURES]
        want = expected[row[field]]
        assert {m: row[m] for m in MEASURES[:-1]} == {m: want[m] for m in MEASURES[:-1]}
        assert row["cost_usd"] == nanos_to_usd(want["cost_nanos"])


async def test_report_counts_served_refused_and_failed_apart_with_exact_totals(
    client: Client, world: World, clock: ManualClock
) -> None:
    await mixed_traffic(client, world, clock)
    report = await spend_report(client, world.org, group_by="team,model")

    totals = report["totals"]
    assert (totals["requests"], totals["refused"], totals["failed"]) == (5, 1, 1)
    assert totals["input_tokens"] == 1000 + 333 + 5000 + 12 + 700
    # Per million: 1000*1 + 100*3 + 333*1 + 7*3 + 700*1 + 9*3 = 2381 at the OpenAI override
    # (cache reads at the input rate), 5000*0.2 + 500*0.8 + 12*0.2 + 1*0.8 = 1403.2 at vLLM's.
    assert totals["cost_usd"] == "0.0037842"
    assert list(totals) == [*MEASURES, *CACHE_MEASURES]
    for measure in MEASURES[:-3]:
        assert totals[measure] == sum(r[measure] for r in report["rows"])
    assert nanos(totals["cost_usd"]) == sum(nanos(r["cost_usd"]) for r in report["rows"])


async def test_report_totals_equal_the_sum_of_the_ledger_rows_to_the_nano_dollar(
    client: Client, world: World, clock: ManualClock
) -> None:
    await mixed_traffic(client, world, clock)
    # Prices that are not whole nano-dollars per token: each row rounds once, the sum is exact.
    await client.patch(
        f"/api/admin/providers/{world.provider}",
        json={
            "price_overrides": {
                "gpt-4o-mini": {"input_per_mtok": "0.0375", "output_per_mtok": "0.1234567"}
            }
        },
        headers=ADMIN,
    )
    odd = [
        r
        for i in range(25)
        for r in request(
            DAY2,
            organization_id=world.org,
            provider_id=world.provider,
            provider_kind="openai",
            upstream_model="gpt-4o-mini",
            served_model="gpt-4o-mini",
            input_tokens=i * 7 + 1,
            output_tokens=i * 3 + 1,
        )
    ]
    await shipped(client, clock, segment(odd))

    rows = await ledger_rows(client, world.org, limit="7")
    report = await spend_report(client, world.org, group_by="day,provider")

    assert nanos(report["totals"]["cost_usd"]) == sum(nanos(r["cost_usd"]) for r in rows)
    for tokens in COUNTED:
        assert report["totals"][tokens] == sum(r[tokens] for r in rows)
    assert report["totals"]["requests"] == sum(r["kind"] == "confirm" for r in rows)


async def test_report_by_day_uses_utc_calendar_days(
    client: Client, world: World, clock: ManualClock
) -> None:
    await mixed_traffic(client, world, clock)
    report = await spend_report(client, world.org, group_by="day")
    assert [r["day"] for r in report["rows"]] == ["2026-03-08", "2026-03-09"]
    assert [r["requests"] for r in report["rows"]] == [3, 2]


async def test_report_without_group_by_is_one_row_and_empty_without_spend(
    client: Client, world: World, clock: ManualClock
) -> None:
    empty = await spend_report(client, world.org)
    assert empty["rows"] == []
    assert empty["totals"] == {m: EMPTY.get(m, 0) for m in [*MEASURES, *CACHE_MEASURES]}
    await mixed_traffic(client, world, clock)
    report = await spend_report(client, world.org)
    assert report["rows"] == [report["totals"]]


async def test_from_is_inclusive_and_to_exclusive(
    client: Client, world: World, clock: ManualClock
) -> None:
    start, end = datetime(2026, 3, 9, tzinfo=UTC), datetime(2026, 3, 10, tzinfo=UTC)
    tick = timedelta(microseconds=1)
    times = [start - tick, start, end - tick, end]
    await shipped(client, clock, segment([record(at=t, organization_id=world.org) for t in times]))

    by_date = await spend_report(client, world.org, **{"from": "2026-03-09", "to": "2026-03-10"})
    by_time = await spend_report(
        client, world.org, **{"from": "2026-03-09T00:00:00Z", "to": "2026-03-10T00:00:00.000Z"}
    )
    by_offset = await spend_report(
        client, world.org, **{"from": "2026-03-09T01:00:00+01:00", "to": "2026-03-10"}
    )
    to_the_tick = await spend_report(client, world.org, **{"from": "2026-03-09T23:59:59.999999Z"})

    assert by_date["totals"]["requests"] == 2
    assert by_time == by_offset == by_date
    assert to_the_tick["totals"]["requests"] == 2


async def test_report_as_csv_has_a_header_and_the_json_rows(
    client: Client, world: World, clock: ManualClock
) -> None:
    await mixed_traffic(client, world, clock)
    params = {"organization_id": world.org, "group_by": "team,end_user"}
    answer = await client.get(REPORT, params={**params, "format": "csv"}, headers=ADMIN)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/csv")
    assert "attachment" in answer.headers["content-disposition"]
    parsed = list(csv.reader(io.StringIO(answer.text)))
    assert parsed[0] == ["team_id", "end_user", *MEASURES, *CACHE_MEASURES]

    rows = (await spend_report(client, world.org, group_by="team,end_user"))["rows"]
    as_text = [["" if v is None else str(v) for v in row.values()] for row in rows]
    assert parsed[1:] == as_text


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"group_by": "team,colour"}, "group_by"),
        ({"group_by": "team,team"}, "group_by"),
        ({"from": "2026-03-10", "to": "2026-03-10"}, "from"),
        ({"from": "2026-03-11", "to": "2026-03-10"}, "from"),
        ({"from": "yesterday"}, "from"),
        ({"to": "2026-13-01"}, "to"),
        ({"from": "2026-03-01T00:00:00"}, "from"),
        ({"format": "xml"}, "format"),
    ],
)
async def test_bad_report_parameters_are_refused_naming_them(
    client: Client, world: World, params: dict[str, str], param: str
) -> None:
    response = await client.get(
        REPORT, params={"organization_id": world.org, **params}, headers=ADMIN
    )
    error_of(response, 422, "validation_error", param)


async def test_report_needs_an_existing_organization(client: Client) -> None:
    missing = await client.get(REPORT, headers=ADMIN)
    assert missing.status_code in (400, 422)
    assert missing.json()["error"]["param"] == "organization_id"
    unknown = await client.get(REPORT, params={"organization_id": "org_nope"}, headers=ADMIN)
    error_of(unknown, 404, "not_found", "organization_id")


async def test_report_shows_no_other_organizations_spend(
    client: Client, world: World, clock: ManualClock
) -> None:
    await mixed_traffic(client, world, clock)
    other = (await create(client, "/api/admin/organizations", {"name": "globex"}))["id"]
    assert (await spend_report(client, other))["rows"] == []
    assert await ledger_rows(client, other) == []


# --- ledger -------------------------------------------------------------------------------------


async def test_ledger_pages_walk_every_row_once_in_time_order(
    client: Client, world: World, clock: ManualClock
) -> None:
    outcomes = await mixed_traffic(client, world, clock)
    # Two rows at one instant: the cursor orders them by id.
    same = [r for _ in range(2) for r in request(DAY2, organization_id=world.org, input_tokens=1)]
    await shipped(client, clock, segment(same))

    pages: list[list[dict[str, Any]]] = []
    params = {"organization_id": world.org, "limit": "2"}
    while True:
        body = (await client.get(LEDGER, params=params, headers=ADMIN)).json()
        pages.append(body["data"])
        if body["next_cursor"] is None:
            break
        params["cursor"] = body["next_cursor"]

    rows = [r for page in pages for r in page]
    assert [len(p) for p in pages] == [2, 2, 2, 2, 1]
    assert len({r["id"] for r in rows}) == len(rows) == len(outcomes) + 2
    assert [(r["at"], r["id"]) for r in rows] == sorted((r["at"], r["id"]) for r in rows)


async def test_ledger_cursor_stays_valid_when_rows_arrive_later(
    client: Client, world: World, clock: ManualClock
) -> None:
    first = [r for _ in range(3) for r in request(DAY1, organization_id=world.org)]
    await shipped(client, clock, segment(first))
    page = (
        await client.get(LEDGER, params={"organization_id": world.org, "limit": "2"}, headers=ADMIN)
    ).json()
    later = [r for _ in range(2) for r in request(DAY2, organization_id=world.org)]
    await shipped(client, clock, segment(later))

    rest = (
        await client.get(
            LEDGER,
            params={"organization_id": world.org, "cursor": page["next_cursor"]},
            headers=ADMIN,
        )
    ).json()
    seen = [r["id"] for r in page["data"] + rest["data"]]
    assert len(seen) == len(set(seen)) == 5


async def test_ledger_filters_by_period_and_answers_csv_with_the_next_cursor(
    client: Client, world: World, clock: ManualClock
) -> None:
    await mixed_traffic(client, world, clock)
    params = {"organization_id": world.org, "from": "2026-03-09", "limit": "2", "format": "csv"}
    answer = await client.get(LEDGER, params=params, headers=ADMIN)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/csv")
    parsed = list(csv.DictReader(io.StringIO(answer.text)))
    assert len(parsed) == 2
    assert all(r["at"].startswith("2026-03-09") for r in parsed)
    assert {"id", "kind", "cost_usd", "price_source", "ingested_at"} <= set(parsed[0])
    assert answer.headers["x-vkgate-next-cursor"]
    last = await client.get(
        LEDGER,
        params={**params, "cursor": answer.headers["x-vkgate-next-cursor"], "limit": "10"},
        headers=ADMIN,
    )
    assert len(list(csv.DictReader(io.StringIO(last.text)))) == 2
    assert "x-vkgate-next-cursor" not in last.headers


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"limit": "0"}, "limit"),
        ({"limit": "5000"}, "limit"),
        ({"format": "parquet"}, "format"),
        ({"from": "2026-03-10", "to": "2026-03-01"}, "from"),
    ],
)
async def test_bad_ledger_parameters_are_refused_naming_them(
    client: Client, world: World, params: dict[str, str], param: str
) -> None:
    response = await client.get(
        LEDGER, params={"organization_id": world.org, **params}, headers=ADMIN
    )
    error_of(response, 422, "validation_error", param)


# --- who may read -------------------------------------------------------------------------------


async def test_finance_token_reads_spend_but_changes_nothing(
    client: Client, world: World, clock: ManualClock
) -> None:
    await mixed_traffic(client, world, clock)
    token = await create(client, "/api/admin/tokens", {"name": "books", "role": "finance"})
    finance = {"Authorization": f"Bearer {token['token']}"}

    report = await spend_report(client, world.org, headers=finance, group_by="model")
    assert report == await spend_report(client, world.org, group_by="model")
    assert len(await ledger_rows(client, world.org, headers=finance)) == 7

    budget = {
        "organization_id": world.org,
        "scope": {"kind": "organization"},
        "window": "month",
        "limit_usd": "1",
    }
    error_of(
        await client.post("/api/admin/budgets", json=budget, headers=finance), 403, "forbidden"
    )
    patched = await client.patch(
        f"/api/admin/providers/{world.provider}", json={"price_overrides": {}}, headers=finance
    )
    error_of(patched, 403, "forbidden")
    # Segments come from proxies, signed with the internal secret: no admin token will do.
    shipped_by_finance = await client.post(
        "/api/internal/gateway/spend-commands", json={}, headers=finance
    )
    error_of(shipped_by_finance, 401, "bad_signature")


async def test_spend_reads_need_a_token(client: Client, world: World) -> None:
    for path in (REPORT, LEDGER):
        response = await client.get(path, params={"organization_id": world.org})
        error_of(response, 401, "unauthorized")

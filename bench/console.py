"""Every web console page's time at the control plane, with 10,000 keys and a million ledger rows.

Seeds a fresh PostgreSQL database (10 organizations, each with 10 projects, a provider, a
policy, 1,000 keys with their secrets, 5 budgets (`--budgets`) and 1,000 audit entries) and a fresh embedded
chDB ledger (1,000,000 rows spread over this month, across the organizations, keys and four
models, on a ledger whose daily sums began before this month, as one in service), signs in to the
console in-process (httpx over ASGI: the control plane's own time, no network) and times each
page, printing a table of milliseconds. The goal is every page under 150 ms.

    .venv/bin/python bench/console.py [--rows 1000000] [--keys 10000] [--reads 20] [--budgets 5]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import re
import secrets
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg
import sqlalchemy as sa

from controlplane.app import create_app
from controlplane.ledger.client import connect
from controlplane.ledger.migrate import upgrade as upgrade_ledger
from controlplane.migrate import upgrade
from controlplane.models import (
    AuditEntry,
    Budget,
    Organization,
    Project,
    Provider,
    RoutingPolicy,
    RoutingTarget,
    Team,
    VirtualKey,
    VirtualKeySecret,
)
from controlplane.settings import ControlPlaneSettings, LedgerLocation

ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
ORGS = 10
PROJECTS = 10
MODELS = ("gpt-4o-mini", "gpt-4o", "claude-haiku", "llama-70b")
TOKEN = "bench-console-admin-token-0123456789abcdef"
ENV = {
    "VKGATE_INTERNAL_SECRET": "bench-internal-secret-0123456789abcdef",
    "VKGATE_JWT_SECRET": "bench-jwt-secret-0123456789abcdef0123",
    "VKGATE_KEY_PEPPER": "bench-key-pepper-0123456789abcdef0123",
    "VKGATE_ENCRYPTION_KEY": "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
    "VKGATE_ADMIN_TOKEN": TOKEN,
}


def seed_database(url: str, keys: int, now: datetime, budgets: int = 5) -> dict[str, str]:
    """The relational rows, in bulk; returns ids the timed pages open."""
    engine = sa.create_engine(url)
    per_org = keys // ORGS
    with engine.begin() as conn:
        for o in range(ORGS):
            org = f"org_bench{o:02d}"
            conn.execute(
                sa.insert(Organization), [{"id": org, "name": f"org {o}", "created_at": now}]
            )
            conn.execute(
                sa.insert(Team),
                [
                    {
                        "id": f"team_{o}",
                        "organization_id": org,
                        "name": "team",
                        "limits": {},
                        "created_at": now,
                    }
                ],
            )
            conn.execute(
                sa.insert(Project),
                [
                    {
                        "id": f"proj_{o}_{p}",
                        "organization_id": org,
                        "team_id": f"team_{o}",
                        "name": f"p{p}",
                        "created_at": now,
                    }
                    for p in range(PROJECTS)
                ],
            )
            conn.execute(
                sa.insert(Provider),
                [
                    {
                        "id": f"prov_{o}",
                        "organization_id": org,
                        "name": "main",
                        "kind": "mock",
                        "base_url": None,
                        "api_version": None,
                        "api_key_encrypted": None,
                        "header_names": [],
                        "headers_encrypted": None,
                        "price_overrides": {
                            m: {"input_per_mtok": "0.15", "output_per_mtok": "0.6"} for m in MODELS
                        },
                        "responses_api": True,
                        "settings": {},
                        "credentials_encrypted": None,
                        "created_at": now,
                        "updated_at": now,
                    }
                ],
            )
            conn.execute(
                sa.insert(RoutingPolicy),
                [
                    {
                        "id": f"pol_{o}",
                        "organization_id": org,
                        "name": "default",
                        "created_at": now,
                        "updated_at": now,
                    }
                ],
            )
            conn.execute(
                sa.insert(RoutingTarget),
                [
                    {
                        "policy_id": f"pol_{o}",
                        "alias": m,
                        "position": 0,
                        "provider_id": f"prov_{o}",
                        "model": m,
                    }
                    for m in MODELS
                ],
            )
            conn.execute(
                sa.insert(VirtualKey),
                [
                    {
                        "id": f"vk_{o}_{k:05d}",
                        "organization_id": org,
                        "project_id": f"proj_{o}_{k % PROJECTS}",
                        "name": f"key {k}",
                        "routing_policy_id": f"pol_{o}",
                        "allowed_models": None,
                        "limits": {"rpm": 600},
                        "metadata": {},
                        "status": "active",
                        "expires_at": None,
                        "revision": 1,
                        "created_at": now,
                        "updated_at": now,
                    }
                    for k in range(per_org)
                ],
            )
            conn.execute(
                sa.insert(VirtualKeySecret),
                [
                    {
                        "vk_id": f"vk_{o}_{k:05d}",
                        "key_hash": hashlib.sha256(f"{o}/{k}".encode()).hexdigest(),
                        "pepper_id": None,
                        "prefix": f"vk-{o}{k:05d}",
                        "created_at": now,
                        "valid_until": None,
                    }
                    for k in range(per_org)
                ],
            )
            conn.execute(
                sa.insert(Budget),
                [
                    {
                        "id": f"bud_{o}_{b}",
                        "organization_id": org,
                        "name": f"budget {b}",
                        "scope_kind": "organization" if b == 0 else "virtual_key",
                        "scope_id": None if b == 0 else f"vk_{o}_{b:05d}",
                        # Past the first five, windows of every kind: groups of their own.
                        "window": "month" if b < 5 else ("day", "week", "month")[b % 3],
                        "limit_nano_usd": 500 * 10**9,
                        "provider_id": None,
                        "on_breach": "block",
                        "created_at": now,
                        "updated_at": now,
                    }
                    for b in range(budgets)
                ],
            )
            conn.execute(
                sa.insert(AuditEntry),
                [
                    {
                        "at": now,
                        "actor": "env",
                        "action": "virtual_key.create",
                        "resource_kind": "virtual_key",
                        "resource_id": f"vk_{o}_{k:05d}",
                        "organization_id": org,
                        "details": {},
                    }
                    for k in range(1000)
                ],
            )
    engine.dispose()
    return {
        "org": "org_bench03",
        "provider": "prov_3",
        "policy": "pol_3",
        "budget": "bud_3_0",
        "key": "vk_3_00042",
        "project": "proj_3_4",
    }


def seed_ledger(
    location: LedgerLocation, rows: int, keys: int, month: datetime, now: datetime
) -> None:
    client = connect(location)
    try:
        span = int((now - month).total_seconds()) or 1
        per_org = keys // ORGS
        # A ledger installed before this month: both daily sums began (`since`) before it, so
        # reads of the month's windows need only them, as they do on a ledger in service.
        for table in ("ledger_spend_daily_since", "ledger_usage_daily_since"):
            client.command(
                f"INSERT INTO {table} SELECT toDateTime64('{month:%Y-%m-%d}', 6, 'UTC') "
                "- toIntervalDay(2)"
            )
        client.command(
            "INSERT INTO ledger_rows (id, kind, replica_id, seq, segment_id, request_id, at, route, "
            "organization_id, team_id, project_id, virtual_key_id, model, upstream_model, "
            "served_model, provider_id, provider_kind, status, refused, usage_source, latency_ms, "
            "input_tokens, output_tokens, cost_nano_usd, price_source, price_version, ingested_at) "
            "SELECT toString(generateUUIDv4()), if(number % 50 = 0, 'fail', 'confirm'), 'bench', "
            "number, 'seg', toString(number), "
            f"toDateTime64('{month:%Y-%m-%d %H:%M:%S}', 6, 'UTC') + "
            f"toIntervalSecond(intDiv(number * {span}, {rows})), '/v1/chat/completions', "
            f"concat('org_bench', leftPad(toString(number % {ORGS}), 2, '0')), "
            f"concat('team_', toString(number % {ORGS})), "
            f"concat('proj_', toString(number % {ORGS}), '_', toString(intDiv(number, {ORGS}) % {PROJECTS})), "
            f"concat('vk_', toString(number % {ORGS}), '_', leftPad(toString(intDiv(number, {ORGS}) % {per_org}), 5, '0')), "
            f"arrayElement({list(MODELS)}, 1 + number % {len(MODELS)}) AS m, m, m, "
            f"concat('prov_', toString(number % {ORGS})), 'mock', if(number % 50 = 0, 429, 200), "
            "number % 100 = 0, 'provider', 10.0, 1000 + number % 500, 200 + number % 50, "
            "if(number % 50 = 0, 0, 270000 + number % 1000), 'override', 'v1', "
            "now64(6, 'UTC') "
            f"FROM numbers({rows}) SETTINGS max_insert_block_size=100000"
        )
    finally:
        client.close()


PAGES = [
    ("Overview", "/console/"),
    ("Organizations", "/console/organizations"),
    ("Teams", "/console/teams"),
    ("Projects", "/console/projects"),
    ("Virtual keys", "/console/keys"),
    ("Virtual keys, filtered", "/console/keys?project_id={project}&status=active"),
    ("Virtual keys, page 3", None),
    ("Revoke confirmation", "/console/keys/{key}/revoke"),
    ("Providers", "/console/providers"),
    ("Provider", "/console/providers/{provider}"),
    ("Routing policies", "/console/policies"),
    ("Routing policy", "/console/policies/{policy}"),
    ("Budgets", "/console/budgets"),
    ("Budget (burn-down)", "/console/budgets/{budget}"),
    ("Spend (by model)", "/console/spend?organization_id={org}"),
    ("Spend (by day, key)", "/console/spend?organization_id={org}&group_by=day,virtual_key"),
    ("Spend CSV (by key)", "/console/spend.csv?organization_id={org}&group_by=virtual_key"),
    ("Audit log", "/console/audit"),
    ("Tokens", "/console/tokens"),
]


async def measure(
    settings: ControlPlaneSettings, ids: dict[str, str], reads: int
) -> list[tuple[str, list[float], list[float]]]:
    app = create_app(settings)
    results: list[tuple[str, list[float], list[float]]] = []
    async with (
        app.lifespan(),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://bench.test"
        ) as client,
    ):
        form = await client.get("/console/sign-in")
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
        assert csrf
        signed = await client.post(
            "/console/sign-in", data={"csrf_token": csrf.group(1), "token": TOKEN}
        )
        assert signed.status_code == 303, signed.text
        first = await client.get("/console/keys")
        cursor = None
        for _ in range(2):
            found = re.search(r"cursor=([^\"&]+)", first.text)
            assert found
            cursor = found.group(1)
            first = await client.get(f"/console/keys?cursor={cursor}")
        for name, template in PAGES:
            path = f"/console/keys?cursor={cursor}" if template is None else template.format(**ids)
            times, cpu = [], []
            for _ in range(reads + 2):
                started, used = time.perf_counter(), time.process_time()
                response = await client.get(path)
                times.append((time.perf_counter() - started) * 1000)
                cpu.append((time.process_time() - used) * 1000)
                assert response.status_code == 200, (path, response.status_code)
            results.append((name, times[2:], cpu[2:]))  # the first two warm caches
        # The overview's daily sums and the report's FINAL read agree on an organization.
        overview = (await client.get("/console/")).text
        spend = (await client.get(f"/console/spend?organization_id={ids['org']}")).text
        total = re.search(r"(\$[0-9.]+)</td>\s*</tr></tfoot>", spend)
        assert total, "no total on the Spend page"
        assert total.group(1) in overview, f"the overview does not show {total.group(1)}"
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--reads", type=int, default=20)
    parser.add_argument(
        "--budgets", type=int, default=5, help="budgets an organization (the Overview weighs 500)"
    )
    args = parser.parse_args()
    name = f"vkgate_bench_console_{secrets.token_hex(4)}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    try:
        with tempfile.TemporaryDirectory() as home:
            location = LedgerLocation(kind="chdb", path=Path(home) / "ledger")
            now = datetime.now(UTC)
            month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
            upgrade(url)
            upgrade_ledger(location)
            started = time.perf_counter()
            ids = seed_database(url, args.keys, now - timedelta(days=1), args.budgets)
            seed_ledger(location, args.rows, args.keys, month, now)
            print(
                f"seeded {args.keys:,} keys and {args.rows:,} ledger rows in {time.perf_counter() - started:.1f} s"
            )
            settings = dataclasses.replace(
                ControlPlaneSettings.from_env({**ENV, "VKGATE_DATABASE_URL": url}), ledger=location
            )
            results = asyncio.run(measure(settings, ids, args.reads))
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(
        f"\n{args.keys:,} keys, {args.rows:,} ledger rows, {args.budgets * ORGS} budgets; "
        f"{args.reads} reads a page, ms\n"
    )
    # Wall time on a shared machine moves with its load; CPU time (the process's, chDB's
    # threads included) is what the page itself costs.
    print(f"| {'page':<24} | {'min':>6} | {'p50':>6} | {'p95':>6} | {'CPU p50':>7} |")
    print(f"|{'-' * 26}|{'-' * 8}|{'-' * 8}|{'-' * 8}|{'-' * 9}|")
    for page, times, cpu in results:
        ordered = sorted(times)
        p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
        print(
            f"| {page:<24} | {ordered[0]:6.1f} | {statistics.median(times):6.1f} | {p95:6.1f} "
            f"| {statistics.median(cpu):7.1f} |"
        )


if __name__ == "__main__":
    main()

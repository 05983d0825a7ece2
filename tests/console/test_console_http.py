"""The console's sessions, CSRF and authorization over HTTP, on SQLite and on PostgreSQL: the
same rules as the admin API, since the console calls the same services."""

from __future__ import annotations

import csv
import dataclasses
import io
import re
from collections.abc import AsyncIterator
from html.parser import HTMLParser

import httpx
import pytest
from litestar import Litestar

from controlplane.app import create_app
from controlplane.console.views import spend as spend_view
from controlplane.db import Database
from controlplane.ledger.queries import GROUPS
from controlplane.settings import ControlPlaneSettings
from tests.conftest import World, seed_world, serve_in_loop
from tests.console.support import CSRF, csrf_of, post_form, sign_in
from tests.support.api import ADMIN, create
from tests.support.clock import ManualClock
from tests.support.env import ADMIN_TOKEN
from tests.test_spend_report import mixed_traffic

Client = httpx.AsyncClient


@pytest.fixture
def app(settings: ControlPlaneSettings, clock: ManualClock, clean_database: Database) -> Litestar:
    throttled = dataclasses.replace(settings, admin_auth_failures_per_minute=3)
    return create_app(throttled, clock=clock, database=clean_database)


@pytest.fixture
async def browser(app: Litestar, client: Client) -> AsyncIterator[Client]:
    """A second client with a cookie jar of its own: the console's user. The app runs once,
    under `client`'s lifespan; a second lifespan would start a second feed listener."""
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://controlplane.test"
    ) as http:
        yield http


async def token(client: Client, role: str, organization_id: str | None = None) -> str:
    body = {"name": f"{role}-{organization_id}", "role": role}
    if organization_id:
        body["organization_id"] = organization_id
    made = await create(client, "/api/admin/tokens", body)
    secret: str = made["token"]
    return secret


async def keys_of(client: Client, org: str) -> list[dict[str, str]]:
    listed = await client.get(f"/api/admin/virtual-keys?organization_id={org}", headers=ADMIN)
    data: list[dict[str, str]] = listed.json()["data"]
    return data


async def test_sign_in_opens_a_session_cookie_only_the_console_sees_and_sign_out_ends_it(
    browser: Client,
) -> None:
    form = await browser.get("/console/sign-in")
    assert 'for="token">Token</label>' in form.text and ">Sign in</button>" in form.text
    signed = await browser.post(
        "/console/sign-in", data={"csrf_token": csrf_of(form), "token": ADMIN_TOKEN}
    )
    cookie = next(
        v for k, v in signed.headers.multi_items() if k == "set-cookie" and "vkgate_console=" in v
    )
    attributes = {part.strip().lower() for part in cookie.split(";")}
    assert {"httponly", "samesite=strict", "path=/console"} <= attributes
    assert "secure" not in attributes  # plain HTTP here; Secure under TLS
    assert ADMIN_TOKEN not in cookie

    overview = await browser.get("/console/")
    assert overview.status_code == 200
    assert "<h1>Overview</h1>" in overview.text
    assert "Times are UTC" in overview.text
    policy = overview.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "script-src 'self'" in policy
    assert "unsafe-inline" not in policy
    assert overview.headers["x-frame-options"] == "DENY"
    assert overview.headers["cache-control"] == "no-store"

    out = await post_form(browser, "/console/sign-out", csrf_of(overview))
    assert out.status_code == 303
    after = await browser.get("/console/")
    assert after.status_code == 303
    assert after.headers["location"] == "/console/sign-in"


@pytest.mark.parametrize("trusted", [(), ("127.0.0.0/8",)])
async def test_the_cookies_are_secure_under_tls_and_behind_a_trusted_tls_proxy(
    settings: ControlPlaneSettings,
    clock: ManualClock,
    clean_database: Database,
    trusted: tuple[str, ...],
) -> None:
    app = create_app(
        dataclasses.replace(settings, trusted_proxy_cidrs=trusted),
        clock=clock,
        database=clean_database,
    )

    async def cookie(base_url: str, headers: dict[str, str]) -> set[str]:
        """The attributes of the cookie the sign-in form sets (the session's are alike)."""
        async with serve_in_loop(app, base_url) as http:
            form = await http.get("/console/sign-in", headers=headers)
            return {part.strip().lower() for part in form.headers["set-cookie"].split(";")}

    assert "secure" in await cookie("https://controlplane.test", {})
    behind = await cookie("http://controlplane.test", {"X-Forwarded-Proto": "https"})
    # Only a proxy the settings trust may say the browser used TLS.
    assert ("secure" in behind) is bool(trusted)


async def test_a_wrong_token_is_refused_without_saying_why_and_the_throttle_applies(
    browser: Client,
) -> None:
    for presented in ("not-a-token", ADMIN_TOKEN[:-1] + "x", "tok_missing-0123456789"):
        form = await browser.get("/console/sign-in")
        refused = await browser.post(
            "/console/sign-in", data={"csrf_token": csrf_of(form), "token": presented}
        )
        assert refused.status_code == 401
        assert "Sign-in failed." in refused.text
        assert "vkgate_console=" not in refused.headers.get("set-cookie", "")
    form = await browser.get("/console/sign-in")
    throttled = await browser.post(
        "/console/sign-in", data={"csrf_token": csrf_of(form), "token": ADMIN_TOKEN}
    )
    assert throttled.status_code == 429
    assert int(throttled.headers["retry-after"]) > 0


async def test_sign_in_without_the_forms_own_token_is_refused(browser: Client) -> None:
    refused = await browser.post("/console/sign-in", data={"token": ADMIN_TOKEN})
    assert refused.status_code == 403
    assert "vkgate_console=" not in refused.headers.get("set-cookie", "")


async def test_posts_without_the_sessions_csrf_token_are_refused_and_change_nothing(
    client: Client, browser: Client
) -> None:
    csrf = await sign_in(browser, ADMIN_TOKEN)
    teams = await browser.get("/console/teams")
    assert set(CSRF.findall(teams.text)) == {csrf}  # every form of the page carries it
    for sent in (None, "forged-" + csrf[:10]):
        refused = await post_form(browser, "/console/organizations", sent, name="acme")
        assert refused.status_code == 403
        assert "CSRF" in refused.text
    listed = await client.get("/api/admin/organizations", headers=ADMIN)
    assert listed.json()["data"] == []
    made = await post_form(browser, "/console/organizations", csrf, name="acme")
    assert made.status_code == 303
    # htmx sends it as a header instead (the page's hx-headers).
    by_header = await browser.post(
        "/console/organizations", data={"name": "beta"}, headers={"X-CSRF-Token": csrf}
    )
    assert by_header.status_code == 303
    listed = await client.get("/api/admin/organizations", headers=ADMIN)
    assert sorted(o["name"] for o in listed.json()["data"]) == ["acme", "beta"]


async def test_an_idle_session_expires_and_an_active_one_does_not(
    browser: Client, clock: ManualClock
) -> None:
    await sign_in(browser, ADMIN_TOKEN)
    for _ in range(3):  # used every 20 minutes: an hour in all, still signed in
        clock.elapse(20 * 60)
        assert (await browser.get("/console/keys")).status_code == 200
    clock.elapse(30 * 60)
    expired = await browser.get("/console/keys")
    assert expired.status_code == 303
    # The browser is told its session ended, and forgets the cookie.
    assert expired.headers["location"] == "/console/sign-in?ended=1"
    assert 'vkgate_console=""' in expired.headers["set-cookie"]
    notice = await browser.get(expired.headers["location"])
    assert "Your session ended" in notice.text
    assert "Your session ended" not in (await browser.get("/console/sign-in")).text
    again = await browser.get("/console/")
    assert (again.status_code, again.headers["location"]) == (303, "/console/sign-in")
    # htmx is told to load the page, not to swap it into the part it asked for.
    await sign_in(browser, ADMIN_TOKEN)
    clock.elapse(30 * 60)
    partial = await browser.get(
        "/console/keys", headers={"HX-Request": "true", "HX-Target": "keys-table"}
    )
    assert (partial.status_code, partial.text) == (401, "")
    assert partial.headers["hx-redirect"] == "/console/sign-in?ended=1"


async def test_revoking_the_token_ends_its_console_sessions(
    client: Client, browser: Client
) -> None:
    secret = await token(client, "admin")
    await sign_in(browser, secret)
    listed = (await client.get("/api/admin/tokens", headers=ADMIN)).json()["data"]
    revoked = await client.post(f"/api/admin/tokens/{listed[0]['id']}/revoke", headers=ADMIN)
    assert revoked.status_code == 200
    assert (await browser.get("/console/")).status_code == 303


async def test_a_finance_token_sees_spend_and_no_mutation_control_and_its_posts_are_403(
    client: Client, browser: Client, world: World
) -> None:
    csrf = await sign_in(browser, await token(client, "finance"))
    for path in (
        "/console/",
        "/console/organizations",
        "/console/teams",
        "/console/projects",
        "/console/keys",
        "/console/providers",
        "/console/policies",
        "/console/budgets",
        f"/console/spend?organization_id={world.org}",
        "/console/audit",
    ):
        page = await browser.get(path)
        assert page.status_code == 200, (path, page.text)
        assert 'method="post"' not in page.text.replace(
            'method="post" action="/console/sign-out"', ""
        ), path
    assert "Download CSV" in (await browser.get(f"/console/spend?organization_id={world.org}")).text
    assert (await browser.get("/console/tokens")).status_code == 403
    assert (await browser.get(f"/console/keys/{world.key_id}/revoke")).status_code == 403

    before = await keys_of(client, world.org)
    forged = [
        (
            "/console/keys",
            {"project_id": world.project, "name": "x", "routing_policy_id": world.policy},
        ),
        (f"/console/keys/{world.key_id}/revoke", {}),
        (f"/console/keys/{world.key_id}/disable", {}),
        ("/console/organizations", {"name": "evil"}),
        ("/console/tokens", {"name": "t", "role": "admin"}),
    ]
    for path, fields in forged:
        refused = await post_form(browser, path, csrf, **fields)
        assert refused.status_code == 403, path
    assert await keys_of(client, world.org) == before


async def test_an_organization_bound_token_sees_only_its_organization(
    client: Client, browser: Client
) -> None:
    ours = await seed_world(client, name="ours")
    theirs = await seed_world(client, name="theirs")
    csrf = await sign_in(browser, await token(client, "admin", ours.org))

    keys = await browser.get("/console/keys")
    assert ours.key_id in keys.text and theirs.key_id not in keys.text
    providers = await browser.get("/console/providers")
    assert ours.provider in providers.text and theirs.provider not in providers.text
    for path in (
        f"/console/providers/{theirs.provider}",
        f"/console/policies/{theirs.policy}",
        f"/console/keys/{theirs.key_id}/revoke",
        f"/console/spend?organization_id={theirs.org}",
        f"/console/spend.csv?organization_id={theirs.org}",
    ):
        assert (await browser.get(path)).status_code == 404, path
    for path, fields in (
        (f"/console/keys/{theirs.key_id}/revoke", {}),
        (f"/console/providers/{theirs.provider}", {"name": "mine-now"}),
        ("/console/projects", {"organization_id": theirs.org, "name": "sneaky"}),
    ):
        assert (await post_form(browser, path, csrf, **fields)).status_code == 404, path
    assert [k["status"] for k in await keys_of(client, theirs.org)] == ["active"]
    # Its own organization's keys it may revoke.
    assert (
        await post_form(browser, f"/console/keys/{ours.key_id}/revoke", csrf)
    ).status_code == 303
    assert [k["status"] for k in await keys_of(client, ours.org)] == ["revoked"]
    assert (await browser.get("/console/tokens")).status_code == 403
    assert ">Tokens<" not in keys.text


async def test_a_key_made_in_the_console_is_shown_once_and_listed_without_its_secret(
    client: Client, browser: Client, world: World
) -> None:
    csrf = await sign_in(browser, ADMIN_TOKEN)
    made = await post_form(
        browser,
        "/console/keys",
        csrf,
        project_id=world.project,
        name="from-console",
        routing_policy_id=world.policy,
        allowed_models="fast",
        rpm="60",
        expires_at="2030-01-01T00:00",
    )
    assert made.status_code == 200, made.text
    assert "it will not be shown again" in made.text
    assert made.headers["cache-control"] == "no-store"
    secret = re.search(r'value="(vk-[^"]+)"', made.text)
    assert secret
    listed = await browser.get("/console/keys")
    assert "from-console" in listed.text and secret.group(1) not in listed.text
    fragment = await browser.get(
        "/console/keys?status=active", headers={"HX-Request": "true", "HX-Target": "keys-table"}
    )
    assert "<html" not in fragment.text and "<table>" in fragment.text
    assert "from-console" in fragment.text
    key = next(k for k in await keys_of(client, world.org) if k["name"] == "from-console")
    assert key["allowed_models"] == ["fast"]
    assert key["limits"] == {"rpm": 60}
    assert key["expires_at"] == "2030-01-01T00:00:00Z"


async def test_bad_form_input_is_refused_naming_the_field(
    client: Client, browser: Client, world: World
) -> None:
    csrf = await sign_in(browser, ADMIN_TOKEN)
    refused = await post_form(
        browser,
        "/console/budgets",
        csrf,
        organization_id=world.org,
        scope_kind="organization",
        window="month",
        limit_usd="ten dollars",
    )
    assert refused.status_code == 422
    assert "limit_usd" in refused.text
    refused = await post_form(
        browser,
        "/console/keys",
        csrf,
        project_id=world.project,
        name="x",
        routing_policy_id=world.policy,
        rpm="sixty",
    )
    assert refused.status_code == 422
    assert "Requests a minute must be a whole number" in refused.text
    budgets = await client.get(f"/api/admin/budgets?organization_id={world.org}", headers=ADMIN)
    assert budgets.json()["data"] == []


async def test_spend_shows_the_reports_figures_and_its_csv_is_the_apis(
    client: Client, browser: Client, world: World, clock: ManualClock
) -> None:
    await mixed_traffic(client, world, clock)
    await sign_in(browser, ADMIN_TOKEN)
    query = f"organization_id={world.org}&from=2026-03-01&to=2026-03-11&group_by=team,model"
    api = await client.get(f"/api/spend/report?{query}&format=csv", headers=ADMIN)
    console = await browser.get(f"/console/spend.csv?{query}")
    assert console.status_code == 200
    assert console.headers["content-type"].startswith("text/csv")
    assert console.content == api.content

    report = (await client.get(f"/api/spend/report?{query}", headers=ADMIN)).json()
    page = await browser.get(
        f"/console/spend?organization_id={world.org}&from=2026-03-01&to=2026-03-11"
        "&group_by=team&group_by=model"
    )
    assert page.status_code == 200
    # Every cell of the table and of its total row is the report's figure.
    measures = ["requests", "refused", "failed", "unpriced"]
    measures += ["input_tokens", "output_tokens", "cache_read_tokens"]

    def cells(row: dict[str, object], groups: list[str]) -> list[str]:
        shown = [str(row[g]) if row[g] is not None else "(none)" for g in groups]
        counts = [f"{int(str(row[m])):,}" for m in measures]
        hits = f"{int(str(row['cache_hits'])):,}"
        return [*shown, *counts, f"${row['cost_usd']}", hits, f"${row['saved_usd']}"]

    body, foot = _table_cells(page.text)
    assert body == [cells(r, ["team_id", "model"]) for r in report["rows"]]
    assert foot == [[f"Total of all {len(report['rows'])} rows", *cells(report["totals"], [])]]
    assert any(int(r["refused"]) for r in report["rows"])  # the traffic has every kind
    assert any(int(r["failed"]) for r in report["rows"])
    assert "<svg" in page.text and "Spend by day, stacked by team" in page.text
    rows = list(csv.DictReader(io.StringIO(console.text)))
    assert len(rows) == len(report["rows"])

    overview = await browser.get("/console/")
    assert "acme" in overview.text
    assert f"${report['totals']['cost_usd']}<" in overview.text


@pytest.mark.parametrize("group_by", ["day,model", "model,team", ""])
async def test_the_spend_tables_pages_together_are_the_reports_rows(
    client: Client,
    browser: Client,
    world: World,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    group_by: str,
) -> None:
    monkeypatch.setattr(spend_view, "TABLE_ROWS", 2)
    await mixed_traffic(client, world, clock)
    await sign_in(browser, ADMIN_TOKEN)
    query = f"organization_id={world.org}&from=2026-03-01&to=2026-03-11&group_by={group_by}"
    report = (await client.get(f"/api/spend/report?{query}", headers=ADMIN)).json()
    groups = [GROUPS[g][0] for g in group_by.split(",") if g]
    seen: list[list[str]] = []
    path: str | None = f"/console/spend?{query}&grouped=1"
    while path is not None:
        page = await browser.get(path)
        assert page.status_code == 200, page.text
        body, foot = _table_cells(page.text)
        assert len(body) <= 2
        seen += body
        assert foot[0][-3] == f"${report['totals']['cost_usd']}"
        found = re.search(r'href="([^"]+)">Next rows', page.text)
        path = found.group(1).replace("&amp;", "&") if found else None
    assert len(report["rows"]) > 2 or not groups
    assert [[*r[: len(groups)], r[-3]] for r in seen] == [
        [*(str(row[g]) if row[g] is not None else "(none)" for g in groups), f"${row['cost_usd']}"]
        for row in report["rows"]
    ]
    past = len(report["rows"]) + 1
    beyond = await browser.get(f"/console/spend?{query}&grouped=1&offset={past}")
    assert beyond.status_code == 422 and "offset" in beyond.text


async def test_the_consoles_edits_reach_the_admin_api(
    client: Client, browser: Client, world: World
) -> None:
    csrf = await sign_in(browser, ADMIN_TOKEN)

    async def api(path: str) -> dict[str, object]:
        answered = await client.get(path, headers=ADMIN)
        assert answered.status_code == 200, answered.text
        found: dict[str, object] = answered.json()
        return found

    limits = await post_form(browser, f"/console/teams/{world.team}/limits", csrf, rpm="30", tpm="")
    assert limits.status_code == 303
    assert (await api(f"/api/admin/teams/{world.team}"))["limits"] == {"rpm": 30}

    edited = await post_form(
        browser,
        f"/console/providers/{world.provider}",
        csrf,
        name="openai-renamed",
        base_url="https://api.openai.com/v1",
        api_key="",
        price_overrides="gpt-4o-mini 0.15 0.6\r\n",
        prices_shown="",
    )
    assert edited.status_code == 303, edited.text
    provider = await api(f"/api/admin/providers/{world.provider}")
    assert provider["name"] == "openai-renamed"
    assert provider["has_api_key"] is True  # a blank field keeps the credential
    assert provider["price_overrides"] == {
        "gpt-4o-mini": {"input_per_mtok": "0.15", "output_per_mtok": "0.6"}
    }
    page = await browser.get(f"/console/providers/{world.provider}")
    assert "sk-test-provider-credential" not in page.text and "Credential: <strong>set" in page.text

    chains = await post_form(
        browser,
        f"/console/policies/{world.policy}",
        csrf,
        name="default",
        aliases=f"fast = openai-renamed:gpt-4o-mini, {world.provider}:gpt-4o\nslow = openai-renamed:o1",
    )
    assert chains.status_code == 303, chains.text
    aliases = (await api(f"/api/admin/routing-policies/{world.policy}"))["aliases"]
    assert aliases == {
        "fast": [
            {"provider_id": world.provider, "model": "gpt-4o-mini"},
            {"provider_id": world.provider, "model": "gpt-4o"},
        ],
        "slow": [{"provider_id": world.provider, "model": "o1"}],
    }
    unknown = await post_form(
        browser, f"/console/policies/{world.policy}", csrf, name="default", aliases="x = nope:m"
    )
    assert unknown.status_code == 422 and "no provider &#39;nope&#39;" in unknown.text

    budget = await post_form(
        browser,
        "/console/budgets",
        csrf,
        organization_id=world.org,
        name="monthly",
        scope_kind="organization",
        window="month",
        limit_usd="25",
        on_breach="block",
    )
    assert budget.status_code == 303
    budget_id = budget.headers["location"].rsplit("/", 1)[1]
    assert (
        await post_form(browser, f"/console/budgets/{budget_id}", csrf, limit_usd="40.5")
    ).status_code == 303
    assert (await api(f"/api/admin/budgets/{budget_id}"))["limit_usd"] == "40.5"
    detail = await browser.get(f"/console/budgets/{budget_id}")
    assert "$40.5" in detail.text and "not this window" in detail.text and "<svg" in detail.text

    key = world.key_id
    assert (await post_form(browser, f"/console/keys/{key}/disable", csrf)).status_code == 303
    assert (await api(f"/api/admin/virtual-keys/{key}"))["status"] == "disabled"
    assert (await post_form(browser, f"/console/keys/{key}/enable", csrf)).status_code == 303
    assert (await api(f"/api/admin/virtual-keys/{key}"))["status"] == "active"
    rotated = await post_form(browser, f"/console/keys/{key}/rotate", csrf, grace_seconds="3600")
    assert rotated.status_code == 200
    assert (
        "it will not be shown again" in rotated.text
        and "The old key keeps working until" in rotated.text
    )
    assert re.search(r'value="vk-[^"]+"', rotated.text)

    made = await post_form(browser, "/console/tokens", csrf, name="reader", role="finance")
    secret = re.search(r'id="new-token" type="text" readonly value="([^"]+)"', made.text)
    assert made.status_code == 200 and secret
    tokens = (await api("/api/admin/tokens"))["data"]
    assert isinstance(tokens, list)
    (reader,) = [t for t in tokens if t["name"] == "reader"]
    assert reader["role"] == "finance"
    assert (
        await post_form(browser, f"/console/tokens/{reader['id']}/revoke", csrf)
    ).status_code == 303
    assert (await api("/api/admin/tokens"))["data"][0]["revoked_at"] is not None

    audit = await browser.get("/console/audit?resource_kind=virtual_key")
    assert "virtual_key.rotate" in audit.text and "budget.create" not in audit.text


class _Cells(HTMLParser):
    """The text of each cell of a page's table, by row, in its body and in its foot."""

    def __init__(self) -> None:
        super().__init__()
        self.body: list[list[str]] = []
        self.foot: list[list[str]] = []
        self._part: list[list[str]] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("tbody", "tfoot"):
            self._part = self.body if tag == "tbody" else self.foot
        elif tag == "tr" and self._part is not None:
            self._part.append([])
        elif tag == "td" and self._part is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("tbody", "tfoot"):
            self._part = None
        elif tag == "td" and self._part is not None and self._cell is not None:
            self._part[-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def _table_cells(page: str) -> tuple[list[list[str]], list[list[str]]]:
    parser = _Cells()
    parser.feed(page)
    return parser.body, parser.foot


class _Fields(HTMLParser):
    """Every form field of a page, and whether a label names it."""

    def __init__(self) -> None:
        super().__init__()
        self.labelled: set[str] = set()
        self.fields: list[tuple[str, str | None, bool]] = []
        self._in_label = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "label":
            self._in_label += 1
            if found.get("for"):
                self.labelled.add(str(found["for"]))
        elif tag in ("input", "select", "textarea") and found.get("type") != "hidden":
            named = self._in_label > 0 or bool(found.get("aria-label"))
            self.fields.append((tag, found.get("id"), named))

    def handle_endtag(self, tag: str) -> None:
        if tag == "label":
            self._in_label -= 1


async def test_every_field_of_every_page_has_a_label(browser: Client, world: World) -> None:
    await sign_in(browser, ADMIN_TOKEN)
    for path in (
        "/console/sign-in",
        "/console/",
        "/console/organizations",
        "/console/teams",
        "/console/projects",
        "/console/keys",
        f"/console/keys/{world.key_id}/revoke",
        "/console/providers",
        f"/console/providers/{world.provider}",
        "/console/policies",
        f"/console/policies/{world.policy}",
        "/console/budgets",
        f"/console/spend?organization_id={world.org}",
        "/console/audit",
        "/console/tokens",
    ):
        page = await browser.get(path)
        assert page.status_code == 200, path
        parsed = _Fields()
        parsed.feed(page.text)
        for tag, ident, named in parsed.fields:
            assert named or ident in parsed.labelled, f"{path}: a {tag} ({ident}) with no label"


async def test_a_session_of_the_env_token_ends_when_its_value_changes_or_is_removed(
    settings: ControlPlaneSettings, clock: ManualClock, clean_database: Database
) -> None:
    def replica(**changed: object) -> Litestar:
        moved = dataclasses.replace(settings, **changed)  # type: ignore[arg-type]
        return create_app(moved, clock=clock, database=clean_database)

    async def opened_then_seen_by(other: Litestar) -> int:
        """Signs in with the env token on one control plane and shows the session's cookie
        to `other`, which shares its database: the status of the overview there."""
        async with serve_in_loop(replica(), "http://controlplane.test") as first:
            await sign_in(first, ADMIN_TOKEN)
            cookie = first.cookies["vkgate_console"]
        async with serve_in_loop(other, "http://controlplane.test") as second:
            seen = await second.get("/console/", headers={"Cookie": f"vkgate_console={cookie}"})
            if seen.status_code == 200:  # and the session lives on, not just this once
                again = await second.get(
                    "/console/", headers={"Cookie": f"vkgate_console={cookie}"}
                )
                assert again.status_code == 200
            return seen.status_code

    other_token = "another-admin-token-0123456789abcdef0123"
    assert await opened_then_seen_by(replica()) == 200
    assert await opened_then_seen_by(replica(admin_token=other_token)) == 303
    assert await opened_then_seen_by(replica(admin_token=None)) == 303
    # A new key pepper with the old one kept as previous (a rotation) changes no token.
    rotated = replica(
        key_pepper="a-new-key-pepper-0123456789abcdef012345",
        key_peppers_previous=(settings.key_pepper,),
    )
    assert await opened_then_seen_by(rotated) == 200

    # An ended session is gone: the first value coming back does not bring it back.
    async with serve_in_loop(replica(), "http://controlplane.test") as first:
        await sign_in(first, ADMIN_TOKEN)
        cookie = first.cookies["vkgate_console"]
    for token_value, status in ((other_token, 303), (ADMIN_TOKEN, 303)):
        async with serve_in_loop(replica(admin_token=token_value), "http://t.test") as later:
            seen = await later.get("/console/", headers={"Cookie": f"vkgate_console={cookie}"})
            assert seen.status_code == status

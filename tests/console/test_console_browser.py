"""The console in a real browser against `vkgate up --demo`: a platform engineer's day, a
finance reader, an organization-bound admin, and forged requests. Each page visited is saved
as a screenshot in tests/console/screenshots/."""

from __future__ import annotations

import csv
import io
import re
import time
from datetime import timedelta
from typing import Any

import httpx
import openai
import pytest
import sqlalchemy as sa

from controlplane.console._core import COOKIE
from controlplane.console.sessions import session_hash
from controlplane.models import ConsoleSession
from controlplane.settings import DEFAULT_CONSOLE_SESSION_IDLE_MINUTES
from tests.console.browser import WAIT_MS, Stack, heading, shot

SPEND_TIMEOUT_S = 60.0
"""A request reaches the ledger through the proxy's spool (sealed each second) and the
drainer: seconds, given generously for a loaded machine."""


@pytest.fixture
def page(chromium: Any, stack: Stack) -> Any:
    context = chromium.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=stack.controlplane)
    context.set_default_timeout(WAIT_MS)
    opened = context.new_page()
    yield opened
    context.close()


def sign_in(page: Any, stack: Stack, token: str) -> None:
    page.goto(f"{stack.console}/sign-in")
    page.get_by_label("Token", exact=True).fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("heading", name=heading("Overview")).wait_for()


def admin_api(stack: Stack) -> httpx.Client:
    return httpx.Client(
        base_url=stack.controlplane,
        headers={"Authorization": f"Bearer {stack.admin_token}"},
        timeout=30,
    )


def open_section(page: Any, summary: str) -> None:
    """Unfold the <details> whose summary is `summary`, if it is folded."""
    section = page.locator("details", has=page.locator("summary", has_text=summary))
    if section.get_attribute("open") is None:
        section.locator("summary").click()


def id_in_row(page: Any, text: str) -> str:
    row = page.locator("tbody tr", has_text=text).first
    ident: str = row.locator("code").first.inner_text()
    return ident


def until(check: Any, what: str, timeout: float = SPEND_TIMEOUT_S) -> Any:
    """Poll `check` (another process's work: the proxy's spool, the feed) until it is true."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout} s")
        time.sleep(0.5)


def test_a_platform_engineers_day(page: Any, stack: Stack) -> None:
    # A Content-Security-Policy violation (an inline script or style) is a console error.
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    sign_in(page, stack, stack.admin_token)
    shot(page, "01-overview-start")

    page.get_by_role("link", name="Organizations", exact=True).click()
    page.get_by_label("Name", exact=True).fill("acme")
    page.get_by_role("button", name="Create organization").click()
    org = id_in_row(page, "acme")
    shot(page, "02-organizations")

    page.get_by_role("link", name="Teams", exact=True).click()
    page.get_by_label("Organization", exact=True).select_option(org)
    page.get_by_label("Name", exact=True).fill("platform")
    page.get_by_label("Requests a minute", exact=True).fill("600")
    page.get_by_role("button", name="Create team").click()
    team = id_in_row(page, "platform")
    shot(page, "03-teams")

    page.get_by_role("link", name="Projects", exact=True).click()
    page.get_by_label("Organization", exact=True).select_option(org)
    page.get_by_label("Name", exact=True).fill("chat")
    page.get_by_label("Team", exact=True).select_option(team)
    page.get_by_role("button", name="Create project").click()
    project = id_in_row(page, "chat")
    shot(page, "04-projects")

    page.get_by_role("link", name="Providers", exact=True).click()
    open_section(page, "Create provider")
    page.get_by_label("Organization", exact=True).select_option(org)
    page.get_by_label("Name", exact=True).fill("vendor")
    page.get_by_label("Kind", exact=True).select_option("openai")
    page.get_by_label("API key").fill("sk-never-shown-0000")
    page.get_by_role("button", name="Create provider").click()
    # The row is read first: it waits for the new page, whose whole text is then checked.
    assert "set" in page.locator("tbody tr", has_text="vendor").inner_text()
    assert "sk-never-shown" not in page.content()
    page.get_by_role("link", name="vendor", exact=True).click()
    page.get_by_role("heading", name=heading("Provider vendor")).wait_for()
    assert "sk-never-shown" not in page.content()
    assert "Credential: set" in page.locator("main").inner_text()
    shot(page, "06-provider-edit")

    page.get_by_role("link", name="Providers", exact=True).click()
    open_section(page, "Create provider")
    page.get_by_label("Organization", exact=True).select_option(org)
    page.get_by_label("Name", exact=True).fill("offline")
    page.get_by_label("Kind", exact=True).select_option("mock")
    page.get_by_label("Price overrides").fill("mock-chat 2.5 10")
    page.get_by_role("button", name="Create provider").click()
    assert "$2.5 / $10" in page.locator("tbody tr", has_text="offline").inner_text()
    shot(page, "05-providers")

    page.get_by_role("link", name="Routing policies", exact=True).click()
    open_section(page, "Create routing policy")
    page.get_by_label("Organization", exact=True).select_option(org)
    page.get_by_label("Name", exact=True).fill("default")
    page.get_by_label("Aliases").fill("chat = offline:mock-chat")
    page.get_by_role("button", name="Create policy").click()
    policy = id_in_row(page, "default")
    shot(page, "07-policies")

    page.get_by_role("link", name="Virtual keys", exact=True).click()
    open_section(page, "Create key")
    page.get_by_label("Project", exact=True).select_option(project)
    page.get_by_label("Name", exact=True).fill("support-bot")
    page.get_by_label("Routing policy", exact=True).select_option(policy)
    page.get_by_label("Allowed models").fill("chat")
    page.get_by_role("button", name="Create key").click()
    page.get_by_text("it will not be shown again").wait_for()
    shown = page.get_by_label("New key", exact=True).input_value()
    assert re.fullmatch(r"vk-[A-Za-z0-9_-]{20,}", shown)
    shot(page, "08-key-created")
    page.get_by_role("button", name="Copy key").click()
    page.get_by_role("button", name="Copied").wait_for()
    key = page.evaluate("navigator.clipboard.readText()")
    assert key == shown

    with openai.OpenAI(base_url=stack.proxy, api_key=key, max_retries=0, timeout=30) as client:
        reply = client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "Hello from the console test"}]
        )
    assert reply.choices[0].message.content
    assert reply.usage is not None

    def spend_shows_the_request() -> bool:
        page.goto(f"{stack.console}/spend?organization_id={org}&group_by=model")
        row = page.locator("tbody tr", has_text="chat")
        return row.count() == 1 and row.locator("td").nth(1).inner_text() == "1"

    until(spend_shows_the_request, "the request did not reach Spend")
    # model, four counts, three token sums, then the cost (cache hits and saved come after).
    cost = page.locator("tbody tr", has_text="chat").locator("td").nth(8).inner_text()
    assert re.fullmatch(r"\$0\.0\d+", cost), cost  # priced by the provider's override
    shot(page, "09-spend")
    page.get_by_label("day", exact=True).check()
    page.get_by_role("button", name="Show").click()
    headers = page.locator("thead th").all_inner_texts()
    assert headers[:2] == ["model", "day"], headers

    page.get_by_role("link", name="Overview", exact=True).click()
    overview = page.locator("tbody tr", has_text="acme").first
    cells = overview.locator("td")
    assert cells.nth(1).inner_text() == "1"  # today: one served request
    assert cells.nth(4).inner_text() == cost
    top_keys = page.locator("section", has_text="Top keys this month")
    assert "support-bot" in top_keys.inner_text()
    shot(page, "10-overview")

    page.get_by_role("link", name="Budgets", exact=True).click()
    open_section(page, "Create budget")
    page.get_by_label("Organization", exact=True).select_option(org)
    page.get_by_label("Name", exact=True).fill("acme monthly")
    page.get_by_label("Limit (USD)").fill("0.01")
    page.get_by_role("button", name="Create budget").click()
    page.get_by_role("heading", name=heading("Budget acme monthly")).wait_for()
    assert page.locator("svg[role=img]").count() == 1
    shot(page, "11-budget")
    page.get_by_role("link", name="Back to budgets", exact=True).click()
    assert cost in page.locator("tbody tr", has_text="acme monthly").inner_text()
    shot(page, "12-budgets")
    # The overview again, with the budget among those nearest their limit.
    page.get_by_role("link", name="Overview", exact=True).click()
    nearest = page.locator("table", has=page.locator("th", has_text="Budget"))
    assert "acme monthly" in nearest.inner_text() and cost in nearest.inner_text()
    shot(page, "12-overview-budget")

    page.get_by_role("link", name="Virtual keys", exact=True).click()
    page.get_by_role("link", name="Revoke support-bot", exact=True).click()
    page.get_by_role("heading", name=heading("Revoke key support-bot?")).wait_for()
    shot(page, "13-key-revoke-confirm")
    page.get_by_role("button", name="Revoke support-bot").click()
    row = page.locator("tbody tr", has_text="support-bot")
    assert "revoked" in row.inner_text()
    shot(page, "14-keys")

    def refused() -> bool:
        with openai.OpenAI(base_url=stack.proxy, api_key=key, max_retries=0, timeout=30) as c:
            try:
                c.chat.completions.create(
                    model="chat", messages=[{"role": "user", "content": "again"}]
                )
            except openai.PermissionDeniedError as exc:
                return exc.code == "virtual_key_revoked"
        return False

    until(refused, "the proxy still served the revoked key", timeout=10)

    # The filters swap the table in place (htmx) and keep the address in step.
    page.get_by_label("Filter by status", exact=True).select_option("revoked")
    page.wait_for_url(re.compile(r"status=revoked"))
    page.locator("#keys-table tbody tr", has_text="demo-").wait_for(state="detached")
    assert page.locator("#keys-table tbody tr").count() == 1
    assert page.locator("h1").count() == 1  # a fragment, not a page inside the page

    page.get_by_role("link", name="Audit log", exact=True).click()
    # Waits for the audit page itself: read mid-navigation, the document is still empty.
    page.locator("tbody tr", has_text="virtual_key.revoke").first.wait_for()
    page.get_by_label("Resource kind", exact=True).select_option("virtual_key")
    page.get_by_role("button", name="Filter").click()
    assert "organization.create" not in page.locator("tbody").inner_text()
    shot(page, "15-audit")

    page.get_by_role("link", name="Tokens", exact=True).click()
    shot(page, "16-tokens")
    page.get_by_role("button", name="Sign out").click()
    page.get_by_role("button", name="Sign in").wait_for()
    page.goto(f"{stack.console}/keys")
    assert page.url.endswith("/console/sign-in")
    assert errors == []


def test_a_finance_token_reads_spend_and_sees_no_control_that_changes_anything(
    page: Any, stack: Stack
) -> None:
    with admin_api(stack) as api:
        made = api.post("/api/admin/tokens", json={"name": "finance-desk", "role": "finance"})
        assert made.status_code == 201, made.text
        orgs = api.get("/api/admin/organizations").json()["data"]
    demo = next(o["id"] for o in orgs if o["name"] == "demo")
    with openai.OpenAI(
        base_url=stack.proxy, api_key=stack.demo_key, max_retries=0, timeout=30
    ) as client:
        client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
        )
    sign_in(page, stack, made.json()["token"])
    assert "finance" in page.locator(".who").inner_text()
    for name in (
        "Overview",
        "Organizations",
        "Teams",
        "Projects",
        "Virtual keys",
        "Providers",
        "Routing policies",
        "Budgets",
        "Audit log",
    ):
        page.get_by_role("link", name=name, exact=True).click()
        page.get_by_role("heading", name=heading(name)).wait_for()
        # The only form that posts is Sign out.
        assert page.locator("form[method=post]").count() == 1, name
        assert (
            page.get_by_role("button", name=re.compile("Create|Revoke|Disable|Save")).count() == 0
        )
        shot(page, f"finance-{name.lower().replace(' ', '-')}")
    assert page.get_by_role("link", name="Tokens", exact=True).count() == 0

    page.goto(f"{stack.console}/spend?organization_id={demo}&group_by=day,model")
    until(
        lambda: page.reload() or page.locator("tbody tr", has_text="gpt-4o-mini").count() > 0,
        "the demo request did not reach Spend",
    )
    shot(page, "finance-spend")
    with page.expect_download() as downloading:
        page.get_by_role("link", name="Download CSV", exact=True).click()
    downloaded = open(downloading.value.path(), "rb").read()  # noqa: SIM115
    query = (
        page.get_by_role("link", name="Download CSV", exact=True)
        .get_attribute("href")
        .partition("?")[2]
    )
    with admin_api(stack) as api:
        expected = api.get(f"/api/spend/report?{query}&format=csv")
    assert downloaded == expected.content
    assert next(csv.reader(io.StringIO(downloaded.decode())))[:2] == ["day", "model"]

    csrf = page.locator("input[name=csrf_token]").first.get_attribute("value")
    forged = page.request.post(
        f"{stack.console}/organizations", form={"csrf_token": csrf, "name": "finance-made"}
    )
    assert forged.status == 403
    with admin_api(stack) as api:
        names = [o["name"] for o in api.get("/api/admin/organizations").json()["data"]]
    assert "finance-made" not in names


def test_an_organization_bound_token_cannot_reach_another_organization(
    page: Any, stack: Stack
) -> None:
    with admin_api(stack) as api:
        orgs = {o["name"]: o["id"] for o in api.get("/api/admin/organizations").json()["data"]}
        other = api.post("/api/admin/organizations", json={"name": "other-co"}).json()["id"]
        secret = api.post(
            "/api/admin/providers",
            json={"organization_id": other, "name": "theirs", "kind": "mock"},
        ).json()["id"]
        made = api.post(
            "/api/admin/tokens",
            json={"name": "demo-admin", "role": "admin", "organization_id": orgs["demo"]},
        )
    sign_in(page, stack, made.json()["token"])
    page.get_by_role("link", name="Providers", exact=True).click()
    page.get_by_role("heading", name=heading("Providers")).wait_for()
    assert "theirs" not in page.content()
    shot(page, "bound-providers")
    for path in (f"/providers/{secret}", f"/spend?organization_id={other}"):
        response = page.goto(f"{stack.console}{path}")
        assert response.status == 404, path
        page.get_by_role("heading", name="Not found").wait_for()
    shot(page, "bound-not-found")


def test_posts_without_the_csrf_token_are_refused(page: Any, stack: Stack) -> None:
    sign_in(page, stack, stack.admin_token)
    refused = page.request.post(f"{stack.console}/organizations", form={"name": "no-csrf"})
    assert refused.status == 403
    with admin_api(stack) as api:
        names = [o["name"] for o in api.get("/api/admin/organizations").json()["data"]]
    assert "no-csrf" not in names


def idle_for(page: Any, stack: Stack, minutes: float) -> None:
    """As if the browser's session had sat unused `minutes` more: its last use is moved back in
    the control plane's database, where the server measures idleness from (the running
    process's clock cannot be set, and the timeout is half an hour)."""
    cookie = next(c["value"] for c in page.context.cookies() if c["name"] == COOKIE)
    engine = sa.create_engine(f"sqlite:///{stack.home / 'controlplane.db'}")
    try:
        with engine.begin() as conn:
            mine = ConsoleSession.id_hash == session_hash(cookie)
            seen = conn.execute(sa.select(ConsoleSession.last_seen_at).where(mine)).scalar_one()
            moved = seen - timedelta(minutes=minutes)
            conn.execute(sa.update(ConsoleSession).where(mine).values(last_seen_at=moved))
    finally:
        engine.dispose()


def test_a_session_idle_past_its_timeout_is_sent_to_the_sign_in_page(
    page: Any, stack: Stack
) -> None:
    idle = DEFAULT_CONSOLE_SESSION_IDLE_MINUTES
    sign_in(page, stack, stack.admin_token)
    # Used just within the timeout, twice: each use starts the idle time again.
    for _ in range(2):
        idle_for(page, stack, idle - 1)
        page.get_by_role("link", name="Virtual keys", exact=True).click()
        page.get_by_role("heading", name=heading("Virtual keys")).wait_for()
        page.get_by_role("link", name="Overview", exact=True).click()
        page.get_by_role("heading", name=heading("Overview")).wait_for()

    # Idle past it: the next page is the sign-in page, and signing in again works.
    idle_for(page, stack, idle + 1)
    page.get_by_role("link", name="Virtual keys", exact=True).click()
    page.wait_for_url(f"{stack.console}/sign-in?ended=1")
    page.get_by_role("status").filter(has_text="Your session ended").wait_for()
    shot(page, "session-expired")
    sign_in(page, stack, stack.admin_token)

    # A partial update (the keys' filter, fetched by htmx) loads the sign-in page whole,
    # rather than swapping it into the table.
    page.get_by_role("link", name="Virtual keys", exact=True).click()
    page.get_by_role("heading", name=heading("Virtual keys")).wait_for()
    idle_for(page, stack, idle + 1)
    page.get_by_label("Filter by status").select_option("revoked")
    page.wait_for_url(f"{stack.console}/sign-in?ended=1")
    page.get_by_role("button", name="Sign in").wait_for()
    assert page.locator("#keys-table").count() == 0

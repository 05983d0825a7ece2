"""The `vkgate` admin commands, run as a user runs them against a real control plane process."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import fake_gemini as FG
from tests.support.env import ADMIN_TOKEN
from tests.support.processes import clean_env, free_port, sqlite_controlplane, vkgate

PROVIDER_CREDENTIAL = "sk-cli-test-credential-4f9a2c"
ROTATED_CREDENTIAL = "sk-cli-test-credential-rotated-88b1"


@pytest.fixture(scope="module")
def controlplane_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One migrated control plane on SQLite, shared by this module's tests."""
    with sqlite_controlplane(tmp_path_factory.mktemp("cli-controlplane")) as service:
        yield service.url


@pytest.fixture
def user_env(tmp_path: Path) -> dict[str, str]:
    """A shell with no vkgate settings, whose VKGATE_HOME holds no secrets file."""
    return clean_env(VKGATE_HOME=str(tmp_path / "empty-home"))


class Cli:
    """`vkgate --url URL --token TOKEN …` as subprocesses."""

    def __init__(self, url: str, env: dict[str, str], token: str = ADMIN_TOKEN) -> None:
        self.url = url
        self.env = env
        self.token = token

    def run(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return vkgate("--url", self.url, "--token", self.token, *args, env=env or self.env)

    def ok(self, *args: str, env: dict[str, str] | None = None) -> str:
        result = self.run(*args, env=env)
        assert result.returncode == 0, f"vkgate {' '.join(args)}:\n{result.stdout}{result.stderr}"
        return result.stdout

    def json(self, *args: str, env: dict[str, str] | None = None) -> Any:
        return json.loads(self.ok(*args, "--json", env=env))

    def fails(self, *args: str) -> str:
        result = self.run(*args)
        assert result.returncode != 0, f"vkgate {' '.join(args)} succeeded:\n{result.stdout}"
        return result.stderr


@pytest.fixture
def cli(controlplane_url: str, user_env: dict[str, str]) -> Cli:
    return Cli(controlplane_url, user_env)


def header_of(table: str) -> list[str]:
    return table.splitlines()[0].split()


def new_org(cli: Cli, name: str) -> str:
    org_id: str = cli.json("orgs", "create", name)["id"]
    return org_id


def test_org_team_and_project_commands_create_list_and_show(cli: Cli) -> None:
    org = cli.json("orgs", "create", "acme-structure")
    assert org["name"] == "acme-structure" and org["id"] and org["created_at"]

    listing = cli.ok("orgs", "list")
    assert header_of(listing) == ["ID", "NAME", "CREATED_AT"]
    assert any(line.split()[:2] == [org["id"], "acme-structure"] for line in listing.splitlines())
    assert cli.json("orgs", "show", org["id"]) == org

    team = cli.json("teams", "create", "--org", org["id"], "ml")
    assert (team["organization_id"], team["name"]) == (org["id"], "ml")
    teams = cli.ok("teams", "list", "--org", org["id"])
    assert header_of(teams) == ["ID", "ORGANIZATION_ID", "NAME", "LIMITS", "CREATED_AT"]
    assert team["id"] in teams
    assert cli.json("teams", "show", team["id"])["name"] == "ml"

    project = cli.json("projects", "create", "--org", org["id"], "--team", team["id"], "chat")
    assert (project["organization_id"], project["team_id"], project["name"]) == (
        org["id"],
        team["id"],
        "chat",
    )
    loose = cli.json("projects", "create", "--org", org["id"], "batch")
    assert loose["team_id"] is None
    by_team = cli.json("projects", "list", "--team", team["id"])
    assert [p["id"] for p in by_team] == [project["id"]]
    projects = cli.ok("projects", "list", "--org", org["id"])
    assert header_of(projects) == ["ID", "ORGANIZATION_ID", "TEAM_ID", "NAME", "CREATED_AT"]
    assert project["id"] in projects and loose["id"] in projects

    shown = cli.ok("projects", "show", project["id"])
    assert ["team_id", team["id"]] in [line.split() for line in shown.splitlines()]


def test_provider_commands_never_print_the_credential(cli: Cli) -> None:
    org = new_org(cli, "acme-providers")
    env = {**cli.env, "CLI_TEST_OPENAI_KEY": PROVIDER_CREDENTIAL}
    added = cli.json(
        "providers", "add", "--org", org, "--name", "openai-main", "--kind", "openai",
        "--api-key-env", "CLI_TEST_OPENAI_KEY",
        "--header", "OpenAI-Organization=org-cli-test",
        "--price", "gpt-4o-mini=0.15,0.6",
        "--price", "gpt-4o=2.5,10,1.25",
        env=env,
    )  # fmt: skip
    assert added["kind"] == "openai" and added["has_api_key"] is True
    assert added["header_names"] == ["OpenAI-Organization"]
    assert added["price_overrides"] == {
        "gpt-4o-mini": {"input_per_mtok": "0.15", "output_per_mtok": "0.6"},
        "gpt-4o": {"input_per_mtok": "2.5", "output_per_mtok": "10", "cache_read_per_mtok": "1.25"},
    }

    outputs = [
        cli.ok("providers", "list", "--org", org),
        cli.ok("providers", "list", "--org", org, "--json"),
        cli.ok("providers", "show", added["id"]),
        cli.ok("providers", "show", added["id"], "--json"),
    ]
    table = outputs[0]
    assert header_of(table) == [
        "ID", "ORGANIZATION_ID", "NAME", "KIND", "BASE_URL", "HAS_API_KEY", "RESPONSES_API",
    ]  # fmt: skip
    assert added["id"] in table and "openai-main" in table

    updated = cli.json(
        "providers", "update", added["id"], "--name", "openai-primary",
        "--api-key", ROTATED_CREDENTIAL,
    )  # fmt: skip
    assert updated["name"] == "openai-primary" and updated["has_api_key"] is True
    assert added["responses_api"] is True
    translated = cli.json("providers", "update", added["id"], "--no-responses-api")
    assert translated["responses_api"] is False
    outputs.append(cli.ok("providers", "show", added["id"], "--json"))
    for output in outputs:
        assert PROVIDER_CREDENTIAL not in output
        assert ROTATED_CREDENTIAL not in output
        assert "org-cli-test" not in output  # header values are credentials too

    assert cli.ok("providers", "remove", added["id"]).strip() == f"removed {added['id']}"
    assert cli.json("providers", "list", "--org", org) == []
    assert "404 not_found" in cli.fails("providers", "show", added["id"])


def test_cloud_provider_commands_take_their_fields_and_never_print_the_credentials(
    cli: Cli, tmp_path: Path
) -> None:
    org = new_org(cli, "acme-clouds")
    secret = "cli/test/aws+secret/0123456789abcdefghij"
    env = {**cli.env, "CLI_TEST_AWS_SECRET": secret}
    bedrock = cli.json(
        "providers", "add", "--org", org, "--name", "bedrock", "--kind", "bedrock",
        "--region", "eu-central-1", "--endpoint-url", "https://bedrock.example.internal",
        "--aws-access-key-id", "AKIACLITESTKEY000001",
        "--aws-secret-access-key-env", "CLI_TEST_AWS_SECRET",
        env=env,
    )  # fmt: skip
    assert (bedrock["region"], bedrock["base_url"]) == (
        "eu-central-1",
        "https://bedrock.example.internal",
    )
    assert bedrock["cloud_credentials"] == "stored"
    account = FG.FakeGemini(url="https://oauth2.example").service_account()
    key_file = tmp_path / "account.json"
    key_file.write_text(json.dumps(account))
    vertex = cli.json(
        "providers", "add", "--org", org, "--name", "vertex", "--kind", "vertex_ai",
        "--project", "acme-ml", "--location", "global", "--service-account-file", str(key_file),
    )  # fmt: skip
    assert (vertex["project"], vertex["location"], vertex["cloud_credentials"]) == (
        "acme-ml",
        "global",
        "stored",
    )
    workload = cli.json("providers", "update", vertex["id"], "--workload-credentials")
    assert workload["cloud_credentials"] == "workload"
    refused = cli.fails("providers", "update", bedrock["id"], "--project", "x")
    assert "422 validation_error" in refused and "project" in refused
    for output in (
        cli.ok("providers", "list", "--org", org, "--json"),
        cli.ok("providers", "show", bedrock["id"], "--json"),
    ):
        assert secret not in output and "AKIACLITESTKEY000001" not in output
        assert account["private_key"][40:80] not in output


def test_policy_alias_keeps_the_fallback_chain_in_the_order_given(cli: Cli) -> None:
    org = new_org(cli, "acme-policies")
    first = cli.json("providers", "add", "--org", org, "--name", "first", "--kind", "mock")
    second = cli.json(
        "providers", "add", "--org", org, "--name", "second", "--kind", "openai_compatible",
        "--base-url", "http://127.0.0.1:9/v1",
    )  # fmt: skip
    policy = cli.json(
        "policies", "create", "--org", org, "--name", "default",
        "--alias", f"fast={second['id']}:llama3,{first['id']}:mock-small",
        "--alias", f"smart={first['id']}:mock-large",
    )  # fmt: skip
    assert policy["aliases"] == {
        "fast": [
            {"provider_id": second["id"], "model": "llama3"},
            {"provider_id": first["id"], "model": "mock-small"},
        ],
        "smart": [{"provider_id": first["id"], "model": "mock-large"}],
    }
    assert cli.json("policies", "show", policy["id"])["aliases"] == policy["aliases"]
    listing = cli.ok("policies", "list", "--org", org)
    assert header_of(listing) == ["ID", "ORGANIZATION_ID", "NAME", "ALIASES"]
    assert policy["id"] in listing

    # A provider a policy routes to cannot be removed from under it.
    refused = cli.fails("providers", "remove", second["id"])
    assert "409 conflict" in refused and "routing polic" in refused


def test_key_lifecycle_shows_the_key_once_and_walks_every_state(cli: Cli) -> None:
    org = new_org(cli, "acme-keys")
    project = cli.json("projects", "create", "--org", org, "chat")["id"]
    provider = cli.json("providers", "add", "--org", org, "--name", "demo", "--kind", "mock")["id"]
    policy = cli.json(
        "policies", "create", "--org", org, "--name", "default",
        "--alias", f"fast={provider}:mock-small", "--alias", f"smart={provider}:mock-large",
    )["id"]  # fmt: skip

    created = cli.ok(
        "keys", "create", "--project", project, "--policy", policy, "--name", "app",
        "--rpm", "60", "--allow", "fast", "--meta", "owner=ml-team",
    )  # fmt: skip
    key_lines = [line for line in created.splitlines() if line.startswith("key:")]
    assert len(key_lines) == 1 and key_lines[0].startswith("key: vk-")
    raw_key = key_lines[0].removeprefix("key: ")
    assert created.count(raw_key) == 1
    assert "only time the key is shown" in created

    [key] = cli.json("keys", "list", "--project", project)
    assert key["name"] == "app" and key["status"] == "active"
    assert key["limits"] == {"rpm": 60}
    assert key["allowed_models"] == ["fast"]
    assert key["metadata"] == {"owner": "ml-team"}
    assert raw_key.startswith(key["prefix"])
    listing = cli.ok("keys", "list", "--project", project)
    assert header_of(listing) == [
        "ID", "NAME", "PREFIX", "PROJECT_ID", "ROUTING_POLICY_ID", "STATUS", "EXPIRES_AT",
    ]  # fmt: skip
    shown = cli.ok("keys", "show", key["id"], "--json")
    for output in (listing, shown):
        assert raw_key not in output
    assert json.loads(shown)["id"] == key["id"]

    updated = cli.json("keys", "update", key["id"], "--tpm", "1000", "--allow", "smart")
    assert updated["limits"] == {"tpm": 1000}  # --tpm replaces every limit of the key
    assert updated["allowed_models"] == ["smart"]

    rotated_table = cli.ok("keys", "rotate", key["id"], "--grace-seconds", "3600")
    [new_key_line] = [line for line in rotated_table.splitlines() if line.startswith("key: ")]
    assert new_key_line.startswith("key: vk-") and new_key_line != f"key: {raw_key}"
    assert re.search(r"The previous key works until \d{4}-\d\d-\d\dT", rotated_table)
    rotated = cli.json("keys", "rotate", key["id"], "--grace-seconds", "0")
    assert rotated["key"].startswith("vk-") and f"key: {rotated['key']}" != new_key_line
    assert rotated["previous_key_valid_until"] is not None

    assert cli.json("keys", "disable", key["id"])["status"] == "disabled"
    assert (
        cli.json("keys", "list", "--project", project, "--status", "disabled")[0]["id"]
        == (key["id"])
    )
    assert cli.json("keys", "enable", key["id"])["status"] == "active"
    assert cli.json("keys", "revoke", key["id"])["status"] == "revoked"
    refused = cli.fails("keys", "enable", key["id"])
    assert "409 conflict" in refused and "revoked" in refused


def test_budget_commands_create_list_update_and_delete(cli: Cli) -> None:
    org = new_org(cli, "acme-budgets")
    team = cli.json("teams", "create", "--org", org, "ml")["id"]
    budget = cli.json(
        "budgets", "create", "--org", org, "--scope", f"team:{team}", "--window", "month",
        "--limit-usd", "250", "--name", "ml-monthly",
    )  # fmt: skip
    assert budget["scope"] == {"kind": "team", "id": team}
    assert (budget["window"], budget["on_breach"], budget["name"]) == (
        "month",
        "block",
        "ml-monthly",
    )
    assert budget["limit_usd"].startswith("250")
    whole_org = cli.json(
        "budgets", "create", "--org", org, "--scope", "organization", "--window", "day",
        "--limit-usd", "12.50", "--on-breach", "warn",
    )  # fmt: skip
    assert whole_org["scope"]["kind"] == "organization"

    listing = cli.ok("budgets", "list", "--org", org)
    assert header_of(listing) == [
        "ID", "NAME", "SCOPE", "WINDOW", "LIMIT_USD", "PROVIDER_ID", "ON_BREACH",
    ]  # fmt: skip
    assert budget["id"] in listing and whole_org["id"] in listing

    updated = cli.json(
        "budgets", "update", budget["id"], "--limit-usd", "300", "--on-breach", "warn"
    )
    assert updated["limit_usd"].startswith("300") and updated["on_breach"] == "warn"
    assert updated["scope"] == budget["scope"]

    assert cli.ok("budgets", "delete", budget["id"]).strip() == f"deleted {budget['id']}"
    assert [b["id"] for b in cli.json("budgets", "list", "--org", org)] == [whole_org["id"]]
    assert "404 not_found" in cli.fails("budgets", "show", budget["id"])


def test_team_commands_set_replace_and_clear_the_teams_limits(cli: Cli) -> None:
    org = new_org(cli, "acme-team-limits")
    team = cli.json(
        "teams", "create", "--org", org, "search", "--rpm", "600", "--max-concurrency", "8"
    )
    assert team["limits"] == {"rpm": 600, "max_concurrency": 8}
    assert cli.json("teams", "show", team["id"])["limits"] == team["limits"]
    listing = cli.ok("teams", "list", "--org", org)
    assert '{"rpm":600,"max_concurrency":8}' in listing

    # The limits given replace all of the team's limits, as the API's PATCH does.
    updated = cli.json("teams", "update", team["id"], "--tpm", "50000", "--rpd", "9000")
    assert updated["limits"] == {"tpm": 50000, "rpd": 9000}
    renamed = cli.json("teams", "update", team["id"], "--name", "search-platform")
    assert (renamed["name"], renamed["limits"]) == ("search-platform", updated["limits"])
    cleared = cli.json("teams", "update", team["id"], "--clear-limits")
    assert cleared["limits"] == {}

    assert "nothing to change" in cli.fails("teams", "update", team["id"])
    both = cli.fails("teams", "update", team["id"], "--rpm", "5", "--clear-limits")
    assert "--clear-limits" in both
    assert "404 not_found" in cli.fails("teams", "update", "team_missing", "--rpm", "5")
    for option, value in (("--rpm", "0"), ("--max-concurrency", "1.5")):
        refused = cli.run("teams", "update", team["id"], option, value)
        assert refused.returncode == 2, refused.stderr  # refused before anything is sent
        assert f"Invalid value for '{option}'" in refused.stderr


def test_budget_commands_cover_every_scope_and_the_provider_filter(cli: Cli) -> None:
    org = new_org(cli, "acme-budget-scopes")
    provider = cli.json("providers", "add", "--org", org, "--name", "m", "--kind", "mock")["id"]
    per_user = cli.json(
        "budgets", "create", "--org", org, "--scope", "end_user", "--window", "total",
        "--limit-usd", "5", "--provider", provider, "--name", "each-user",
    )  # fmt: skip
    assert per_user["scope"] == {"kind": "end_user", "id": None}
    assert (per_user["window"], per_user["provider_id"]) == ("total", provider)
    one_user = cli.json(
        "budgets", "create", "--org", org, "--scope", "end_user:alice", "--window", "week",
        "--limit-usd", "1.5",
    )  # fmt: skip
    assert one_user["scope"] == {"kind": "end_user", "id": "alice"}

    unfiltered = cli.json("budgets", "update", per_user["id"], "--all-providers", "--clear-name")
    assert (unfiltered["provider_id"], unfiltered["name"]) == (None, None)
    refiltered = cli.json("budgets", "update", per_user["id"], "--provider", provider)
    assert refiltered["provider_id"] == provider
    assert cli.json("budgets", "show", per_user["id"]) == refiltered

    zero = cli.fails(
        "budgets", "create", "--org", org, "--scope", "organization", "--window", "day",
        "--limit-usd", "0",
    )  # fmt: skip
    assert "422 validation_error" in zero and "(field: limit_usd)" in zero
    assert "(field: limit_usd)" in cli.fails(
        "budgets", "update", one_user["id"], "--limit-usd", "0"
    )
    both = cli.fails("budgets", "update", one_user["id"], "--provider", provider, "--all-providers")
    assert "--all-providers" in both


def test_tokens_and_audit_log(cli: Cli) -> None:
    created = cli.ok("tokens", "create", "--name", "finance-bot", "--role", "finance")
    token_lines = [line for line in created.splitlines() if line.startswith("token: ")]
    assert len(token_lines) == 1
    finance_token = token_lines[0].removeprefix("token: ")
    assert created.count(finance_token) == 1

    tokens = cli.ok("tokens", "list")
    assert header_of(tokens) == ["ID", "NAME", "ROLE", "PREFIX", "CREATED_AT", "REVOKED_AT"]
    assert finance_token not in tokens
    [row] = [t for t in cli.json("tokens", "list") if t["name"] == "finance-bot"]
    assert row["role"] == "finance" and row["revoked_at"] is None

    finance = Cli(cli.url, cli.env, token=finance_token)
    assert isinstance(finance.json("orgs", "list"), list)  # finance may read
    assert "403 forbidden" in finance.fails("orgs", "create", "finance-org")

    revoked = cli.json("tokens", "revoke", row["id"])
    assert revoked["revoked_at"] is not None
    assert "401 unauthorized" in finance.fails("orgs", "list")

    org = new_org(cli, "acme-audit")
    entries = cli.json("audit", "--org", org)
    assert [e["resource_id"] for e in entries] == [org]
    assert entries[0]["action"] and entries[0]["actor"]
    token_entries = cli.json("audit", "--resource", row["id"])
    assert len(token_entries) == 2  # created, then revoked
    assert all(finance_token not in json.dumps(e) for e in token_entries)
    table = cli.ok("audit", "--resource", row["id"])
    assert header_of(table) == ["ID", "AT", "ACTOR", "ACTION", "RESOURCE_ID", "DETAILS"]
    assert org in cli.ok("audit")  # unfiltered, as in the walkthrough


def test_url_and_token_come_from_the_environment(controlplane_url: str, tmp_path: Path) -> None:
    env = clean_env(
        VKGATE_HOME=str(tmp_path / "empty-home"),
        VKGATE_CONTROLPLANE_URL=controlplane_url + "/",
        VKGATE_ADMIN_TOKEN=ADMIN_TOKEN,
    )
    created = vkgate("orgs", "create", "acme-from-env", "--json", env=env)
    assert created.returncode == 0, created.stderr
    org = json.loads(created.stdout)
    shown = vkgate("orgs", "show", org["id"], "--json", env=env)
    assert json.loads(shown.stdout) == org

    # The address the control plane binds is enough to find it, too.
    port = controlplane_url.rsplit(":", 1)[1]
    by_addr = clean_env(
        VKGATE_HOME=str(tmp_path / "empty-home"),
        VKGATE_CONTROLPLANE_ADDR=f"0.0.0.0:{port}",
        VKGATE_ADMIN_TOKEN=ADMIN_TOKEN,
    )
    shown = vkgate("orgs", "show", org["id"], "--json", env=by_addr)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["name"] == "acme-from-env"


def test_a_loopback_control_plane_is_called_directly_whatever_http_proxy_says(
    cli: Cli, user_env: dict[str, str]
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    behind_proxy = {**user_env, "HTTP_PROXY": dead, "http_proxy": dead, "ALL_PROXY": dead}
    org = cli.json("orgs", "create", "acme-behind-a-proxy", env=behind_proxy)
    assert org["id"] in {o["id"] for o in cli.json("orgs", "list", env=behind_proxy)}


def test_api_errors_exit_nonzero_with_the_code_and_the_field(cli: Cli) -> None:
    missing = cli.fails("keys", "create", "--project", "nope", "--policy", "nope")
    assert "404 not_found" in missing and "(field: project_id)" in missing

    org = new_org(cli, "acme-errors")
    duplicate = cli.fails("orgs", "create", "acme-errors")
    assert "409 conflict" in duplicate and "(field: name)" in duplicate

    invalid = cli.fails(
        "budgets", "create", "--org", org, "--scope", "organization", "--window", "day",
        "--limit-usd", "ten dollars",
    )  # fmt: skip
    assert "422 validation_error" in invalid and "limit_usd" in invalid
    assert "Traceback" not in missing + duplicate + invalid


def test_unreachable_control_plane_is_named_in_the_error(user_env: dict[str, str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = vkgate("--url", url, "--token", ADMIN_TOKEN, "orgs", "list", env=user_env)
    assert result.returncode != 0
    assert f"cannot reach the control plane at {url}" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_admin_token_says_where_to_get_one(
    controlplane_url: str, user_env: dict[str, str]
) -> None:
    result = vkgate("--url", controlplane_url, "orgs", "list", env=user_env)
    assert result.returncode != 0
    assert "no admin token" in result.stderr and "VKGATE_ADMIN_TOKEN" in result.stderr


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["policies", "create", "--org", "o", "--name", "p", "--alias", "fast"], "--alias"),
        (["policies", "create", "--org", "o", "--name", "p", "--alias", "fast=prov"], "--alias"),
        (["providers", "add", "--org", "o", "--name", "n", "--kind", "mock", "--header", "X"], "--header"),
        (["providers", "add", "--org", "o", "--name", "n", "--kind", "mock", "--price", "m=1"], "--price"),
        (["budgets", "create", "--org", "o", "--scope", "galaxy:1", "--window", "day", "--limit-usd", "1"], "--scope"),
        (["keys", "create", "--project", "p", "--policy", "r", "--meta", "owner"], "--meta"),
        (["providers", "add", "--org", "o", "--name", "n", "--kind", "openai", "--api-key-env", "CLI_TEST_UNSET_CREDENTIAL_VAR"], "--api-key-env"),
    ],
    ids=["alias-without-chain", "alias-without-model", "header", "price", "scope", "meta", "api-key-env-unset"],
)  # fmt: skip
def test_malformed_option_is_a_usage_error_naming_the_option(
    args: list[str], option: str, user_env: dict[str, str]
) -> None:
    # No control plane is needed: the option is refused before anything is sent.
    url = f"http://127.0.0.1:{free_port()}"
    result = vkgate("--url", url, "--token", ADMIN_TOKEN, *args, env=user_env)
    assert result.returncode == 2, result.stderr
    assert f"Invalid value for {option}:" in result.stderr
    assert "cannot reach" not in result.stderr


def test_guardrail_commands_create_list_update_and_delete_never_printing_the_secret(
    cli: Cli,
) -> None:
    org = new_org(cli, "acme-guardrails")
    secret = "whsec-cli-test-0123456789"
    env = {**cli.env, "CLI_TEST_HOOK_SECRET": secret}
    pii = cli.json(
        "guardrails", "create", "--org", org, "--name", "pii", "--kind", "pii",
        "--action", "redact", "--config", '{"entities": ["email", "credit_card"]}',
    )  # fmt: skip
    assert (pii["kind"], pii["action"], pii["stage"]) == ("pii", "redact", "both")
    assert pii["config"] == {"entities": ["email", "credit_card"]}
    hook = cli.json(
        "guardrails", "create", "--org", org, "--name", "hook", "--kind", "webhook",
        "--stage", "request", "--on-error", "block", "--timeout-ms", "300",
        "--config", '{"url": "https://guard.example.com/check"}',
        "--secret-env", "CLI_TEST_HOOK_SECRET",
        env=env,
    )  # fmt: skip
    assert hook["has_secret"] is True and hook["on_error"] == "block"
    table = cli.ok("guardrails", "list", "--org", org)
    assert header_of(table)[:3] == ["ID", "NAME", "KIND"]
    assert "pii" in table and "hook" in table
    off = cli.json("guardrails", "update", hook["id"], "--disable", "--action", "warn")
    assert (off["enabled"], off["action"]) == (False, "warn")
    outputs = [table, cli.ok("guardrails", "show", hook["id"], "--json"), str(off), str(hook)]
    assert all(secret not in output for output in outputs)
    assert "config.entities" in cli.fails(
        "guardrails", "create", "--org", org, "--name", "bad", "--kind", "pii",
        "--config", '{"entities": ["shoe_size"]}',
    )  # fmt: skip
    assert "--config" in cli.fails(
        "guardrails", "create", "--org", org, "--name", "bad", "--kind", "pii", "--config", "{",
    )  # fmt: skip
    assert cli.ok("guardrails", "delete", pii["id"]).strip() == f"deleted {pii['id']}"
    assert [g["id"] for g in cli.json("guardrails", "list", "--org", org)] == [hook["id"]]

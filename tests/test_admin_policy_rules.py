"""Admin API: a routing policy's `rules`, checked on the way in, read back, replaced by a PATCH,
and carried to the proxy in the key's bundle with a change-feed event."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import Internal, World
from tests.support.api import ADMIN, error_of

POLICIES = "/api/admin/routing-policies"
RULES: list[dict[str, Any]] = [
    {"name": "no-gpt4", "kind": "deny_models", "values": ["gpt-4*"]},
    {"name": "lookups", "kind": "allow_tools", "values": ["get_*"]},
    {"name": "no-shell", "kind": "deny_tools", "values": ["bash"]},
    {"name": "cdn", "kind": "allow_url_domains", "values": ["cdn.example.com"]},
    {"name": "paste", "kind": "deny_url_domains", "values": ["*.paste.example.com"]},
    {"name": "no-bias", "kind": "deny_params", "values": ["logit_bias"]},
    {"name": "short", "kind": "max_output_tokens", "values": {"limit": 512, "action": "cap"}},
]


async def test_rules_of_every_kind_are_stored_and_reach_the_bundle(
    client: httpx.AsyncClient, world: World, internal: Internal
) -> None:
    response = await client.patch(
        f"{POLICIES}/{world.policy}", json={"rules": RULES}, headers=ADMIN
    )
    assert response.status_code == 200, response.text
    assert response.json()["rules"] == RULES
    assert (await client.get(f"{POLICIES}/{world.policy}", headers=ADMIN)).json()["rules"] == RULES
    bundle = await internal.call("GET", f"/api/internal/gateway/config/{world.key_id}")
    assert bundle.json()["rules"] == RULES
    feed = await internal.call("GET", "/api/internal/gateway/changes?since=0&timeout_s=0")
    kinds = [(e["kind"], e["entity_id"]) for e in feed.json()["events"]]
    assert ("ROUTING_POLICY_UPDATED", world.policy) in kinds


async def test_a_policy_without_rules_reads_an_empty_list(
    client: httpx.AsyncClient, world: World
) -> None:
    assert (await client.get(f"{POLICIES}/{world.policy}", headers=ADMIN)).json()["rules"] == []


@pytest.mark.parametrize(
    ("rules", "param"),
    [
        ([{"name": "x", "kind": "deny_colours", "values": ["red"]}], "rules[0].kind"),
        ([{"name": "x", "kind": "deny_models", "values": {"limit": 5}}], "rules[0].values"),
        ([{"name": "x", "kind": "max_output_tokens", "values": ["5"]}], "rules[0].values"),
        (
            [{"name": "x", "kind": "max_output_tokens", "values": {"limit": 0}}],
            "rules[0].values.limit",
        ),
        (
            [{"name": "x", "kind": "max_output_tokens", "values": {"limit": 5, "action": "no"}}],
            "rules[0].values.action",
        ),
        ([{"name": "x", "kind": "deny_tools", "values": []}], "rules[0].values"),
        (
            [
                {"name": "x", "kind": "deny_tools", "values": ["a"]},
                {"name": "x", "kind": "deny_params", "values": ["b"]},
            ],
            "rules[1].name",
        ),
        ([{"name": "x", "kind": "deny_tools", "values": ["a"], "extra": 1}], "rules[0]"),
    ],
)
async def test_a_malformed_rule_is_a_422_naming_it(
    client: httpx.AsyncClient, world: World, rules: list[dict[str, Any]], param: str
) -> None:
    response = await client.patch(
        f"{POLICIES}/{world.policy}", json={"rules": rules}, headers=ADMIN
    )
    error = error_of(response, 422, "validation_error")
    assert error["param"] is not None and error["param"].startswith(param), error
    assert (await client.get(f"{POLICIES}/{world.policy}", headers=ADMIN)).json()["rules"] == []

"""Compiling a key's config bundle into the immutable object requests are served from."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

from proxy.providers.mock import MockProvider
from proxy.runtime import KeyRuntime, RouteCache
from tests.support.clock import ManualClock
from vkgate.clock import unix_seconds
from vkgate.wire import (
    BudgetState,
    CacheRuleState,
    ChainTarget,
    ConfigBundle,
    GuardrailSpec,
    Limits,
    OutputCap,
    PolicyRule,
    Price,
)


def target(provider: str, model: str, kind: str = "mock") -> ChainTarget:
    return ChainTarget(
        provider_id=f"prov-{provider}",
        provider_name=provider,
        kind=kind,
        base_url=None,
        model=model,
        price=Price(input_per_mtok="0.15", output_per_mtok="0.6"),
    )


def bundle(
    aliases: dict[str, list[ChainTarget]], allowed_models: list[str] | None = None
) -> ConfigBundle:
    return ConfigBundle(
        vk_id="vk-1",
        organization_id="org-1",
        project_id="proj-1",
        team_id="team-1",
        status="active",
        revision=7,
        limits=Limits(rpm=60, tpm=1_000),
        allowed_models=allowed_models,
        aliases=aliases,
        budgets=[
            BudgetState(
                budget_id="bud-1",
                name="monthly",
                scope_kind="project",
                scope_id="proj-1",
                window="month",
                limit_usd="10",
                on_breach="block",
            )
        ],
        expires_at="2026-04-01T00:00:00Z",
    )


def compile_bundle(source: ConfigBundle, providers: dict[str, MockProvider]) -> KeyRuntime:
    """The runtime a cache of its own compiles: nothing shared with another test's keys."""
    return RouteCache(providers).compile(source)


@pytest.fixture
def providers() -> dict[str, MockProvider]:
    return {"mock": MockProvider(ManualClock())}


ALIASES = {
    "fast": [target("first", "mock-small"), target("second", "mock-tiny")],
    "smart": [target("first", "mock-large")],
    "embed": [target("second", "mock-embed")],
}


def models(body: bytes) -> list[tuple[str, str]]:
    listing = json.loads(body)
    assert listing["object"] == "list"
    assert all(m["object"] == "model" for m in listing["data"])
    return [(m["id"], m["owned_by"]) for m in listing["data"]]


def test_every_alias_compiles_to_its_chain_in_order(providers: dict[str, MockProvider]) -> None:
    runtime = compile_bundle(bundle(ALIASES), providers)
    assert {alias: [u.model for u in chain] for alias, chain in runtime.chains.items()} == {
        "fast": ["mock-small", "mock-tiny"],
        "smart": ["mock-large"],
        "embed": ["mock-embed"],
    }
    upstream = runtime.chains["fast"][0]
    assert upstream.provider_name == "first"
    assert upstream.model_json == b'"mock-small"'
    assert upstream.adapter is providers["mock"]
    assert upstream.price == Price(input_per_mtok="0.15", output_per_mtok="0.6")
    assert runtime.not_allowed == frozenset()


def test_aliases_outside_allowed_models_are_not_allowed_rather_than_unknown(
    providers: dict[str, MockProvider],
) -> None:
    runtime = compile_bundle(bundle(ALIASES, allowed_models=["fast", "not-in-policy"]), providers)
    assert set(runtime.chains) == {"fast"}
    assert runtime.not_allowed == {"smart", "embed"}
    assert "not-in-policy" not in runtime.not_allowed


def test_empty_allowed_models_allows_nothing(providers: dict[str, MockProvider]) -> None:
    runtime = compile_bundle(bundle(ALIASES, allowed_models=[]), providers)
    assert runtime.chains == {}
    assert runtime.not_allowed == {"fast", "smart", "embed"}
    assert models(runtime.models_body) == []


def test_models_body_lists_exactly_the_usable_aliases_sorted(
    providers: dict[str, MockProvider],
) -> None:
    runtime = compile_bundle(bundle(ALIASES, allowed_models=["smart", "fast"]), providers)
    assert models(runtime.models_body) == [("fast", "first"), ("smart", "first")]


def test_a_provider_kind_this_proxy_cannot_call_is_left_out_of_the_chain(
    providers: dict[str, MockProvider], caplog: pytest.LogCaptureFixture
) -> None:
    aliases = {
        "fast": [target("future", "m1", kind="quantum"), target("first", "mock-small")],
        "only-future": [target("future", "m2", kind="quantum")],
    }
    runtime = compile_bundle(bundle(aliases), providers)
    assert [u.provider_name for u in runtime.chains["fast"]] == ["first"]
    # Still the key's alias (not a 404), but with nothing this proxy can call behind it.
    assert runtime.chains["only-future"] == ()
    # ... and not offered by GET /v1/models.
    assert models(runtime.models_body) == [("fast", "first")]
    assert "quantum" in caplog.text


def test_key_facts_are_carried_over(providers: dict[str, MockProvider]) -> None:
    source = bundle(ALIASES)
    runtime = compile_bundle(source, providers)
    assert (runtime.vk_id, runtime.organization_id, runtime.project_id, runtime.team_id) == (
        "vk-1",
        "org-1",
        "proj-1",
        "team-1",
    )
    assert runtime.revision == 7
    assert runtime.expires_at == datetime(2026, 4, 1, tzinfo=UTC).timestamp()
    assert runtime.limits == Limits(rpm=60, tpm=1_000)
    assert runtime.budgets == tuple(source.budgets)
    assert runtime.provider_ids == {"prov-first", "prov-second"}


def test_provider_ids_include_providers_of_aliases_the_key_may_not_use(
    providers: dict[str, MockProvider],
) -> None:
    """A change to any provider of the key's policy must reach it (it may be allowed later)."""
    runtime = compile_bundle(bundle(ALIASES, allowed_models=["smart"]), providers)
    assert runtime.provider_ids == {"prov-first", "prov-second"}


def test_compiled_runtime_cannot_be_changed_in_place(providers: dict[str, MockProvider]) -> None:
    runtime = compile_bundle(bundle(ALIASES), providers)
    with pytest.raises(dataclasses.FrozenInstanceError):
        runtime.revision = 8  # type: ignore[misc]


def test_a_key_without_expiry_has_none(providers: dict[str, MockProvider]) -> None:
    source = bundle(ALIASES)
    source.expires_at = None
    assert compile_bundle(source, providers).expires_at is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-03-10T12:00:00Z", datetime(2026, 3, 10, 12, tzinfo=UTC).timestamp()),
        ("2026-03-10T14:00:00+02:00", datetime(2026, 3, 10, 12, tzinfo=UTC).timestamp()),
        ("2026-03-10T12:00:00.250000Z", datetime(2026, 3, 10, 12, tzinfo=UTC).timestamp() + 0.25),
        (None, None),
        ("", None),
    ],
)
def test_unix_seconds_reads_rfc3339(value: str | None, expected: float | None) -> None:
    assert unix_seconds(value) == expected


@pytest.mark.parametrize(
    "credential",
    [{"api_key": "sk-a\n"}, {"headers": {"X-Tenant": "a\r\nX-Injected: 1"}}],
    ids=["api-key", "header"],
)
def test_a_credential_that_cannot_go_in_a_header_is_left_out_of_its_chain(
    providers: dict[str, MockProvider], credential: dict[str, Any]
) -> None:
    broken = msgspec.structs.replace(target("first", "mock-small"), **credential)
    runtime = compile_bundle(bundle({"fast": [broken, target("second", "mock-tiny")]}), providers)
    assert [u.provider_name for u in runtime.chains["fast"]] == ["second"]


def test_keys_with_the_same_routes_share_one_compiled_copy(
    providers: dict[str, MockProvider],
) -> None:
    routes = RouteCache(providers)
    first = routes.compile(bundle(ALIASES))
    second = routes.compile(msgspec.structs.replace(bundle(ALIASES), vk_id="vk-2"))
    assert second.vk_id == "vk-2"
    assert second.chains is first.chains
    assert second.models_body is first.models_body
    assert second.not_allowed is first.not_allowed
    assert second.provider_ids is first.provider_ids
    assert len(routes) == 1
    # What a request is served from is what compiling alone gives.
    alone = compile_bundle(bundle(ALIASES), providers)
    assert first.chains == alone.chains
    assert first.models_body == alone.models_body


@pytest.mark.parametrize(
    "change",
    [
        {"api_key": "sk-rotated"},
        {"headers": {"X-Tenant": "b"}},
        {"price": Price(input_per_mtok="0.2", output_per_mtok="0.6")},
        {"max_output_tokens": 4_096},
        {"model": "mock-medium"},
    ],
    ids=["api-key", "headers", "price", "output-cap", "model"],
)
def test_a_change_to_any_part_of_a_credential_compiles_new_routes(
    providers: dict[str, MockProvider], change: dict[str, Any]
) -> None:
    routes = RouteCache(providers)
    before = routes.compile(bundle({"fast": [target("first", "mock-small")]}))
    changed = msgspec.structs.replace(target("first", "mock-small"), **change)
    after = routes.compile(bundle({"fast": [changed]}))
    assert after.chains is not before.chains
    assert (
        after.chains["fast"]
        == compile_bundle(bundle({"fast": [changed]}), providers).chains["fast"]
    )


def test_keys_allowed_different_models_do_not_share_routes(
    providers: dict[str, MockProvider],
) -> None:
    routes = RouteCache(providers)
    every = routes.compile(bundle(ALIASES))
    some = routes.compile(bundle(ALIASES, allowed_models=["smart"]))
    assert set(every.chains) == {"fast", "smart", "embed"}
    assert set(some.chains) == {"smart"}
    assert some.not_allowed == {"fast", "embed"}


def test_the_route_cache_is_bounded_and_keys_keep_what_it_let_go(
    providers: dict[str, MockProvider],
) -> None:
    routes = RouteCache(providers, maxsize=2)
    kept = [routes.compile(bundle({"fast": [target("first", f"mock-{n}")]})) for n in range(5)]
    assert len(routes) == 2
    assert [k.chains["fast"][0].model for k in kept] == [f"mock-{n}" for n in range(5)]
    again = routes.compile(bundle({"fast": [target("first", "mock-0")]}))
    assert again.chains is not kept[0].chains
    assert again.chains == kept[0].chains


def test_keys_of_one_cache_scope_share_entries_only_where_their_routes_and_checks_agree(
    providers: dict[str, MockProvider],
) -> None:
    rule = CacheRuleState("cr-1", "organization", "org-1", ["*"], 60)

    def namespaces(source: ConfigBundle) -> dict[str, bytes]:
        runtime = compile_bundle(msgspec.structs.replace(source, cache_rules=[rule]), providers)
        return {alias: scope.namespace for alias, scope in runtime.cache_scopes.items()}

    plain = namespaces(bundle(ALIASES))
    assert set(plain) == set(ALIASES)
    assert all(ns.startswith(b"organization:org-1/") for ns in plain.values())
    assert namespaces(msgspec.structs.replace(bundle(ALIASES), vk_id="vk-2")) == plain
    rerouted = namespaces(bundle({**ALIASES, "smart": [target("second", "mock-large")]}))
    assert rerouted["smart"] != plain["smart"]
    assert rerouted["fast"] == plain["fast"]
    guardrail = GuardrailSpec("gr-1", "pii", "request", "pii", {}, "block")
    checked = namespaces(msgspec.structs.replace(bundle(ALIASES), guardrails=[guardrail]))
    assert all(checked[alias] != plain[alias] for alias in ALIASES)
    answers_only = msgspec.structs.replace(guardrail, stage="response")
    assert namespaces(msgspec.structs.replace(bundle(ALIASES), guardrails=[answers_only])) == plain
    capped = PolicyRule("cap", "max_output_tokens", OutputCap(100, "cap"))
    assert (
        namespaces(msgspec.structs.replace(bundle(ALIASES), rules=[capped]))["fast"]
        != plain["fast"]
    )


def test_a_moderation_guardrails_provider_is_among_the_keys_providers(
    providers: dict[str, MockProvider],
) -> None:
    moderator = target("moderator", "omni-moderation-latest", kind="openai")
    guardrail = GuardrailSpec("gr-1", "mod", "both", "moderation", {}, "block", target=moderator)
    runtime = compile_bundle(
        msgspec.structs.replace(bundle(ALIASES), guardrails=[guardrail]), providers
    )
    assert runtime.provider_ids == {"prov-first", "prov-second", "prov-moderator"}

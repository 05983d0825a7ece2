"""A key's config bundle compiled into the immutable object requests are served from.

Refresh builds a new `KeyRuntime` and swaps the reference, so a request never sees
half-applied config. The part a key's routing policy decides (its chains and models list) is
the same for every key of the policy: a `RouteCache` compiles it once and hands every such key
the same objects, so a cached key costs about a kilobyte rather than several.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec
from cachetools import LRUCache

from proxy.cache.rules import CacheScope, compile_rules
from proxy.guardrails import KeyGuardrails, guardrails_of
from proxy.limits.budgets import BudgetRule
from proxy.limits.budgets import rules_of as budget_rules_of
from proxy.limits.cost import rates_of
from proxy.limits.rates import RatePlan, plan_of
from proxy.providers import Provider, ProviderMisconfigured, Upstream
from proxy.rules import RuleSet, rules_of
from vkgate.clock import unix_seconds
from vkgate.wire import BudgetState, ChainTarget, ConfigBundle, Limits, header_safe

log = logging.getLogger("vkgate.proxy")


@dataclass(frozen=True, slots=True)
class KeyRuntime:
    vk_id: str
    organization_id: str
    project_id: str
    team_id: str | None
    revision: int
    expires_at: float | None
    """The key's own expiry, unix seconds."""
    chains: Mapping[str, tuple[Upstream, ...]]
    """Every alias this key may use, with its compiled credential chain."""
    not_allowed: frozenset[str]
    """Aliases of the key's policy outside its `allowed_models`: 403, not 404."""
    models_body: bytes
    """The `GET /v1/models` answer, encoded once."""
    provider_ids: frozenset[str]
    limits: Limits
    budgets: tuple[BudgetState, ...]
    rate_plan: RatePlan | None = None
    """The key's and its team's rate limits; None when it has none."""
    budget_rules: tuple[BudgetRule, ...] = ()
    """Every budget the key's requests may fall under."""
    rules: RuleSet | None = None
    """The rules of the key's routing policy that read requests; None when it has none."""
    guardrails: KeyGuardrails | None = None
    """The guardrails whose scope holds the key; None when none does."""
    denied: Mapping[str, str] = field(default_factory=dict)
    """Aliases a `deny_models` rule refuses (all of their chain, or the alias itself), each
    with the rule's name: 403 `policy_violation`."""
    cache_scopes: Mapping[str, CacheScope] = field(default_factory=dict)
    """The aliases whose answers are cached for this key, each under its rule's scope; empty
    for a key no cache rule covers (the cache step then costs one falsy check)."""


@dataclass(frozen=True, slots=True)
class Routes:
    """What a key's aliases and `allowed_models` compile to: shared by the keys that have the
    same ones. `KeyRuntime` holds each field itself (the same objects), so a request reaches a
    chain in one attribute step."""

    chains: Mapping[str, tuple[Upstream, ...]]
    not_allowed: frozenset[str]
    models_body: bytes
    provider_ids: frozenset[str]


ROUTE_CACHE_SIZE = 1_024
"""Distinct routes kept for sharing. One evicted is only compiled again for the next key that
has it; the keys holding it keep it."""
_encoder = msgspec.json.Encoder()


class RouteCache:
    """Compiled routes by a digest of everything they were compiled from (credentials,
    prices and all), so a change to any of it compiles anew and nothing stale is shared."""

    def __init__(self, providers: Mapping[str, Provider], maxsize: int = ROUTE_CACHE_SIZE) -> None:
        self._providers = providers
        self._routes: LRUCache[bytes, Routes] = LRUCache(maxsize)

    def __len__(self) -> int:
        return len(self._routes)

    def compile(self, bundle: ConfigBundle) -> KeyRuntime:
        """The bundle's runtime, its routes shared with the keys compiled before."""
        return runtime_of(bundle, self.routes(bundle))

    def routes(self, bundle: ConfigBundle) -> Routes:
        source = _encoder.encode((bundle.aliases, bundle.allowed_models))
        digest = hashlib.sha256(source).digest()
        routes = self._routes.get(digest)
        if routes is None:
            routes = self._routes[digest] = compile_routes(bundle, self._providers)
        return routes


def _unsendable(target: ChainTarget) -> str | None:
    """Which part of a credential cannot go in an HTTP header (a CR, LF or NUL), or None."""
    if target.api_key and not header_safe(target.api_key):
        return "api_key"
    if not all(header_safe(name) and header_safe(value) for name, value in target.headers.items()):
        return "headers"
    return None


def _without_denied(routes: Routes, rules: RuleSet) -> tuple[Routes, dict[str, str]]:
    """The routes with what `deny_models` rules refuse taken out: a denied alias whole, and a
    denied upstream model from its chains (an alias left with none is denied too)."""
    chains: dict[str, tuple[Upstream, ...]] = {}
    denied: dict[str, str] = {}
    for alias, chain in routes.chains.items():
        rule = rules.model_rule(alias)
        kept = chain if rule is not None else ()
        if rule is None:
            kept = tuple(u for u in chain if rules.model_rule(u.model) is None)
            if chain and not kept:
                rule = rules.model_rule(chain[0].model)
        if rule is not None:
            denied[alias] = rule
        else:
            chains[alias] = kept
    return dataclasses.replace(routes, chains=chains, models_body=_models_body(chains)), denied


_sorted_json = msgspec.json.Encoder(order="sorted")


def cache_variants(
    bundle: ConfigBundle, chains: Mapping[str, tuple[Upstream, ...]]
) -> dict[str, bytes]:
    """What decides a cached answer besides its scope and body, by alias: the alias's chain
    (two policies may send one alias to different models) and the checks a request passes
    before it is answered (policy rules and request-stage guardrails refuse or rewrite it). A
    hit skips those checks, so keys of one scope that differ in them must not share entries."""
    checks = hashlib.blake2b(digest_size=16)
    checks.update(_sorted_json.encode(bundle.rules))
    for spec in sorted(bundle.guardrails, key=lambda g: g.id):
        if spec.stage != "response":
            checks.update(
                _sorted_json.encode((spec.id, spec.kind, spec.action, spec.on_error, spec.config))
            )
    variants: dict[str, bytes] = {}
    for alias, chain in chains.items():
        digest = checks.copy()
        for upstream in chain:
            digest.update(f"{upstream.provider_id}\x00{upstream.model}\x00".encode())
        variants[alias] = digest.hexdigest().encode()
    return variants


def runtime_of(bundle: ConfigBundle, routes: Routes) -> KeyRuntime:
    """The key's runtime: its own facts from `bundle`, its routes as compiled (and shared)."""
    rules = rules_of(bundle.rules)
    denied: dict[str, str] = {}
    if rules is not None and rules.denies_models:
        routes, denied = _without_denied(routes, rules)
    return KeyRuntime(
        vk_id=bundle.vk_id,
        # Interned: thousands of cached keys of one organization keep one copy of each.
        organization_id=sys.intern(bundle.organization_id),
        project_id=sys.intern(bundle.project_id),
        team_id=None if bundle.team_id is None else sys.intern(bundle.team_id),
        revision=bundle.revision,
        expires_at=unix_seconds(bundle.expires_at),
        chains=routes.chains,
        not_allowed=routes.not_allowed,
        models_body=routes.models_body,
        # A moderation guardrail's credential too: its changes must reach the key as well.
        provider_ids=routes.provider_ids.union(
            g.target.provider_id for g in bundle.guardrails if g.target is not None
        )
        if bundle.guardrails
        else routes.provider_ids,
        limits=bundle.limits,
        budgets=tuple(bundle.budgets),
        rate_plan=plan_of(bundle.vk_id, bundle.team_id, bundle.limits, bundle.team_limits),
        budget_rules=budget_rules_of(bundle.budgets),
        rules=rules if rules is not None and rules.reads_requests else None,
        guardrails=guardrails_of(bundle.guardrails) if bundle.guardrails else None,
        denied=denied,
        cache_scopes=compile_rules(
            bundle.cache_rules, routes.chains, cache_variants(bundle, routes.chains)
        )
        if bundle.cache_rules
        else {},
    )


def compile_routes(bundle: ConfigBundle, providers: Mapping[str, Provider]) -> Routes:
    """Every alias of the bundle to its chain of upstreams this proxy can call."""
    allowed = set(bundle.allowed_models) if bundle.allowed_models is not None else None
    chains: dict[str, tuple[Upstream, ...]] = {}
    not_allowed: set[str] = set()
    for alias, targets in bundle.aliases.items():
        if allowed is not None and alias not in allowed:
            not_allowed.add(alias)
            continue
        compiled = []
        for target in targets:
            provider = providers.get(target.kind)
            if provider is None:
                # A kind this proxy version cannot call is left out of the chain, not guessed at.
                log.warning(
                    "provider kind %s of provider %s is not supported here; skipped",
                    target.kind,
                    target.provider_id,
                )
                continue
            if (part := _unsendable(target)) is not None:
                # Every call would fail (the head would end early): left out, not counted
                # against the provider's breaker call after call.
                log.warning(
                    "provider %s skipped: its %s holds a line break", target.provider_id, part
                )
                continue
            try:
                upstream = provider.compile(target)
                compiled.append(
                    dataclasses.replace(
                        upstream,
                        rates=rates_of(target.price, target.unit_price),
                        max_output_tokens=target.max_output_tokens,
                    )
                )
            except ProviderMisconfigured as exc:
                # A credential this proxy cannot call as configured is left out, like an unknown
                # kind: the rest of the chain still serves.
                log.warning("provider %s skipped: %s", target.provider_id, exc)
        chains[alias] = tuple(compiled)
    return Routes(
        chains=chains,
        not_allowed=frozenset(not_allowed),
        models_body=_models_body(chains),
        provider_ids=frozenset(t.provider_id for ts in bundle.aliases.values() for t in ts),
    )


def _models_body(chains: Mapping[str, tuple[Upstream, ...]]) -> bytes:
    models = {
        "object": "list",
        "data": [
            {
                "id": alias,
                "object": "model",
                "created": 0,
                "owned_by": chain[0].provider_name,
            }
            # An alias no credential of which this proxy can call is not offered.
            for alias, chain in sorted(chains.items())
            if chain
        ],
    }
    return msgspec.json.encode(models)

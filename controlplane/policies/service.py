"""Routing policy rules: every step of a chain names a provider of the policy's organization."""

from __future__ import annotations

from collections import defaultdict

import msgspec
from sqlalchemy import delete, func, select, update

from controlplane.errors import conflict, invalid, not_found
from controlplane.models import Organization, Provider, RoutingPolicy, RoutingTarget, VirtualKey
from controlplane.policies.schemas import OutputCap, PolicyCreate, PolicyUpdate, Rule, Target
from controlplane.schemas import nothing_given
from controlplane.security import new_id
from controlplane.state import Tx
from vkgate.wire import EventKind

REVOKED = "revoked"


async def aliases_of(tx: Tx, policy_id: str) -> dict[str, list[Target]]:
    rows = await tx.session.scalars(
        select(RoutingTarget)
        .where(RoutingTarget.policy_id == policy_id)
        .order_by(RoutingTarget.alias, RoutingTarget.position)
    )
    chains: dict[str, list[Target]] = defaultdict(list)
    for row in rows:
        chains[row.alias].append(Target(provider_id=row.provider_id, model=row.model))
    return dict(chains)


async def _write_targets(tx: Tx, policy: RoutingPolicy, aliases: dict[str, list[Target]]) -> None:
    wanted = {t.provider_id for chain in aliases.values() for t in chain}
    result = await tx.session.execute(
        select(Provider.id, Provider.organization_id).where(Provider.id.in_(wanted))
    )
    found = {provider_id: owner for provider_id, owner in result}
    for alias, chain in aliases.items():
        for position, target in enumerate(chain):
            where = f"aliases.{alias}[{position}].provider_id"
            owner = found.get(target.provider_id)
            if owner is None or not tx.sees(owner):
                raise not_found("provider", target.provider_id, param=where)
            if owner != policy.organization_id:
                raise invalid(
                    f"provider {target.provider_id!r} belongs to another organization", param=where
                )
            tx.session.add(
                RoutingTarget(
                    policy_id=policy.id,
                    alias=alias,
                    position=position,
                    provider_id=target.provider_id,
                    model=target.model,
                )
            )


async def _check_name_free(
    tx: Tx, organization_id: str, name: str, *, other_than: str = ""
) -> None:
    taken = await tx.session.scalar(
        select(RoutingPolicy.id).where(
            RoutingPolicy.organization_id == organization_id,
            RoutingPolicy.name == name,
            RoutingPolicy.id != other_than,
        )
    )
    if taken:
        raise conflict(
            f"a routing policy named {name!r} already exists in this organization", param="name"
        )


def checked_rules(rules: list[Rule]) -> list[dict[str, object]]:
    """The rules as stored, after checking what the schema alone cannot: names unique, and
    `values` of the shape the kind takes."""
    seen: set[str] = set()
    for i, rule in enumerate(rules):
        if rule.name in seen:
            raise invalid(f"two rules are named {rule.name!r}", param=f"rules[{i}].name")
        seen.add(rule.name)
        capped = rule.kind == "max_output_tokens"
        if capped != isinstance(rule.values, OutputCap):
            shape = (
                'an object {"limit": <tokens>, "action": "cap" | "refuse"}'
                if capped
                else "a list of strings"
            )
            raise invalid(
                f"rule {rule.name!r} of kind {rule.kind} takes {shape} as values",
                param=f"rules[{i}].values",
            )
        if not capped and not rule.values:
            raise invalid(f"rule {rule.name!r} has no values", param=f"rules[{i}].values")
    return [msgspec.to_builtins(rule) for rule in rules]


def rules_of(policy: RoutingPolicy) -> list[Rule]:
    return msgspec.convert(policy.rules or [], list[Rule])


async def create(tx: Tx, data: PolicyCreate) -> RoutingPolicy:
    await tx.get(Organization, data.organization_id, "organization", param="organization_id")
    await _check_name_free(tx, data.organization_id, data.name)
    now = tx.clock.now()
    policy = RoutingPolicy(
        id=new_id("rp"),
        organization_id=data.organization_id,
        name=data.name,
        rules=checked_rules(data.rules),
        created_at=now,
        updated_at=now,
    )
    tx.session.add(policy)
    await tx.session.flush()
    await _write_targets(tx, policy, data.aliases)
    await _record(tx, policy, EventKind.ROUTING_POLICY_UPDATED, "routing_policy.create")
    return policy


async def update_policy(tx: Tx, policy_id: str, data: PolicyUpdate) -> RoutingPolicy:
    policy = await tx.get(RoutingPolicy, policy_id, "routing policy")
    if nothing_given(data):
        return policy
    if data.name is not msgspec.UNSET and data.name != policy.name:
        await _check_name_free(tx, policy.organization_id, data.name, other_than=policy.id)
        policy.name = data.name
    if data.aliases is not msgspec.UNSET:
        await _check_aliases_kept(tx, policy.id, set(data.aliases))
        await tx.session.execute(delete(RoutingTarget).where(RoutingTarget.policy_id == policy.id))
        await _write_targets(tx, policy, data.aliases)
    if data.rules is not msgspec.UNSET:
        policy.rules = checked_rules(data.rules)
    policy.updated_at = tx.clock.now()
    await _record(tx, policy, EventKind.ROUTING_POLICY_UPDATED, "routing_policy.update")
    return policy


async def _check_aliases_kept(tx: Tx, policy_id: str, aliases: set[str]) -> None:
    """409 when a live key's allowed_models names an alias the new aliases drop."""
    keys = await tx.session.scalars(
        select(VirtualKey).where(
            VirtualKey.routing_policy_id == policy_id, VirtualKey.status != REVOKED
        )
    )
    for key in keys:
        dropped = sorted(set(key.allowed_models or ()) - aliases)
        if dropped:
            raise conflict(
                f"virtual key {key.id!r} allows {', '.join(dropped)}, which the new aliases "
                "drop; update the key's allowed_models first",
                param="aliases",
            )


async def delete_policy(tx: Tx, policy_id: str) -> None:
    policy = await tx.get(RoutingPolicy, policy_id, "routing policy")
    in_use = await tx.session.scalar(
        select(func.count(VirtualKey.id)).where(
            VirtualKey.routing_policy_id == policy_id, VirtualKey.status != REVOKED
        )
    )
    if in_use:
        raise conflict(f"routing policy {policy_id!r} is used by {in_use} virtual key(s)")
    # Revoked keys never route again; they keep their history but let go of the policy.
    await tx.session.execute(
        update(VirtualKey)
        .where(VirtualKey.routing_policy_id == policy_id)
        .values(routing_policy_id=None)
    )
    await _record(tx, policy, EventKind.ROUTING_POLICY_DELETED, "routing_policy.delete")
    await tx.session.delete(policy)


async def _record(tx: Tx, policy: RoutingPolicy, kind: EventKind, action: str) -> None:
    await tx.audit(
        action, "routing_policy", policy.id, policy.organization_id, {"name": policy.name}
    )
    await tx.event(
        kind,
        organization_id=policy.organization_id,
        entity_kind="routing_policy",
        entity_id=policy.id,
    )

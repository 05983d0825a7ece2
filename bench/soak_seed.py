"""The soak's seeding: one organization with the fake providers, a routing policy and five keys.

Three keys have no limits, `limited` has a requests-per-minute limit and `budgeted` a total
budget, both sized from `--rate` and `--minutes` so that they refuse part of the run's traffic.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import stack
from soak_traffic import (
    CLAUDE,
    CLAUDE_UPSTREAM,
    EMBED,
    EMBED_UPSTREAM,
    GPT,
    GPT_UPSTREAM,
    KEY_SHARES,
    KINDS,
    NANO,
    PRICES,
)
from soak_upstream import ANTHROPIC_KEY, OPENAI_KEY

LIMITED_RPM_SHARE = 1 / 3
"""The `limited` key's rpm, as a share of the requests a minute it gets: its bucket (capacity
the limit) runs dry after 30 s, then about two thirds of its requests are refused 429."""
BUDGET_SHARE_OF_RUN = 1 / 3


# -- seeding ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seeded:
    organization: str
    keys: dict[str, str]
    """Key name -> the `vk-…` secret."""
    key_ids: dict[str, str]
    """Key name -> its id (what ledger rows name)."""
    rpm: int
    budget_usd: Decimal


def seed(
    admin: stack.Admin, openai_url: str, anthropic_url: str, args: argparse.Namespace
) -> Seeded:
    org = admin.post("/api/admin/organizations", {"name": "soak"})["id"]
    project = admin.post("/api/admin/projects", {"organization_id": org, "name": "soak"})["id"]

    def provider(name: str, kind: str, url: str, key: str, models: list[str]) -> str:
        overrides = {
            m: {"input_per_mtok": PRICES[m][0], "output_per_mtok": PRICES[m][1]} for m in models
        }
        body = {
            "organization_id": org,
            "name": name,
            "kind": kind,
            "base_url": url,
            "api_key": key,
            "price_overrides": overrides,
        }
        return str(admin.post("/api/admin/providers", body)["id"])

    openai = provider("fake-openai", "openai", openai_url, OPENAI_KEY, [GPT, EMBED])
    anthropic = provider(
        "fake-anthropic", "anthropic", anthropic_url, ANTHROPIC_KEY, [CLAUDE_UPSTREAM]
    )
    policy = admin.post(
        "/api/admin/routing-policies",
        {
            "organization_id": org,
            "name": "soak",
            "aliases": {
                GPT: [{"provider_id": openai, "model": GPT_UPSTREAM}],
                EMBED: [{"provider_id": openai, "model": EMBED_UPSTREAM}],
                CLAUDE: [{"provider_id": anthropic, "model": CLAUDE_UPSTREAM}],
            },
        },
    )["id"]
    valid_share = sum(k.weight for k in KINDS if not k.invalid) / sum(k.weight for k in KINDS)
    per_key_rate = {
        name: args.rate * valid_share * share / 100 for name, share in KEY_SHARES.items()
    }
    rpm = max(int(per_key_rate["limited"] * 60 * LIMITED_RPM_SHARE), 1)
    valid = [k for k in KINDS if not k.invalid]
    mean_nano = sum(k.weight * k.cost_hint_nano for k in valid) / sum(k.weight for k in valid)
    budget_nano = mean_nano * per_key_rate["budgeted"] * args.minutes * 60 * BUDGET_SHARE_OF_RUN
    budget_usd = (Decimal(int(budget_nano)) / NANO).quantize(Decimal("0.000001"))
    keys, ids = {}, {}
    for name in KEY_SHARES:
        body: dict[str, Any] = {"project_id": project, "name": name, "routing_policy_id": policy}
        if name == "limited":
            body["limits"] = {"rpm": rpm}
        created = admin.post("/api/admin/virtual-keys", body)
        keys[name], ids[name] = str(created["key"]), str(created["id"])
    admin.post(
        "/api/admin/budgets",
        {
            "organization_id": org,
            "name": "soak-budgeted",
            "scope": {"kind": "virtual_key", "id": ids["budgeted"]},
            "window": "total",
            "limit_usd": str(budget_usd),
        },
    )
    return Seeded(org, keys, ids, rpm, budget_usd)

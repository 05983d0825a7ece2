"""What a busy budget costs the control plane when many cached keys, or many proxy workers,
share it.

Every segment the ledger takes under a budget appends a `BUDGET_UPDATED` to the change feed,
and every proxy worker hears it. This seeds an organization with one budget over the whole
organization and `--keys` keys, has a proxy of `--workers` workers cache every key (one request
each), then loads one key with wrk and counts, from the control plane's
`vkgate_controlplane_http_requests_total`, the calls each internal route took per second
meanwhile, with the control plane's CPU per request.

    .venv/bin/python bench/budget_refresh.py                  # 1 and 201 keys, 10 s each
    .venv/bin/python bench/budget_refresh.py --keys 1,1001 --duration 5s
    .venv/bin/python bench/budget_refresh.py --keys 1 --workers 1,2,4

Needs nginx and wrk (`apt-get install nginx-light wrk`).
"""

from __future__ import annotations

import argparse

import httpx
import stack
from stack import Admin, create_key, create_keys, metric_delta, print_table, scrape

ROUTES = ("config/{vk_id}", "changes", "spend-commands")
REQUESTS = "vkgate_controlplane_http_requests_total"


def measure(keys: int, workers: int, duration: str, concurrency: int) -> list[object]:
    with stack.stack("WARNING") as services:
        with Admin(services.controlplane, services.token) as admin:
            org = stack.seed_organization(
                admin, {"plain": services.upstream + "/v1"}, {stack.MODEL: ["plain"]}
            )
            admin.post(
                "/api/admin/budgets",
                {
                    "organization_id": org.id,
                    "scope": {"kind": "organization", "id": org.id},
                    "window": "month",
                    "limit_usd": "1000000",
                },
            )
            idle = create_keys(admin, org, keys - 1) if keys > 1 else []
            busy = str(create_key(admin, org, "busy")["key"])
        settings = {"VKGATE_LOG_LEVEL": "WARNING", "VKGATE_PROXY_WORKERS": str(workers)}
        if workers > 1:
            settings["VKGATE_METRICS_ADDR"] = "off"  # each worker would count alone
        with services.proxy(settings) as proxy:
            url = f"{proxy.url}/v1/chat/completions"
            body = {"model": stack.MODEL, "messages": [{"role": "user", "content": "hi"}]}
            with httpx.Client(timeout=30) as client:
                for key in [*idle, busy]:
                    answer = client.post(url, json=body, headers={"authorization": f"Bearer {key}"})
                    answer.raise_for_status()
            before = scrape(f"{services.controlplane}/metrics")
            cpu = stack.cpu_seconds(services.controlplane_pid)
            result = stack.wrk(url, concurrency, duration, {**services.env, "BENCH_KEY": busy})
            cpu = stack.cpu_seconds(services.controlplane_pid) - cpu
            after = scrape(f"{services.controlplane}/metrics")
    seconds = result.requests / max(result.rps, 1e-9)  # wrk's own elapsed time
    per_route = [
        metric_delta(before, after, REQUESTS, route=f"/api/internal/gateway/{route}") / seconds
        for route in ROUTES
    ]
    return [
        f"{keys:,}",
        workers,
        f"{result.rps:,.0f}",
        *(f"{n:,.1f}" for n in per_route),
        f"{cpu / max(result.requests, 1) * 1e6:,.0f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="1,201", help="keys under the budget, comma list")
    parser.add_argument("--workers", default="1", help="proxy workers, comma list")
    parser.add_argument("--duration", default="10s", help="wrk duration per run (default 10s)")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    stack.require("nginx", "wrk")
    rows = [
        measure(int(k), int(w), args.duration, args.concurrency)
        for k in args.keys.split(",")
        if k
        for w in args.workers.split(",")
        if w
    ]
    print_table(
        [
            "keys under the budget",
            "proxy workers",
            "RPS (one key)",
            *(f"{route} calls/s" for route in ROUTES),
            "control plane CPU µs/req",
        ],
        rows,
    )


if __name__ == "__main__":
    main()

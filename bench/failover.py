"""What failing over costs: a chain whose first credential answers 500 and whose second answers.

The nginx upstream (`upstream.nginx.conf`) answers `/fail/v1/chat/completions` with a 500 and
OpenAI's error body, and `/v1/chat/completions` with a 200. A key's alias routes to the failing
credential first and the working one second. wrk (`load.lua`) loads, at each concurrency:

- `upstream direct`: the working upstream alone, the baseline of the `added` columns;
- `healthy chain`: the proxy with an alias whose only credential works (one attempt each);
- `breaker closed`: a proxy whose breaker never opens (`VKGATE_CIRCUIT_THRESHOLD` set out of
  reach): every request pays the failed attempt, then the working one;
- `breaker open`: a proxy with the default breaker settings, after a warm-up that opened the
  failing credential's breaker: requests skip it without calling it.

`dead calls/req` is the calls to the failing credential per request during the run and
`dead skipped/req` the times it was passed over for its open breaker (both from the proxy's
`vkgate_provider_attempts_total`); `conns/1k req` the TCP connections the upstream accepted per
1,000 requests (nginx's `stub_status`): a pooled client, reusing connections, opens next to none.

    .venv/bin/python bench/failover.py                    # c=1,16, 5 s a run (~1 min)
    .venv/bin/python bench/failover.py --duration 3s --concurrency 16

Needs nginx and wrk (`apt-get install nginx-light wrk`).
"""

from __future__ import annotations

import argparse

import stack
from stack import Proxy, Stack, WrkResult, metric_delta, metric_sum, scrape

BREAKER_STATES = {0.0: "closed", 1.0: "half-open", 2.0: "open"}
NEVER = str(10**9)
"""A threshold no run reaches: the breaker stays closed."""
NOT_MEASURED = ("-", "-", "-", "-")
PHASES = ("upstream direct", "healthy chain", "breaker closed", "breaker open")
"""The table's order (the runs' order differs: the open phase reuses the healthy one's proxy)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", default="5s", help="wrk duration per run (default 5s)")
    parser.add_argument("--concurrency", default="1,16", help="comma list (default 1,16)")
    stack.add_service_arguments(parser)
    args = parser.parse_args()
    stack.require("nginx", "wrk")
    concurrencies = [int(c) for c in args.concurrency.split(",") if c]
    extra = stack.proxy_env_args(args.proxy_env)
    threshold = stack.proxy_default("circuit_threshold")
    window = stack.proxy_default("circuit_window_s")
    cooldown = stack.proxy_default("circuit_cooldown_s")
    rows: list[tuple[str, int, WrkResult, str, str, str, str]] = []
    with stack.stack(args.log_level) as services:
        with services.admin() as admin:
            org = stack.seed_organization(
                admin,
                {"dead": services.upstream + "/fail/v1", "live": services.upstream + "/v1"},
                {"gpt-4o-mini": ["live"], "gpt-4o-mini-failover": ["dead", "live"]},
            )
            key = str(stack.create_key(admin, org)["key"])
        direct = f"{services.upstream}/v1/chat/completions"
        load = {**services.env, "BENCH_KEY": "", "BENCH_MODEL": "gpt-4o-mini"}
        stack.wrk(direct, 16, "2s", load)  # warm-up, not recorded
        for c in concurrencies:
            rows.append(
                ("upstream direct", c, stack.wrk(direct, c, args.duration, load), *NOT_MEASURED)
            )

        closed = {**extra, "VKGATE_CIRCUIT_THRESHOLD": NEVER}
        with services.proxy(closed, "breaker-closed") as proxy:
            measure(rows, "breaker closed", services, proxy, key, concurrencies, args.duration)
        with services.proxy(extra, "breaker-default") as proxy:
            measure(
                rows, "healthy chain", services, proxy, key, concurrencies, args.duration, False
            )
            measure(rows, "breaker open", services, proxy, key, concurrencies, args.duration)
    print_table(rows)
    print(
        f"\nBreaker defaults (proxy/settings.py): opens after {threshold} failures in {window:g} s,"
        f" one probe after {cooldown:g} s; the closed phase sets VKGATE_CIRCUIT_THRESHOLD={NEVER}."
    )


def measure(
    rows: list[tuple[str, int, WrkResult, str, str, str, str]],
    phase: str,
    services: Stack,
    proxy: Proxy,
    key: str,
    concurrencies: list[int],
    duration: str,
    failover: bool = True,
) -> None:
    model = "gpt-4o-mini-failover" if failover else "gpt-4o-mini"
    load = {**services.env, "BENCH_KEY": key, "BENCH_MODEL": model}
    url = f"{proxy.url}/v1/chat/completions"
    stack.wrk(url, 16, "2s", load)  # warm-up, not recorded: opens the breaker where it can
    for c in concurrencies:
        before = scrape(proxy.metrics)
        conns = stack.upstream_connections(services.upstream)
        result = stack.wrk(url, c, duration, load)
        conns = stack.upstream_connections(services.upstream) - conns
        after = scrape(proxy.metrics)

        attempts = "vkgate_provider_attempts_total"
        called = metric_delta(before, after, attempts, provider="dead", result="provider_error")
        skipped = metric_delta(before, after, attempts, provider="dead", result="circuit_open")
        if not failover:
            state = "-"
        else:
            value = metric_sum(after, "vkgate_breaker_state", provider="dead")
            state = BREAKER_STATES.get(value, str(value))
        requests = max(result.requests, 1)
        rows.append(
            (
                phase,
                c,
                result,
                f"{called / requests:.3f}",
                f"{skipped / requests:.3f}",
                f"{conns * 1000 / requests:.1f}",
                state,
            )
        )


def print_table(rows: list[tuple[str, int, WrkResult, str, str, str, str]]) -> None:
    base = {c: r for phase, c, r, *_ in rows if phase == "upstream direct"}
    table = []
    for phase, c, r, dead, skipped, conns, state in sorted(rows, key=lambda x: PHASES.index(x[0])):
        ref = None if phase == "upstream direct" else base.get(c)
        table.append(
            (
                phase,
                c,
                f"{r.rps:,.0f}",
                f"{r.p50_ms:.3f}",
                f"{r.p99_ms:.3f}",
                "-" if ref is None else f"{r.p50_ms - ref.p50_ms:.3f}",
                "-" if ref is None else f"{r.p99_ms - ref.p99_ms:.3f}",
                f"{r.non2xx + r.errors}",
                dead,
                skipped,
                conns,
                state,
            )
        )
    stack.print_table(
        (
            "phase",
            "c",
            "RPS",
            "p50 ms",
            "p99 ms",
            "added p50 ms",
            "added p99 ms",
            "errors",
            "dead calls/req",
            "dead skipped/req",
            "conns/1k req",
            "breaker after",
        ),
        table,
    )


if __name__ == "__main__":
    main()

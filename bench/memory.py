"""The proxy's memory: RSS after start, with 10,000 keys cached, and over 100,000 requests.

Creates `--keys` virtual keys through the admin API (concurrent POSTs: there is no bulk route),
starts a proxy in front of the nginx upstream of `upstream.nginx.conf` and reads its resident
memory (RSS, /proc, the process and any workers) after start, after one request with each key
(every key is then in the auth cache), and after every `--every` of `--requests` further
requests, which take the keys in turn (all cache hits). wrk (`keys.lua`, c=16) sends them,
stopped after each batch's count; RSS is read between batches. `growth after warm-up` compares
the last reading with the one after the first batch of hits.

Each batch also shows the proxy's CPU per request and what it cost the control plane: the
resolve-key and config calls it answered (from its `/metrics`; a cached key's config is fetched
again in the background every `VKGATE_AUTH_CACHE_CONFIG_TTL_SECONDS`) and its CPU time, and
each reading the control plane's RSS too (it ingests every request's spend record).

The auth cache holds `VKGATE_AUTH_CACHE_MAX_ENTRIES` keys (default 10,000): raised to `--keys`
for the run when smaller, and said so.

    .venv/bin/python bench/memory.py      # 10,000 keys, 100,000 requests: ~4-5 min here, most
                                          # of it creating (~100/s) and first resolving the keys
    .venv/bin/python bench/memory.py --keys 1000 --requests 20000 --every 5000   # ~45 s

Needs nginx and wrk (`apt-get install nginx-light wrk`).
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass

import stack
from stack import Proxy, WrkResult, metric_delta, metric_sum, scrape

MIB = 1024 * 1024


@dataclass(frozen=True)
class Batch:
    """One wrk batch, and what it cost the proxy and the control plane."""

    result: WrkResult
    requests: int
    proxy_cpu_s: float
    controlplane_cpu_s: float
    resolves: float
    configs: float
    """Config bundle fetches (full or 304), background refreshes included."""


@dataclass(frozen=True)
class Reading:
    stage: str
    requests: int
    rss: int
    controlplane_rss: int
    entries: float
    batch: Batch | None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=10_000, help="distinct keys (10,000)")
    parser.add_argument("--requests", type=int, default=100_000, help="after caching (100,000)")
    parser.add_argument("--every", type=int, default=10_000, help="requests a batch (10,000)")
    parser.add_argument("--concurrency", type=int, default=16, help="wrk connections (16)")
    parser.add_argument("--create-concurrency", type=int, default=4, help="admin POSTs at once (4)")
    parser.add_argument(
        "--batch-timeout", type=int, default=120, help="seconds a batch may take at most (120)"
    )
    parser.add_argument(
        "--caching-timeout",
        type=int,
        default=600,
        help="seconds the first pass, one request per key (each resolved by the control plane), "
        "may take at most (600)",
    )
    stack.add_service_arguments(parser)
    args = parser.parse_args()
    stack.require("nginx", "wrk")
    extra = stack.proxy_env_args(args.proxy_env)
    notes = []
    cache_size = stack.proxy_default("auth_cache_size")
    if "VKGATE_AUTH_CACHE_MAX_ENTRIES" not in extra and cache_size < args.keys:
        extra["VKGATE_AUTH_CACHE_MAX_ENTRIES"] = str(args.keys)
        notes.append(
            f"VKGATE_AUTH_CACHE_MAX_ENTRIES raised from its default {cache_size:,} to "
            f"{args.keys:,} for this run."
        )
    readings: list[Reading] = []
    with stack.stack(args.log_level) as services:
        with services.admin() as admin:
            org = stack.seed_organization(
                admin, {"plain": services.upstream + "/v1"}, {"gpt-4o-mini": ["plain"]}
            )
            started = time.monotonic()
            keys = stack.create_keys(admin, org, args.keys, concurrency=args.create_concurrency)
            took = time.monotonic() - started
        notes.append(
            f"{args.keys:,} keys created through the admin API in {took:.1f} s "
            f"({args.keys / took:,.0f}/s, {args.create_concurrency} POSTs at once)."
        )
        keys_file = services.work / "keys.txt"
        descriptor = os.open(keys_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write("\n".join(keys) + "\n")
        load = {**services.env, "BENCH_KEYS_FILE": str(keys_file)}
        cp_metrics = f"{services.controlplane}/metrics"
        with services.proxy(extra) as proxy:
            url = f"{proxy.url}/v1/chat/completions"

            def batch(n: int, timeout: int = args.batch_timeout) -> Batch:
                cpu = stack.cpu_seconds(proxy.pid)
                cp_cpu = stack.cpu_seconds(services.controlplane_pid)
                before = scrape(cp_metrics)
                result = stack.wrk_count(
                    url, args.concurrency, n, load, "keys.lua", services.work, timeout
                )
                after = scrape(cp_metrics)
                return Batch(
                    result,
                    n,
                    stack.cpu_seconds(proxy.pid) - cpu,
                    stack.cpu_seconds(services.controlplane_pid) - cp_cpu,
                    metric_delta(before, after, "vkgate_controlplane_resolve_key_total"),
                    metric_delta(before, after, "vkgate_controlplane_config_total"),
                )

            time.sleep(1.0)  # start-up work (feed, spool) settles
            readings.append(reading(proxy, services, "started", 0, None))
            # keys.lua takes the keys in turn: the first `--keys` requests name each key once.
            # Bounded apart: its pace is the control plane's, a resolve-key call per key
            # (93-129 keys/s measured on 2 shared cores, 16 at once).
            cached = batch(args.keys, args.caching_timeout)
            readings.append(
                reading(proxy, services, f"{args.keys:,} keys cached", args.keys, cached)
            )
            served = 0
            while served < args.requests:
                hits = batch(min(args.every, args.requests - served))
                served += hits.requests
                readings.append(
                    reading(proxy, services, f"+{served:,} requests", args.keys + served, hits)
                )
    print_table(readings)
    for note in notes:
        print(note)


def reading(
    proxy: Proxy, services: stack.Stack, stage: str, requests: int, batch: Batch | None
) -> Reading:
    entries = metric_sum(scrape(proxy.metrics), "vkgate_auth_cache_entries")
    rss, controlplane_rss = stack.rss_bytes(proxy.pid), stack.rss_bytes(services.controlplane_pid)
    return Reading(stage, requests, rss, controlplane_rss, entries, batch)


def print_table(readings: list[Reading]) -> None:
    table = []
    previous: Reading | None = None
    for r in readings:
        b = r.batch
        if b is None:
            cells: tuple[str, ...] = ("-",) * 6
        else:
            cells = (
                f"{b.result.rps:,.0f}",
                f"{b.result.p99_ms:.3f}",
                f"{b.proxy_cpu_s * 1000 / b.requests:.3f}",
                f"{b.resolves:,.0f} / {b.configs:,.0f}",
                f"{b.controlplane_cpu_s:.1f}",
                f"{b.result.non2xx + b.result.errors}",
            )
        table.append(
            (
                r.stage,
                f"{r.requests:,}",
                f"{r.rss / MIB:.1f}",
                "-" if previous is None else f"{(r.rss - previous.rss) / MIB:+.1f}",
                f"{r.entries:,.0f}",
                *cells,
                f"{r.controlplane_rss / MIB:.1f}",
            )
        )
        previous = r
    stack.print_table(
        (
            "stage",
            "requests",
            "RSS MiB",
            "change MiB",
            "cached keys",
            "batch RPS",
            "batch p99 ms",
            "proxy CPU ms/req",
            "CP resolve-key / config calls",
            "CP CPU s",
            "batch errors",
            "CP RSS MiB",
        ),
        table,
    )
    # Warm-up: the key-caching pass and the first batch of hits.
    if len(readings) >= 4:
        warm, last = readings[2], readings[-1]
        growth = (last.rss - warm.rss) / warm.rss
        print(
            f"\nGrowth after warm-up ({warm.stage} -> {last.stage}): "
            f"{(last.rss - warm.rss) / MIB:+.1f} MiB ({growth:+.1%})."
        )


if __name__ == "__main__":
    main()

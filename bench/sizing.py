"""What 1,000 requests per second cost each part of a deployment: CPU cores and memory.

Starts the nginx upstream and a control plane (the ledger owner: it ingests the proxy's spend
as it comes), then for each counter store a one-worker proxy on a key with every governance
feature on (rate limits, a concurrency limit and a budget), loads it with wrk and divides the
CPU time each process used by the requests served: the proxy, the control plane, and Redis
(from its own `INFO cpu`, when the proxy counts there). The figures are per 1,000 requests a
second, so a deployment's share is `its rate / 1,000 * the figure`, plus headroom.

    .venv/bin/python bench/sizing.py                       # local and redis counters, 10 s each
    .venv/bin/python bench/sizing.py --stores local --duration 20

Needs nginx and wrk (`apt-get install nginx-light wrk`), and Redis for `redis`.
"""

from __future__ import annotations

import argparse
import time

import redis
import stack
from proxy_overhead import seed

MIB = 1024 * 1024


def redis_cpu_seconds(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def measure(
    services: stack.Stack,
    store: str,
    key: str,
    args: argparse.Namespace,
) -> list[object]:
    extra = {"VKGATE_REDIS_URL": args.redis_url} if store == "redis" else {}
    client = redis.Redis.from_url(args.redis_url) if store == "redis" else None
    with services.proxy(extra, f"proxy-{store}") as proxy:
        env = {**services.env, "BENCH_KEY": key, "BENCH_MODEL": "gpt-4o-mini"}
        url = f"{proxy.url}/v1/chat/completions"
        stack.wrk(url, args.concurrency, "2s", env)  # warm: caches, connections, buckets
        time.sleep(args.settle)  # the warm-up's spend shipped before the window opens
        p0, c0 = stack.cpu_seconds(proxy.pid), stack.cpu_seconds(services.controlplane_pid)
        r0 = redis_cpu_seconds(client) if client is not None else 0.0
        result = stack.wrk(url, args.concurrency, f"{args.duration}s", env)
        time.sleep(args.settle)  # what was spooled during the run is shipped and ingested
        p1, c1 = stack.cpu_seconds(proxy.pid), stack.cpu_seconds(services.controlplane_pid)
        r1 = redis_cpu_seconds(client) if client is not None else 0.0
        rss = stack.rss_bytes(proxy.pid)
    if client is not None:
        client.close()
    if result.non2xx or result.errors:
        print(f"  warning: {store}: {result.non2xx} non-2xx, {result.errors} socket errors")
    per_thousand = 1000 / result.requests  # CPU seconds per request * 1,000 requests a second
    return [
        store,
        f"{result.rps:,.0f}",
        f"{(p1 - p0) * per_thousand:.2f}",
        f"{(c1 - c0) * per_thousand:.2f}",
        f"{(r1 - r0) * per_thousand:.2f}" if client is not None else "-",
        f"{rss / MIB:.0f}",
        f"{stack.rss_bytes(services.controlplane_pid) / MIB:.0f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", default="local,redis", help="comma list of local, redis")
    parser.add_argument("--duration", type=int, default=10, help="wrk seconds per store")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--settle", type=float, default=3.0, help="seconds for spend to ship around each run"
    )
    args = parser.parse_args()
    stack.require("nginx", "wrk")
    rows = []
    with stack.stack() as services:
        _, governed = seed(services.controlplane, services.token, services.upstream)
        for store in args.stores.split(","):
            rows.append(measure(services, store.strip(), governed, args))
    print(
        f"\nCPU cores per 1,000 requests/s (governed key, wrk c={args.concurrency}, "
        f"{args.duration} s, one proxy worker; all processes share this machine's cores)"
    )
    stack.print_table(
        [
            "counters",
            "RPS",
            "proxy cores",
            "control plane cores",
            "Redis cores",
            "proxy RSS MiB",
            "control plane RSS MiB",
        ],
        rows,
    )


if __name__ == "__main__":
    main()

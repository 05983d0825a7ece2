"""What 1,000 requests per second cost each part of a deployment: CPU cores and memory.

Starts the nginx upstream and a control plane (the ledger owner: it ingests the proxy's spend
as it comes), then for each counter store a one-worker proxy on a key with every governance
feature on (rate limits, a concurrency limit and a budget), loads it with wrk and divides the
CPU time each process used by the requests served: the proxy, the control plane, and Redis
(from its own `INFO cpu` and `INFO commandstats`, when the proxy counts there). The figures are
per 1,000 requests a second, so a deployment's share is `its rate / 1,000 * the figure`, plus
headroom. `--rounds` repeats the stores in turn (local, redis, local, redis, ...) and prints
each figure's range over the rounds: on a shared machine one run says little.

The Redis is a `redis-server` of the benchmark's own on a free port (its CPU and calls are then
the proxy's alone), unless `--redis-url` names one.

    .venv/bin/python bench/sizing.py                       # local and redis counters, 10 s each
    .venv/bin/python bench/sizing.py --stores local --duration 20
    .venv/bin/python bench/sizing.py --rounds 3

Needs nginx and wrk (`apt-get install nginx-light wrk`), and redis-server for `redis`.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import redis
import stack
from proxy_overhead import seed

MIB = 1024 * 1024


def redis_cpu_seconds(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def redis_calls(client: redis.Redis) -> int:
    """Script calls clients made (the proxy calls Redis only through scripts)."""
    stats = client.info("commandstats")
    return sum(
        int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "eval")
    )


@contextlib.contextmanager
def own_redis() -> Iterator[str]:
    """A `redis-server` of this run's own, stopped by its PID at the end."""
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is needed for the redis store (or give --redis-url)")
    port = stack.free_port()
    with tempfile.TemporaryDirectory(prefix="vkgate-sizing-redis-") as work:
        args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", work]
        with stack.started(args, {}, Path(work) / "redis.log") as process:
            url = f"redis://127.0.0.1:{port}/0"
            client = redis.Redis.from_url(url)
            deadline = time.monotonic() + 10
            while True:
                try:
                    client.ping()
                    break
                except redis.exceptions.ConnectionError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit("redis-server did not start") from None
                    time.sleep(0.05)
            client.close()
            yield url


def spread(values: list[float], digits: int = 2) -> str:
    """A figure over the rounds: one value, or `min-max`."""
    low, high = min(values), max(values)
    if f"{low:.{digits}f}" == f"{high:.{digits}f}":
        return f"{low:,.{digits}f}"
    return f"{low:,.{digits}f}-{high:,.{digits}f}"


def measure(
    services: stack.Stack,
    store: str,
    key: str,
    args: argparse.Namespace,
) -> list[float]:
    """RPS, then per 1,000 requests a second: proxy, control plane and Redis cores, Redis calls
    per request; proxy and control plane RSS in MiB."""
    extra = {"VKGATE_REDIS_URL": args.redis_url} if store == "redis" else {}
    client = redis.Redis.from_url(args.redis_url) if store == "redis" else None
    with services.proxy(extra, f"proxy-{store}") as proxy:
        env = {**services.env, "BENCH_KEY": key, "BENCH_MODEL": "gpt-4o-mini"}
        url = f"{proxy.url}/v1/chat/completions"
        stack.wrk(url, args.concurrency, "2s", env)  # warm: caches, connections, buckets
        time.sleep(args.settle)  # the warm-up's spend shipped before the window opens
        p0, c0 = stack.cpu_seconds(proxy.pid), stack.cpu_seconds(services.controlplane_pid)
        r0 = redis_cpu_seconds(client) if client is not None else 0.0
        n0 = redis_calls(client) if client is not None else 0
        result = stack.wrk(url, args.concurrency, f"{args.duration}s", env)
        time.sleep(args.settle)  # what was spooled during the run is shipped and ingested
        p1, c1 = stack.cpu_seconds(proxy.pid), stack.cpu_seconds(services.controlplane_pid)
        r1 = redis_cpu_seconds(client) if client is not None else 0.0
        n1 = redis_calls(client) if client is not None else 0
        rss = stack.rss_bytes(proxy.pid)
    if client is not None:
        client.close()
    if result.non2xx or result.errors:
        print(f"  warning: {store}: {result.non2xx} non-2xx, {result.errors} socket errors")
    per_thousand = 1000 / result.requests  # CPU seconds per request * 1,000 requests a second
    # Redis's figures span the settling waits too: every call the run caused, ticks included.
    return [
        result.rps,
        (p1 - p0) * per_thousand,
        (c1 - c0) * per_thousand,
        (r1 - r0) * per_thousand,
        (n1 - n0) / result.requests,
        rss / MIB,
        stack.rss_bytes(services.controlplane_pid) / MIB,
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", default="local,redis", help="comma list of local, redis")
    parser.add_argument("--duration", type=int, default=10, help="wrk seconds per store")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--redis-url", help="a Redis to use instead of one of the run's own")
    parser.add_argument("--rounds", type=int, default=1, help="times each store is measured")
    parser.add_argument(
        "--settle", type=float, default=3.0, help="seconds for spend to ship around each run"
    )
    args = parser.parse_args()
    stack.require("nginx", "wrk")
    stores = [store.strip() for store in args.stores.split(",")]
    figures: dict[str, list[list[float]]] = {store: [] for store in stores}
    with contextlib.ExitStack() as cleanup:
        if args.redis_url is None and "redis" in stores:
            args.redis_url = cleanup.enter_context(own_redis())
        with stack.stack() as services:
            _, governed = seed(services.controlplane, services.token, services.upstream)
            for _ in range(args.rounds):
                for store in stores:
                    figures[store].append(measure(services, store, governed, args))
    print(
        f"\nCPU cores per 1,000 requests/s (governed key, wrk c={args.concurrency}, "
        f"{args.duration} s, one proxy worker, {args.rounds} round(s); all processes share "
        "this machine's cores)"
    )
    rows = []
    for store, runs in figures.items():
        columns = list(zip(*runs, strict=True))
        shared = store == "redis"
        rows.append(
            [
                store,
                spread(list(columns[0]), 0),
                spread(list(columns[1])),
                spread(list(columns[2])),
                spread(list(columns[3]), 3) if shared else "-",
                spread(list(columns[4]), 3) if shared else "-",
                spread(list(columns[5]), 0),
                spread(list(columns[6]), 0),
            ]
        )
    stack.print_table(
        [
            "counters",
            "RPS",
            "proxy cores",
            "control plane cores",
            "Redis cores",
            "Redis calls / request",
            "proxy RSS MiB",
            "control plane RSS MiB",
        ],
        rows,
    )


if __name__ == "__main__":
    main()

"""What the proxy adds on top of its upstream: requests per second and added latency.

Starts a fixed-answer nginx upstream, a control plane and a proxy (one worker), creates a key routed to the upstream, then loads the upstream directly and through
the proxy with wrk at each concurrency and prints one table. Everything runs on loopback,
every step is bounded by wrk's duration, and only the processes started here are stopped.

    .venv/bin/python bench/proxy_overhead.py                       # uvicorn, c=1,16,64, 10 s
    .venv/bin/python bench/proxy_overhead.py --duration 5 --concurrency 1,16
    .venv/bin/python bench/proxy_overhead.py --governance none,local,redis

`--governance` picks the keys measured: `none` (no limits, no budget), `local` (a key with rpm,
tpm, rpd and max_concurrency limits and a budget, counters in-process) and `redis` (the same
key, with the proxy's counters in Redis at `--redis-url`): the difference is what rate limits
and budget reservations cost per request.

Needs nginx and wrk (`apt-get install nginx-light wrk`).
"""

from __future__ import annotations

import argparse

import stack
from stack import Admin, create_key, free_port, require, seed_organization, started, wait_ok

# Other scripts (bench/peers/) start their services with these.
__all__ = ["free_port", "seed", "seed_cached", "started", "wait_ok"]


def wrk(url: str, concurrency: int, duration: str, env: dict[str, str]) -> tuple[float, ...]:
    result = stack.wrk(url, concurrency, duration, env)
    if result.non2xx or result.errors:
        print(
            f"  warning: {url} c={concurrency}: {result.non2xx} non-2xx, "
            f"{result.errors} socket errors"
        )
    return result.rps, result.p50_ms, result.p99_ms, float(result.requests)


# High enough never to refuse during a run, so every request pays for every check.
GOVERNED_LIMITS = {"rpm": 10**9, "tpm": 10**12, "rpd": 10**9, "max_concurrency": 100_000}


def seed(controlplane: str, token: str, upstream: str) -> tuple[str, str]:
    """An organization whose keys route gpt-4o-mini (and -stream) to the upstream: one plain
    key, and one with rate limits and a budget."""
    with Admin(controlplane, token) as admin:
        org = seed_organization(
            admin,
            {"plain": upstream + "/v1", "stream": upstream + "/stream/v1"},
            {"gpt-4o-mini": ["plain"], "gpt-4o-mini-stream": ["stream"]},
        )
        key = create_key(admin, org)
        governed = create_key(admin, org, "bench-governed", GOVERNED_LIMITS)
        admin.post(
            "/api/admin/budgets",
            {
                "organization_id": org.id,
                "scope": {"kind": "virtual_key", "id": governed["id"]},
                "window": "month",
                "limit_usd": "1000000",
            },
        )
        return str(key["key"]), str(governed["key"])


def seed_cached(controlplane: str, token: str, upstream: str) -> str:
    """A governed key like `seed`'s (its own organization, the same routes, limits and budget)
    whose requests for gpt-4o-mini (and -stream) a cache rule scoped to it lets the proxy answer
    from its response cache: after the first request of each body, every one is a hit."""
    with Admin(controlplane, token) as admin:
        org = seed_organization(
            admin,
            {"plain": upstream + "/v1", "stream": upstream + "/stream/v1"},
            {"gpt-4o-mini": ["plain"], "gpt-4o-mini-stream": ["stream"]},
            name="bench-cached",
        )
        cached = create_key(admin, org, "bench-cached", GOVERNED_LIMITS)
        admin.post(
            "/api/admin/budgets",
            {
                "organization_id": org.id,
                "scope": {"kind": "virtual_key", "id": cached["id"]},
                "window": "month",
                "limit_usd": "1000000",
            },
        )
        admin.post(
            "/api/admin/cache-rules",
            {
                "organization_id": org.id,
                "name": "bench-cached",
                "scope": {"kind": "virtual_key", "id": cached["id"]},
                "models": ["gpt-4o-mini*"],
                "ttl_seconds": 3600,
            },
        )
        return str(cached["key"])


def seed_clouds(controlplane: str, token: str, upstream: str) -> tuple[str, str]:
    """Two governed keys whose policies route gpt-4o-mini (and -stream) to a `bedrock`
    credential and to a `gemini` one at the upstream (its Converse and generateContent
    answers): the bedrock key's requests are translated and signed, the gemini key's
    translated."""
    keys = []
    with Admin(controlplane, token) as admin:
        org = admin.post("/api/admin/organizations", {"name": "bench-clouds"})["id"]
        project = admin.post("/api/admin/projects", {"organization_id": org, "name": "clouds"})
        clouds = {
            "bedrock": (
                {
                    "region": "us-east-1",
                    "aws_access_key_id": "AKIABENCHMARKKEY0001",
                    "aws_secret_access_key": "bench/secret/key/0123456789abcdefghijklmn",
                },
                "amazon.nova-lite-v1:0",
            ),
            "gemini": ({"api_key": "AIza-bench-upstream"}, "gemini-2.5-flash"),
        }
        for kind, (fields, model) in clouds.items():
            provider = admin.post(
                "/api/admin/providers",
                {
                    "organization_id": org,
                    "name": kind,
                    "kind": kind,
                    "base_url": upstream,
                    **fields,
                },
            )["id"]
            chain = [{"provider_id": provider, "model": model}]
            policy = admin.post(
                "/api/admin/routing-policies",
                {
                    "organization_id": org,
                    "name": kind,
                    "aliases": {"gpt-4o-mini": chain, "gpt-4o-mini-stream": chain},
                },
            )["id"]
            key = admin.post(
                "/api/admin/virtual-keys",
                {
                    "project_id": project["id"],
                    "name": kind,
                    "routing_policy_id": policy,
                    "limits": GOVERNED_LIMITS,
                },
            )
            admin.post(
                "/api/admin/budgets",
                {
                    "organization_id": org,
                    "scope": {"kind": "virtual_key", "id": key["id"]},
                    "window": "month",
                    "limit_usd": "1000000",
                },
            )
            keys.append(str(key["key"]))
    return keys[0], keys[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", default="10s", help="wrk duration per run (default 10s)")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--stream-concurrency", default="1,16", help="empty to skip streams")
    parser.add_argument(
        "--governance", default="none", help="comma list of none, local, redis (keys measured)"
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    stack.add_service_arguments(parser)
    args = parser.parse_args()
    modes = [m for m in args.governance.split(",") if m]
    if set(modes) - {"none", "local", "redis"}:
        raise SystemExit("--governance takes none, local and redis")
    require("nginx", "wrk")
    concurrencies = [int(c) for c in args.concurrency.split(",") if c]
    stream_concurrencies = [int(c) for c in args.stream_concurrency.split(",") if c]
    rows: list[tuple[str, str, int, tuple[float, ...]]] = []
    with stack.stack(args.log_level) as services:
        env, upstream = services.env, services.upstream
        plain_key, governed_key = seed(services.controlplane, services.token, upstream)
        direct = {
            "plain": f"{upstream}/v1/chat/completions",
            "stream": f"{upstream}/stream/v1/chat/completions",
        }
        measure(
            rows,
            "upstream direct",
            direct,
            "",
            concurrencies,
            stream_concurrencies,
            args.duration,
            env,
        )
        for mode in modes:
            extra = dict(setting.split("=", 1) for setting in args.proxy_env)
            if extra.get("VKGATE_PROXY_WORKERS", "1") != "1":
                # Several workers serve no metrics (each would count alone).
                extra["VKGATE_METRICS_ADDR"] = "off"
            if mode == "redis":
                extra["VKGATE_REDIS_URL"] = args.redis_url
            name = "vkgate" if mode == "none" else f"vkgate ({mode})"
            with stack.proxy(services.work, env, extra, f"proxy-{mode}") as proxy:
                url = f"{proxy.url}/v1/chat/completions"
                measure(
                    rows,
                    name,
                    {"plain": url, "stream": url},
                    plain_key if mode == "none" else governed_key,
                    concurrencies,
                    stream_concurrencies,
                    args.duration,
                    env,
                )
    print_table(rows)


def measure(
    rows: list[tuple[str, str, int, tuple[float, ...]]],
    name: str,
    urls: dict[str, str],
    key: str,
    concurrencies: list[int],
    stream_concurrencies: list[int],
    duration: str,
    env: dict[str, str],
) -> None:
    plain = {**env, "BENCH_KEY": key, "BENCH_MODEL": "gpt-4o-mini"}
    stream = {**env, "BENCH_KEY": key, "BENCH_MODEL": "gpt-4o-mini-stream", "BENCH_STREAM": "1"}
    wrk(urls["plain"], 16, "2s", plain)  # warm-up, not recorded
    for concurrency in concurrencies:
        rows.append((name, "chat", concurrency, wrk(urls["plain"], concurrency, duration, plain)))
    for concurrency in stream_concurrencies:
        rows.append(
            (name, "stream", concurrency, wrk(urls["stream"], concurrency, duration, stream))
        )


def print_table(rows: list[tuple[str, str, int, tuple[float, ...]]]) -> None:
    base = {(mode, c): result for name, mode, c, result in rows if name == "upstream direct"}
    print()
    print("| target | mode | c | RPS | p50 ms | p99 ms | added p50 ms | added p99 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for name, mode, c, (rps, p50, p99, _) in rows:
        ref = base.get((mode, c))
        added = (
            ("-", "-")
            if ref is None or name == "upstream direct"
            else (f"{p50 - ref[1]:.3f}", f"{p99 - ref[2]:.3f}")
        )
        print(
            f"| {name} | {mode} | {c} | {rps:,.0f} | {p50:.3f} | {p99:.3f} | {added[0]} | {added[1]} |"
        )


if __name__ == "__main__":
    main()

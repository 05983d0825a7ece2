"""What the proxy adds on top of its upstream: requests per second and added latency.

Starts a fixed-answer nginx upstream, a control plane and a proxy (uvicorn or granian, one
worker), creates a key routed to the upstream, then loads the upstream directly and through
the proxy with wrk at each concurrency and prints one table. Everything runs on loopback,
every step is bounded by wrk's duration, and only the processes started here are stopped.

    .venv/bin/python bench/proxy_overhead.py                       # uvicorn, c=1,16,64, 10 s
    .venv/bin/python bench/proxy_overhead.py --servers uvicorn,granian --duration 5
    .venv/bin/python bench/proxy_overhead.py --governance none,local,redis

`--governance` picks the keys measured: `none` (no limits, no budget), `local` (a key with rpm,
tpm, rpd and max_concurrency limits and a budget, counters in-process) and `redis` (the same
key, with the proxy's counters in Redis at `--redis-url`): the difference is what rate limits
and budget reservations cost per request.

Needs nginx and wrk (`apt-get install nginx-light wrk`).
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
RESULT = re.compile(r"RESULT ([\d.]+) ([\d.]+) ([\d.]+) (\d+) (\d+) (\d+)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_ok(url: str, process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{process.args} exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} did not answer in {timeout} s")


@contextmanager
def started(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        process = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def wrk(url: str, concurrency: int, duration: str, env: dict[str, str]) -> tuple[float, ...]:
    output = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{concurrency}",
            f"-d{duration}",
            "--latency",
            "-s",
            str(HERE / "load.lua"),
            url,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    found = RESULT.search(output)
    if found is None:
        raise SystemExit(f"wrk printed no result:\n{output}")
    rps, p50, p99, requests, non2xx, errors = found.groups()
    if int(non2xx) or int(errors):
        print(f"  warning: {url} c={concurrency}: {non2xx} non-2xx, {errors} socket errors")
    return float(rps), float(p50), float(p99), float(requests)


# High enough never to refuse during a run, so every request pays for every check.
GOVERNED_LIMITS = {"rpm": 10**9, "tpm": 10**12, "rpd": 10**9, "max_concurrency": 100_000}
PRICE = {"input_per_mtok": "0.15", "output_per_mtok": "0.6"}


def seed(controlplane: str, token: str, upstream: str) -> tuple[str, str]:
    """An organization whose keys route gpt-4o-mini (and -stream) to the upstream: one plain
    key, and one with rate limits and a budget."""
    with httpx.Client(base_url=controlplane, headers={"Authorization": f"Bearer {token}"}) as api:

        def post(path: str, body: dict[str, object]) -> dict[str, object]:
            response = api.post(path, json=body)
            response.raise_for_status()
            result: dict[str, object] = response.json()
            return result

        org = post("/api/admin/organizations", {"name": "bench"})["id"]
        project = post("/api/admin/projects", {"organization_id": org, "name": "bench"})["id"]
        providers = {}
        for name, path in (("plain", "/v1"), ("stream", "/stream/v1")):
            providers[name] = post(
                "/api/admin/providers",
                {
                    "organization_id": org,
                    "name": name,
                    "kind": "openai_compatible",
                    "base_url": upstream + path,
                    "api_key": "sk-bench-upstream",
                    "price_overrides": {"gpt-4o-mini": PRICE},
                },
            )["id"]
        policy = post(
            "/api/admin/routing-policies",
            {
                "organization_id": org,
                "name": "bench",
                "aliases": {
                    "gpt-4o-mini": [{"provider_id": providers["plain"], "model": "gpt-4o-mini"}],
                    "gpt-4o-mini-stream": [
                        {"provider_id": providers["stream"], "model": "gpt-4o-mini"}
                    ],
                },
            },
        )["id"]
        key = post(
            "/api/admin/virtual-keys",
            {"project_id": project, "name": "bench", "routing_policy_id": policy},
        )
        governed = post(
            "/api/admin/virtual-keys",
            {
                "project_id": project,
                "name": "bench-governed",
                "routing_policy_id": policy,
                "limits": GOVERNED_LIMITS,
            },
        )
        post(
            "/api/admin/budgets",
            {
                "organization_id": org,
                "scope": {"kind": "virtual_key", "id": governed["id"]},
                "window": "month",
                "limit_usd": "1000000",
            },
        )
        return str(key["key"]), str(governed["key"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", default="10s", help="wrk duration per run (default 10s)")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--servers", default="uvicorn", help="comma list of uvicorn, granian")
    parser.add_argument("--stream-concurrency", default="1,16", help="empty to skip streams")
    parser.add_argument(
        "--governance", default="none", help="comma list of none, local, redis (keys measured)"
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--proxy-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for the proxies measured (repeatable), e.g. VKGATE_LOG_REQUESTS=false",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        help="the services' VKGATE_LOG_LEVEL (INFO, the default, logs every request)",
    )
    args = parser.parse_args()
    modes = [m for m in args.governance.split(",") if m]
    if set(modes) - {"none", "local", "redis"}:
        raise SystemExit("--governance takes none, local and redis")
    for tool in ("nginx", "wrk"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is needed: apt-get install nginx-light wrk")
    concurrencies = [int(c) for c in args.concurrency.split(",") if c]
    stream_concurrencies = [int(c) for c in args.stream_concurrency.split(",") if c]
    work = Path(tempfile.mkdtemp(prefix="vkgate-bench-"))
    (work / "logs").mkdir()
    (work / "tmp").mkdir()
    nginx_port, cp_port = free_port(), free_port()
    conf = (HERE / "upstream.nginx.conf").read_text().replace("{port}", str(nginx_port))
    (work / "nginx.conf").write_text(conf)
    upstream = f"http://127.0.0.1:{nginx_port}"
    token = "vka-" + secrets.token_urlsafe(32)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VKGATE_")}
    env.update(
        {
            "VKGATE_HOME": str(work / "home"),
            "VKGATE_CONTROLPLANE_ADDR": f"127.0.0.1:{cp_port}",
            "VKGATE_CONTROLPLANE_URL": f"http://127.0.0.1:{cp_port}",
            "VKGATE_INTERNAL_SECRET": secrets.token_urlsafe(48),
            "VKGATE_JWT_SECRET": secrets.token_urlsafe(48),
            "VKGATE_KEY_PEPPER": secrets.token_urlsafe(48),
            "VKGATE_ENCRYPTION_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            "VKGATE_ADMIN_TOKEN": token,
            # INFO, as deployed: a proxy then writes one `request_completed` line a request.
            "VKGATE_LOG_LEVEL": args.log_level,
        }
    )
    rows: list[tuple[str, str, int, tuple[float, ...]]] = []
    vkgate = [sys.executable, "-m", "vkgate"]
    with (
        started(
            ["nginx", "-p", str(work), "-c", str(work / "nginx.conf")], env, work / "nginx.log"
        ) as nginx,
        started([*vkgate, "controlplane", "--migrate"], env, work / "controlplane.log") as cp,
    ):
        wait_ok(f"{upstream}/healthz", nginx)
        wait_ok(f"http://127.0.0.1:{cp_port}/healthz", cp)
        plain_key, governed_key = seed(f"http://127.0.0.1:{cp_port}", token, upstream)
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
        for server in args.servers.split(","):
            for mode in modes:
                port = free_port()
                proxy_env = {
                    **env,
                    "VKGATE_PROXY_ADDR": f"127.0.0.1:{port}",
                    "VKGATE_PROXY_SERVER": server,
                    "VKGATE_METRICS_ADDR": f"127.0.0.1:{free_port()}",
                    **dict(setting.split("=", 1) for setting in args.proxy_env),
                }
                if proxy_env.get("VKGATE_PROXY_WORKERS", "1") != "1":
                    # Several workers serve no metrics (each would count alone).
                    proxy_env["VKGATE_METRICS_ADDR"] = "off"
                if mode == "redis":
                    proxy_env["VKGATE_REDIS_URL"] = args.redis_url
                name = f"vkgate ({server})" if mode == "none" else f"vkgate ({server}, {mode})"
                log = work / f"proxy-{server}-{mode}.log"
                with started([*vkgate, "proxy"], proxy_env, log) as proxy:
                    wait_ok(f"http://127.0.0.1:{port}/healthz", proxy)
                    url = f"http://127.0.0.1:{port}/v1/chat/completions"
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
    shutil.rmtree(work, ignore_errors=True)


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

"""What a large prompt costs the proxy: added latency and proxy CPU per request, by body size.

A chat request whose one user message is 1 KiB, 100 KiB, 400 KiB and 1 MiB of filler text
(`prompt.lua`; no real prompt) is sent one at a time (wrk, c=1, one connection) to the nginx
upstream of `upstream.nginx.conf` directly and through a proxy, at `/read/v1`: there nginx
answers only once it has read the whole body (a plain `return` answers at the headers, before a
large body is even sent, and the baseline would leave the transfer out). The table gives, per size, the
latency added over the direct call (p50, p99) and the proxy's CPU time per request (user +
system, from /proc, over the whole run). The proxy's body limit, `VKGATE_MAX_BODY_BYTES`
(default 32 MiB), is raised for the run only when the largest body would pass it.

    .venv/bin/python bench/large_prompt.py                       # 4 sizes, 3 s a run (~40 s)
    .venv/bin/python bench/large_prompt.py --sizes 1K,4M --duration 5s

Needs nginx and wrk (`apt-get install nginx-light wrk`).
"""

from __future__ import annotations

import argparse

import stack
from stack import WrkResult

UNITS = {"K": 1024, "M": 1024**2}
ENVELOPE = 200
"""Bytes of a body around its prompt, at most."""
NGINX_MAX_BODY = 64 * 1024**2
"""`client_max_body_size` of upstream.nginx.conf: the direct calls cannot be larger."""


def size(text: str) -> int:
    text = text.strip().upper()
    if text[-1:] in UNITS:
        return int(float(text[:-1]) * UNITS[text[-1]])
    return int(text)


def label(n: int) -> str:
    if n >= UNITS["M"] and n % UNITS["M"] == 0:
        return f"{n // UNITS['M']} MiB"
    if n >= UNITS["K"] and n % UNITS["K"] == 0:
        return f"{n // UNITS['K']} KiB"
    return f"{n:,} B"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", default="1K,100K,400K,1M", help="prompt sizes, K = KiB, M = MiB (below 64M)"
    )
    parser.add_argument("--duration", default="3s", help="wrk duration per run (default 3s)")
    stack.add_service_arguments(parser)
    args = parser.parse_args()
    stack.require("nginx", "wrk")
    sizes = [size(s) for s in args.sizes.split(",") if s]
    if max(sizes) + ENVELOPE > NGINX_MAX_BODY:
        raise SystemExit(f"the upstream takes bodies up to {label(NGINX_MAX_BODY)}: use --sizes")
    extra = stack.proxy_env_args(args.proxy_env)
    limit = stack.proxy_default("max_body_bytes")
    notes = []
    if "VKGATE_MAX_BODY_BYTES" not in extra and max(sizes) + ENVELOPE > limit:
        extra["VKGATE_MAX_BODY_BYTES"] = str(max(sizes) * 2)
        notes.append(
            f"VKGATE_MAX_BODY_BYTES raised from {limit:,} to {max(sizes) * 2:,} for this run."
        )
    rows = []
    with stack.stack(args.log_level) as services:
        key = services.key_to(services.upstream + "/read/v1", "read")
        direct = f"{services.upstream}/read/v1/chat/completions"
        with services.proxy(extra) as proxy:
            url = f"{proxy.url}/v1/chat/completions"
            for n in sizes:
                load = {**services.env, "BENCH_PROMPT_BYTES": str(n)}
                keyed = {**load, "BENCH_KEY": key}
                stack.wrk(direct, 1, "1s", load, "prompt.lua")  # warm-ups, not recorded
                stack.wrk(url, 1, "1s", keyed, "prompt.lua")
                base = stack.wrk(direct, 1, args.duration, load, "prompt.lua")
                cpu = stack.cpu_seconds(proxy.pid)
                through = stack.wrk(url, 1, args.duration, keyed, "prompt.lua")
                cpu = stack.cpu_seconds(proxy.pid) - cpu
                rows.append((n, base, through, cpu))
    print_table(rows)
    for note in notes:
        print(note)


def print_table(rows: list[tuple[int, WrkResult, WrkResult, float]]) -> None:
    table = []
    for n, base, through, cpu in rows:
        requests = max(through.requests, 1)
        table.append(
            (
                label(n),
                f"{base.rps:,.0f}",
                f"{base.p50_ms:.3f}",
                f"{base.p99_ms:.3f}",
                f"{through.rps:,.0f}",
                f"{through.p50_ms:.3f}",
                f"{through.p99_ms:.3f}",
                f"{through.p50_ms - base.p50_ms:.3f}",
                f"{through.p99_ms - base.p99_ms:.3f}",
                f"{cpu * 1000 / requests:.3f}",
                f"{base.non2xx + base.errors} / {through.non2xx + through.errors}",
            )
        )
    stack.print_table(
        (
            "prompt",
            "direct RPS",
            "direct p50 ms",
            "direct p99 ms",
            "proxy RPS",
            "proxy p50 ms",
            "proxy p99 ms",
            "added p50 ms",
            "added p99 ms",
            "proxy CPU ms/req",
            "errors (direct / proxy)",
        ),
        table,
    )


if __name__ == "__main__":
    main()

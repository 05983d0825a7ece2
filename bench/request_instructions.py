"""Instructions per request of the proxy, by callgrind: the steady figure for a hot-path change.

Starts nginx (the fixed-answer upstream), a control plane and one proxy under
`valgrind --tool=callgrind --instr-atstart=no`, with spool shipping held off. For each key
measured it sends `--warmup` sequential requests uninstrumented, then switches instrumentation
on (`callgrind_control -i on`), sends `--requests` sequential requests on one kept-alive
connection, dumps, and divides the instructions by the requests. Keys:

- `governed`: rate limits and a budget (the run.sh key), no cache rule;
- `cached`: governed alike, with a cache rule scoped to it: every measured request is a hit;
- `plain`: no limits, no budget, no cache rule.

    .venv/bin/python bench/request_instructions.py                  # governed, cached, plain
    .venv/bin/python bench/request_instructions.py --keys governed --requests 600

The same build gives the same count to about 0.1 %; compare builds on the same machine. Needs
nginx and valgrind (`apt-get install nginx-light valgrind`).
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import proxy_overhead
import stack

BODY = json.dumps(
    {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You are a concise assistant. Answer in one sentence."},
            {
                "role": "user",
                "content": "What is the capital of France, and what river runs through it?",
            },
        ],
        "temperature": 0.2,
        "max_tokens": 64,
    }
).encode()
DEBUG = False
_TOTALS = re.compile(r"^totals: (\d+)", re.MULTILINE)


def send(url: str, key: str, n: int) -> int:
    """`n` sequential chat requests on one kept-alive connection; the cache hits among them."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=120)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    hits = 0
    try:
        for _ in range(n):
            connection.request("POST", "/v1/chat/completions", BODY, headers)
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                raise SystemExit(f"the proxy answered {response.status}")
            hits += response.getheader("x-vkgate-cache") == "hit"
    finally:
        connection.close()
    return hits


def callgrind(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def instructions(out_dir: Path, pid: int, before: set[Path]) -> int:
    """The instructions of the dumps made since `before` was listed."""
    total = 0
    for dump in sorted(set(out_dir.glob(f"callgrind.out.{pid}*")) - before):
        found = _TOTALS.findall(dump.read_text(errors="replace"))
        if DEBUG:
            print(dump.name, found)
        total += sum(int(n) for n in found)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="governed,cached,plain")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--requests", type=int, default=600)
    stack.add_service_arguments(parser)
    args = parser.parse_args()
    stack.require("nginx", "valgrind", "callgrind_control")
    wanted = [k.strip() for k in args.keys.split(",") if k.strip()]
    with stack.stack(args.log_level) as running:
        plain, governed = proxy_overhead.seed(running.controlplane, running.token, running.upstream)
        cached = proxy_overhead.seed_cached(running.controlplane, running.token, running.upstream)
        keys = {"governed": governed, "cached": cached, "plain": plain}
        out_dir = running.work / "callgrind"
        out_dir.mkdir()
        port = stack.free_port()
        env = {
            **running.env,
            "VKGATE_PROXY_ADDR": f"127.0.0.1:{port}",
            "VKGATE_METRICS_ADDR": "off",
            "VKGATE_SPEND_FLUSH_INTERVAL_SECONDS": "3600",
            **stack.proxy_env_args(args.proxy_env),
        }
        command = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out_dir}/callgrind.out.%p",
            *stack.VKGATE,
            "proxy",
        ]
        url = f"http://127.0.0.1:{port}"
        rows = []
        with stack.started(command, env, running.work / "proxy.log") as process:
            stack.wait_ok(f"{url}/healthz", process, timeout=300)
            for name in wanted:
                send(url, keys[name], args.warmup)
                before = set(out_dir.glob("callgrind.out.*"))
                callgrind(process.pid, "-i", "on")
                started = time.monotonic()
                hits = send(url, keys[name], args.requests)
                callgrind(process.pid, "-d")
                callgrind(process.pid, "-i", "off")
                elapsed = time.monotonic() - started
                total = instructions(out_dir, process.pid, before)
                rows.append(
                    (name, args.requests, hits, f"{total // args.requests:,}", f"{elapsed:.0f} s")
                )
        stack.print_table(["key", "requests", "cache hits", "instructions/request", "took"], rows)


if __name__ == "__main__":
    main()

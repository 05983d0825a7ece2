"""Instructions per request of the proxy, by callgrind: the steady figure for a hot-path change.

Starts nginx (the fixed-answer upstream) and a control plane, then a proxy under
`valgrind --tool=callgrind --instr-atstart=no`, with spool shipping held off. For each key
measured it sends `--warmup` sequential requests uninstrumented, then switches instrumentation
on (`callgrind_control -i on`), sends `--requests` sequential requests on one kept-alive
connection, dumps, and divides the instructions by the requests. Keys:

- `governed`: rate limits and a budget (the run.sh key), no cache rule;
- `cached`: governed alike, with a cache rule scoped to it: every measured request is a hit;
- `plain`: no limits, no budget, no cache rule.

With `--before DIR` (a directory holding another build's `proxy/` package, e.g. from
`git archive <commit> proxy | tar -x -C DIR`), proxies of that build and of this checkout are
started in turn, `--rounds` times, on the same stack and keys: a fresh stack's own secrets and
ids move the counts by up to 2 %, a build's change by less.

    .venv/bin/python bench/request_instructions.py                  # governed, cached, plain
    .venv/bin/python bench/request_instructions.py --keys governed,plain --before /tmp/base

Needs nginx and valgrind (`apt-get install nginx-light valgrind`).
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import subprocess
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
        total += sum(int(n) for n in _TOTALS.findall(dump.read_text(errors="replace")))
    return total


def measure(
    running: stack.Stack,
    keys: dict[str, str],
    args: argparse.Namespace,
    build: str,
    pythonpath: Path | None,
) -> list[tuple[object, ...]]:
    """One proxy of `build` (its `proxy/` under `pythonpath`, else this checkout's): a row per
    key."""
    out_dir = running.work / "callgrind"
    out_dir.mkdir(exist_ok=True)
    port = stack.free_port()
    env = {
        **running.env,
        "VKGATE_PROXY_ADDR": f"127.0.0.1:{port}",
        "VKGATE_METRICS_ADDR": "off",
        "VKGATE_SPEND_FLUSH_INTERVAL_SECONDS": "3600",
        **stack.proxy_env_args(args.proxy_env),
    }
    env.pop("PYTHONPATH", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    command = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out_dir}/callgrind.out.%p",
        *stack.VKGATE,
        "proxy",
    ]
    url = f"http://127.0.0.1:{port}"
    rows: list[tuple[object, ...]] = []
    log = running.work / f"proxy-{build}-{len(list(running.work.glob('proxy-*.log')))}.log"
    with stack.started(command, env, log) as process:
        stack.wait_ok(f"{url}/healthz", process, timeout=300)
        for name, key in keys.items():
            send(url, key, args.warmup)
            before = set(out_dir.glob("callgrind.out.*"))
            callgrind(process.pid, "-i", "on")
            hits = send(url, key, args.requests)
            callgrind(process.pid, "-d")
            callgrind(process.pid, "-i", "off")
            total = instructions(out_dir, process.pid, before)
            rows.append((build, name, args.requests, hits, f"{total // args.requests:,}"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="governed,cached,plain")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--before", type=Path, help="a directory holding another build's proxy/")
    parser.add_argument("--rounds", type=int, default=2, help="with --before: rounds of the two")
    stack.add_service_arguments(parser)
    args = parser.parse_args()
    stack.require("nginx", "valgrind", "callgrind_control")
    if args.before is not None and not (args.before / "proxy" / "__init__.py").is_file():
        raise SystemExit(f"--before {args.before}: no proxy/ package there")
    wanted = [k.strip() for k in args.keys.split(",") if k.strip()]
    with stack.stack(args.log_level) as running:
        plain, governed = proxy_overhead.seed(running.controlplane, running.token, running.upstream)
        cached = proxy_overhead.seed_cached(running.controlplane, running.token, running.upstream)
        every = {"governed": governed, "cached": cached, "plain": plain}
        keys = {name: every[name] for name in wanted}
        rows: list[tuple[object, ...]] = []
        if args.before is None:
            rows += measure(running, keys, args, "this", None)
        else:
            for _ in range(args.rounds):
                rows += measure(running, keys, args, "before", args.before.resolve())
                rows += measure(running, keys, args, "this", None)
        stack.print_table(["build", "key", "requests", "cache hits", "instructions/request"], rows)


if __name__ == "__main__":
    main()

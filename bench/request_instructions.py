"""Instructions per request of the proxy, by callgrind: the steady figure for a hot-path change.

Starts nginx (the fixed-answer upstream) and a control plane, then a proxy under
`valgrind --tool=callgrind --instr-atstart=no`, with spool shipping held off. For each key
measured it sends `--warmup` sequential requests uninstrumented, then switches instrumentation
on (`callgrind_control -i on`), sends `--requests` sequential requests on one kept-alive
connection, dumps, and divides the instructions by the requests. Keys:

- `governed`: rate limits and a budget (the run.sh key), no cache rule;
- `cached`: governed alike, with a cache rule scoped to it: every measured request is a hit;
- `plain`: no limits, no budget, no cache rule;
- `4k` and `4k-guarded`: two governed keys alike but for three guardrails (regex, pii and
  secrets, both stages; `proxy_overhead.seed_guarded`), sent a 4 KB prompt (run.sh's
  `vkgate-wN-4k` rows), for what guardrails cost a request.

With `--before DIR` (a directory holding another build's `proxy/` package, e.g. from
`git archive <commit> proxy | tar -x -C DIR`), proxies of that build and of this checkout are
started in turn, `--rounds` times, on the same stack and keys: a fresh stack's own secrets and
ids move the counts by up to 2 %, a build's change by less.

    .venv/bin/python bench/request_instructions.py                  # governed, cached, plain
    .venv/bin/python bench/request_instructions.py --keys governed,plain --before /tmp/base
    .venv/bin/python bench/request_instructions.py --keys 4k,4k-guarded

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
PROMPT_BYTES = 4096
_PROSE = (
    "The committee reviewed the quarterly figures and agreed to revisit the plan next month. ",
    "In 2024 the team shipped 3 releases across 12 regions, and the backlog shrank by a third. ",
    "Customers asked for clearer invoices, faster exports and a calmer onboarding flow. ",
    "Before the meeting ends, summarise the open questions and who will answer each of them. ",
)


def _padded(question: str, size: int) -> str:
    parts: list[str] = []
    while sum(map(len, parts)) < size:
        parts.append(_PROSE[len(parts) % len(_PROSE)])
    return "".join(parts) + question


BODY_4K = json.dumps(
    {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You are a concise assistant. Answer in one sentence."},
            {
                "role": "user",
                "content": _padded(
                    "What is the capital of France, and what river runs through it?", PROMPT_BYTES
                ),
            },
        ],
        "temperature": 0.2,
        "max_tokens": 64,
    }
).encode()
"""The body of the `4k` keys: bench/run.sh's rows with a 4 KB prompt (`peers/chat.lua` with
`BENCH_PROMPT_BYTES=4096`)."""
_TOTALS = re.compile(r"^totals: (\d+)", re.MULTILINE)


def send(url: str, key: str, n: int, body: bytes = BODY) -> int:
    """`n` sequential chat requests on one kept-alive connection; the cache hits among them."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=120)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    hits = 0
    try:
        for _ in range(n):
            connection.request("POST", "/v1/chat/completions", body, headers)
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


def annotate(out_dir: Path, pid: int, before: set[Path], top: int, title: str) -> None:
    """The `top` functions by their own instructions in the dumps made since `before`."""
    for dump in sorted(set(out_dir.glob(f"callgrind.out.{pid}*")) - before):
        shown = subprocess.run(
            ["callgrind_annotate", "--inclusive=no", "--threshold=99", str(dump)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        lines = [line for line in shown.splitlines() if re.match(r"^\s*[\d,]+ \(", line)]
        print(f"-- {title}: {dump.name}")
        print("\n".join(lines[:top]))


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
            body = BODY_4K if name.startswith("4k") else BODY
            send(url, key, args.warmup, body)
            before = set(out_dir.glob("callgrind.out.*"))
            callgrind(process.pid, "-i", "on")
            hits = send(url, key, args.requests, body)
            callgrind(process.pid, "-d")
            callgrind(process.pid, "-i", "off")
            total = instructions(out_dir, process.pid, before)
            if args.annotate:
                annotate(out_dir, process.pid, before, args.annotate, f"{build} {name}")
            rows.append((build, name, args.requests, hits, f"{total // args.requests:,}"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="governed,cached,plain")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--before", type=Path, help="a directory holding another build's proxy/")
    parser.add_argument("--rounds", type=int, default=2, help="with --before: rounds of the two")
    parser.add_argument(
        "--annotate", type=int, default=0, metavar="N", help="print each key's top N functions"
    )
    stack.add_service_arguments(parser)
    args = parser.parse_args()
    stack.require("nginx", "valgrind", "callgrind_control")
    if args.before is not None and not (args.before / "proxy" / "__init__.py").is_file():
        raise SystemExit(f"--before {args.before}: no proxy/ package there")
    wanted = [k.strip() for k in args.keys.split(",") if k.strip()]
    unknown = sorted(set(wanted) - {"governed", "cached", "plain", "4k", "4k-guarded"})
    if unknown:
        raise SystemExit(f"--keys: no key named {', '.join(unknown)} (see the docstring)")
    with stack.stack(args.log_level) as running:
        plain, governed = proxy_overhead.seed(running.controlplane, running.token, running.upstream)
        cached = proxy_overhead.seed_cached(running.controlplane, running.token, running.upstream)
        every = {"governed": governed, "cached": cached, "plain": plain}
        if any(name.startswith("4k") for name in wanted):
            every["4k"], every["4k-guarded"] = proxy_overhead.seed_guarded(
                running.controlplane, running.token, running.upstream
            )
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

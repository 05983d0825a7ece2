"""What three guardrails cost a request end to end, for this build and another, side by side.

One control plane and nginx; two governed keys of one organization alike but for three
guardrails (regex, pii, secrets; both stages; `proxy_overhead.seed_guarded`). For each round and
build, a proxy with one worker is started, and run.sh's `vkgate-wN-4k` body (`peers/chat.lua`
with `BENCH_PROMPT_BYTES=4096`: a short system prompt, and a user message of 4 KB of prose with
a few numbers) is sent through each key in turn at `--conc` for `--duration` after a
two-second warm-up. A row gives the requests a second and the proxy's CPU per request (user +
system, from /proc); the last table gives each build's guarded key against its unguarded one,
round by round. Builds are alternated so that a neighbour's load falls on both alike.

    .venv/bin/python bench/guardrail_ab.py                              # this build, 3 rounds
    .venv/bin/python bench/guardrail_ab.py --before /tmp/base           # and another build's

`--before DIR` names a directory holding another build's `proxy/` package, e.g. from
`git archive <commit> proxy | tar -x -C DIR`; its proxies run with `PYTHONPATH=DIR`, started
from this directory so that the checkout's own `proxy/` does not shadow it.

Needs nginx and wrk (`apt-get install nginx-light wrk`).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import proxy_overhead
import stack

HERE = Path(__file__).resolve().parent
SCRIPT = "peers/chat.lua"
"""run.sh's own wrk script, for its rows' body."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="a directory holding another build's proxy/")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", default="5s")
    parser.add_argument("--conc", type=int, default=16)
    stack.add_service_arguments(parser)
    args = parser.parse_args()
    stack.require("nginx", "wrk")
    if args.before is not None and not (args.before / "proxy" / "__init__.py").is_file():
        raise SystemExit(f"--before {args.before}: no proxy/ package there")
    # `python -m vkgate` puts the working directory first on the path: from the repository's
    # root, its proxy/ would be imported whatever PYTHONPATH says.
    os.chdir(HERE)
    builds: dict[str, Path | None] = {"this": None}
    if args.before is not None:
        builds = {"before": args.before.resolve(), **builds}
    rows: list[tuple[object, ...]] = []
    ratios: list[tuple[object, ...]] = []
    with stack.stack(args.log_level) as running:
        keys = dict(
            zip(
                ("4k", "4k-guarded"),
                proxy_overhead.seed_guarded(running.controlplane, running.token, running.upstream),
                strict=True,
            )
        )
        for round_ in range(1, args.rounds + 1):
            for build, path in builds.items():
                extra = {**stack.proxy_env_args(args.proxy_env), "VKGATE_PROXY_WORKERS": "1"}
                if path is not None:
                    extra["PYTHONPATH"] = str(path)
                measured: dict[str, tuple[float, float]] = {}
                with running.proxy(extra, name=build) as proxy:
                    url = f"{proxy.url}/v1/chat/completions"
                    for name, key in keys.items():
                        env = {**os.environ, "BENCH_API_KEY": key, "BENCH_PROMPT_BYTES": "4096"}
                        stack.wrk(url, args.conc, "2s", env, script=SCRIPT)
                        before = stack.cpu_seconds(proxy.process.pid)
                        result = stack.wrk(url, args.conc, args.duration, env, script=SCRIPT)
                        cpu = stack.cpu_seconds(proxy.process.pid) - before
                        if result.requests == 0 or result.non2xx or result.errors:
                            raise SystemExit(f"{build} {name}: {result.output}")
                        micros = cpu / result.requests * 1e6
                        measured[name] = (result.rps, micros)
                        rows.append((round_, build, name, f"{result.rps:,.0f}", f"{micros:.0f}"))
                (plain_rps, plain_cpu), (guarded_rps, guarded_cpu) = measured.values()
                ratios.append(
                    (
                        round_,
                        build,
                        f"{(guarded_rps / plain_rps - 1) * 100:+.1f} %",
                        f"{guarded_cpu - plain_cpu:+.0f} µs ({(guarded_cpu / plain_cpu - 1) * 100:+.0f} %)",
                    )
                )
    stack.print_table(["round", "build", "key", "RPS", "proxy CPU µs/request"], rows)
    print()
    stack.print_table(
        ["round", "build", "guarded RPS vs unguarded", "guarded CPU vs unguarded"], ratios
    )


if __name__ == "__main__":
    main()

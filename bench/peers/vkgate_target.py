"""vkgate as a benchmark target: a control plane, a seeded organization and a proxy.

Starts `vkgate controlplane --migrate` with a fresh VKGATE_HOME, seeds an organization whose
aliases route gpt-4o-mini (and gpt-4o-mini-stream) to the nginx mock, starts `vkgate proxy`
with `--workers` worker processes, waits for its /healthz and prints one line

    READY <base_url> <proxy_pid> <governed_key> gpt-4o-mini-stream <controlplane_pid>

then holds until SIGTERM or SIGINT and stops what it started (by PID: SIGTERM, wait, kill).
The key printed is the governed one (rate limits and a budget), so every request pays for
the auth cache, the limit counters, the budget reservation and the spend record. Before it,
a line

    CLOUD <bedrock_key> <gemini_key>

gives two more keys, governed alike, whose policies route the same aliases to a `bedrock`
credential and to a `gemini` one on the same mock (Converse and generateContent answers): the
requests are translated, and the Bedrock ones signed with SigV4. And a line

    CACHED <cached_key>

gives a key governed alike, of its own organization, whose answers a cache rule scoped to it
lets the proxy serve from its response cache (every request after the first is a hit).

    .venv/bin/python bench/peers/vkgate_target.py --workers 2 --upstream http://127.0.0.1:18080

VKGATE_BENCH_PROXY_ENV="NAME=VALUE NAME=VALUE" adds settings to the proxy only. Logs (and the
home directory) go under --work, a new temporary directory by default, removed at the end
unless --keep.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import proxy_overhead
import stack

STREAM_MODEL = "gpt-4o-mini-stream"


class Stop(Exception):
    """Raised in the main thread by SIGTERM/SIGINT, so every `started` block unwinds."""


def on_signal(signum: int, _frame: FrameType | None) -> None:
    # One stop is enough: a second signal must not interrupt the cleanup it started.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise Stop(signal.Signals(signum).name)


def die_with_parent() -> None:
    """Linux: get SIGTERM when the script that started this one dies, even by SIGKILL."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:
            raise Stop("parent already gone")


def proxy_settings(raw: str) -> dict[str, str]:
    settings = {}
    for item in raw.split():
        name, sep, value = item.partition("=")
        if not sep or not name.startswith("VKGATE_"):
            raise SystemExit(f"VKGATE_BENCH_PROXY_ENV: expected VKGATE_NAME=VALUE, got {item!r}")
        settings[name] = value
    return settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1, help="VKGATE_PROXY_WORKERS")
    parser.add_argument("--upstream", default="http://127.0.0.1:18080", help="the nginx mock")
    parser.add_argument("--work", type=Path, help="logs and VKGATE_HOME (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep --work's home at the end")
    parser.add_argument("--start-timeout", type=float, default=60.0)
    parser.add_argument("--log-level", default="INFO", help="VKGATE_LOG_LEVEL of both services")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    extra = proxy_settings(os.environ.get("VKGATE_BENCH_PROXY_ENV", ""))
    try:
        die_with_parent()
        run(args, extra)
    except Stop as stop:
        print(f"vkgate target: stopped ({stop})", file=sys.stderr)


def run(args: argparse.Namespace, extra: dict[str, str]) -> None:
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"vkgate-w{args.workers}-", dir=args.work))
    try:
        serve(args, work, extra)
    finally:
        if not args.keep:
            # The logs stay next to the run's other output; the home (database, spool) goes.
            shutil.rmtree(work / "home", ignore_errors=True)
            if args.work is None:
                shutil.rmtree(work, ignore_errors=True)


def serve(args: argparse.Namespace, work: Path, extra: dict[str, str]) -> None:
    cp_port, proxy_port = stack.free_port(), stack.free_port()
    token = "vka-" + secrets.token_urlsafe(32)
    env = stack.service_env(work, cp_port, token, args.log_level)
    proxy_env = {
        **env,
        "VKGATE_PROXY_ADDR": f"127.0.0.1:{proxy_port}",
        "VKGATE_PROXY_WORKERS": str(args.workers),
        # Several workers serve no metrics (each would count alone).
        "VKGATE_METRICS_ADDR": f"127.0.0.1:{stack.free_port()}" if args.workers == 1 else "off",
        **extra,
    }
    controlplane = f"http://127.0.0.1:{cp_port}"
    base_url = f"http://127.0.0.1:{proxy_port}"
    with stack.started(
        [*stack.VKGATE, "controlplane", "--migrate"], env, work / "controlplane.log"
    ) as cp:
        stack.wait_ok(f"{controlplane}/healthz", cp, timeout=args.start_timeout)
        _, governed_key = proxy_overhead.seed(controlplane, token, args.upstream.rstrip("/"))
        bedrock_key, gemini_key = proxy_overhead.seed_clouds(
            controlplane, token, args.upstream.rstrip("/")
        )
        cached_key = proxy_overhead.seed_cached(controlplane, token, args.upstream.rstrip("/"))
        with stack.started([*stack.VKGATE, "proxy"], proxy_env, work / "proxy.log") as proxy:
            stack.wait_ok(f"{base_url}/healthz", proxy, timeout=args.start_timeout)
            print(f"CLOUD {bedrock_key} {gemini_key}", flush=True)
            print(f"CACHED {cached_key}", flush=True)
            print(
                f"READY {base_url} {proxy.pid} {governed_key} {STREAM_MODEL} {cp.pid}", flush=True
            )
            hold(proxy, cp)


def hold(*processes: subprocess.Popen[bytes]) -> None:
    """Until a signal (raised as Stop) or until one of the services exits by itself."""
    while True:
        for process in processes:
            if process.poll() is not None:
                raise SystemExit(f"{process.args} exited with {process.returncode}")
        time.sleep(0.5)


if __name__ == "__main__":
    main()

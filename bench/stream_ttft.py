"""Streaming through the proxy: time to first byte and the gaps between chunks, vs the upstream.

nginx answers a whole stream at once, so the upstream here is a small aiohttp.web server in a
process of its own (this script, `--serve-upstream`) that speaks OpenAI's SSE wire format:
`--chunks` `chat.completion.chunk` events `--gap-ms` apart (the first carries the role), then
the finish chunk, the usage chunk when the request asked for it
(`stream_options.include_usage`), and `data: [DONE]`.

A client (aiohttp, one keep-alive connection per concurrent stream) runs streams back to back
for `--duration` seconds at each concurrency, against the upstream directly, through the bare
forwarder of `peers/bare_forwarder.py` (the ceiling: one uvicorn worker relaying the chunks,
nothing else; `--no-bare` leaves it out) and through a proxy, with and without asking for usage
(without, the proxy asks for it and strips the usage chunk on the way; the bare forwarder
passes the body on as it is). Per stream it records when each event arrived:

- `TTFB`: from sending the request to the first event's arrival; `added` is over the upstream
  called directly at the same concurrency and usage mode;
- `gap`: between consecutive events of the `--chunks` spaced ones, as the client saw them. An
  unbuffered proxy keeps the upstream's gap; a buffering one collapses it (gaps near 0 and one
  long wait), which `gaps < half` (the share of gaps under half of `--gap-ms`) shows.

`usage wrong` counts streams that had a usage chunk the client did not ask for, or lacked the
one it asked for; `errors`, streams that failed or ended without `data: [DONE]`.

Streams per second against nginx's instant stream are `proxy_overhead.py`'s; not repeated here.

    .venv/bin/python bench/stream_ttft.py                 # 20 chunks 5 ms apart, c=1,16, 5 s
    .venv/bin/python bench/stream_ttft.py --chunks 50 --gap-ms 20 --usage asked --duration 10
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import stack
import uvloop
from aiohttp import web
from stack import percentile

MODEL = "gpt-4o-mini"
USAGE_MODES = {"asked": True, "not": False}
"""`--usage`: whether the client asks for the usage chunk."""


# -- the upstream ------------------------------------------------------------------------------


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _chunk(delta: dict[str, Any], finish: str | None, usage: bool) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": "chatcmpl-bench3",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "gpt-4o-mini-2024-07-18",
        "system_fingerprint": "fp_bench",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    if usage:
        chunk["usage"] = None  # OpenAI sends it on every chunk once usage is asked for
    return chunk


@dataclass(frozen=True)
class Script:
    """A stream's events, encoded once: the spaced ones, then the tail sent at once."""

    spaced: tuple[bytes, ...]
    tail: bytes

    @classmethod
    def of(cls, chunks: int, usage: bool) -> Script:
        first = _event(_chunk({"role": "assistant", "content": "", "refusal": None}, None, usage))
        token = _event(_chunk({"content": " token"}, None, usage))
        tail = _event(_chunk({}, "stop", usage))
        if usage:
            totals = {"prompt_tokens": 25, "completion_tokens": chunks - 1}
            totals["total_tokens"] = sum(totals.values())
            last = _chunk({}, None, True)
            last["choices"], last["usage"] = [], totals
            tail += _event(last)
        return cls((first,) + (token,) * (chunks - 1), tail + b"data: [DONE]\n\n")


def serve_upstream(port: int, chunks: int, gap_s: float) -> None:
    scripts = {usage: Script.of(chunks, usage) for usage in (True, False)}

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        script = scripts[usage]
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        for i, event in enumerate(script.spaced):
            if i:
                await asyncio.sleep(gap_s)
            await response.write(event)
        await asyncio.sleep(gap_s)
        await response.write(script.tail)
        await response.write_eof()
        return response

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/stream/v1/chat/completions", chat)  # where the bare forwarder streams
    app.router.add_get("/healthz", healthz)
    web.run_app(
        app,
        host="127.0.0.1",
        port=port,
        access_log=None,
        print=None,
        loop=uvloop.new_event_loop(),
    )


# -- the client --------------------------------------------------------------------------------


@dataclass
class Samples:
    ttfb_ms: list[float] = field(default_factory=list)
    gaps_ms: list[float] = field(default_factory=list)
    total_ms: list[float] = field(default_factory=list)
    errors: int = 0
    usage_wrong: int = 0
    """Streams with a usage chunk the client did not ask for, or without one it asked for."""
    seconds: float = 0.0


async def one_stream(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    chunks: int,
    usage: bool,
    samples: Samples,
) -> None:
    started = time.perf_counter()
    arrivals: list[float] = []
    received = bytearray()
    async with session.post(url, data=body) as response:
        if response.status != 200:
            await response.read()
            samples.errors += 1
            return
        async for data in response.content.iter_any():
            now = time.perf_counter()
            # Every event this read completed arrived now (a coalesced read: gaps of 0).
            before = received.count(b"\n\n")
            received += data
            arrivals.extend([now] * (received.count(b"\n\n") - before))
    if len(arrivals) < chunks or not received.endswith(b"data: [DONE]\n\n"):
        samples.errors += 1
        return
    samples.usage_wrong += (b'"usage":{' in received) != usage
    samples.ttfb_ms.append((arrivals[0] - started) * 1000)
    samples.gaps_ms.extend((b - a) * 1000 for a, b in itertools.pairwise(arrivals[:chunks]))
    samples.total_ms.append((arrivals[-1] - started) * 1000)


async def load(
    url: str, key: str, usage: bool, concurrency: int, seconds: float, chunks: int
) -> Samples:
    request: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Which river runs through Paris?"}],
        "max_tokens": 64,
        "stream": True,
    }
    if usage:
        request["stream_options"] = {"include_usage": True}
    body = json.dumps(request).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    samples, warm = Samples(), Samples()
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(
        connector=connector, headers=headers, timeout=timeout
    ) as session:

        async def worker(deadline: float, into: Samples) -> None:
            while time.perf_counter() < deadline:
                try:
                    await one_stream(session, url, body, chunks, usage, into)
                except (aiohttp.ClientError, TimeoutError):
                    into.errors += 1

        # Warm-up (connections, the proxy's key cache), not recorded.
        warm_until = time.perf_counter() + 1.0
        await asyncio.gather(*(worker(warm_until, warm) for _ in range(concurrency)))
        started = time.perf_counter()
        await asyncio.gather(*(worker(started + seconds, samples) for _ in range(concurrency)))
        samples.seconds = time.perf_counter() - started
    return samples


# -- the run -----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=20, help="spaced events a stream (20)")
    parser.add_argument("--gap-ms", type=float, default=5.0, help="between two events (5)")
    parser.add_argument("--concurrency", default="1,16", help="comma list (default 1,16)")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds a run (default 5)")
    parser.add_argument(
        "--usage", default="not,asked", help="comma list: not, asked (the client's usage chunk)"
    )
    parser.add_argument(
        "--bare",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure the bare forwarder too (default: yes)",
    )
    stack.add_service_arguments(parser)
    parser.add_argument("--serve-upstream", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.chunks < 2:
        raise SystemExit("--chunks must be at least 2")
    if args.serve_upstream:
        serve_upstream(args.serve_upstream, args.chunks, args.gap_ms / 1000)
        return
    modes = [m for m in args.usage.split(",") if m]
    if set(modes) - set(USAGE_MODES):
        raise SystemExit("--usage takes not and asked")
    concurrencies = [int(c) for c in args.concurrency.split(",") if c]
    rows: list[tuple[str, str, int, Samples]] = []
    with stack.stack(args.log_level, upstream=False) as services:
        port = stack.free_port()
        upstream_args = [
            sys.executable,
            str(Path(__file__).resolve()),
            f"--serve-upstream={port}",
            f"--chunks={args.chunks}",
            f"--gap-ms={args.gap_ms}",
        ]
        log = services.work / "stream-upstream.log"
        with stack.started(upstream_args, services.env, log) as upstream:
            base = f"http://127.0.0.1:{port}"
            stack.wait_ok(f"{base}/healthz", upstream)
            key = services.key_to(f"{base}/v1", "sse")
            targets = [("upstream direct", f"{base}/v1/chat/completions", "")]
            with contextlib.ExitStack() as running:
                if args.bare:
                    bare = running.enter_context(bare_forwarder(services, base))
                    targets.append(("bare forwarder", f"{bare}/v1/chat/completions", ""))
                proxy = running.enter_context(services.proxy(stack.proxy_env_args(args.proxy_env)))
                targets.append(("vkgate", f"{proxy.url}/v1/chat/completions", key))
                for name, url, bearer in targets:
                    for mode in modes:
                        for c in concurrencies:
                            run = load(
                                url, bearer, USAGE_MODES[mode], c, args.duration, args.chunks
                            )
                            rows.append((name, mode, c, uvloop.run(run)))
    print_table(rows, args.gap_ms)
    print(
        f"\nUpstream: {args.chunks} events {args.gap_ms:g} ms apart, then finish, usage (when "
        "asked) and [DONE] at once; times in ms."
    )


@contextlib.contextmanager
def bare_forwarder(services: stack.Stack, upstream: str) -> Iterator[str]:
    """`peers/bare_forwarder.py` on one uvicorn worker in front of `upstream`; its base URL."""
    port = stack.free_port()
    args = [
        sys.executable,
        "-m",
        "uvicorn",
        "--app-dir",
        str(Path(__file__).resolve().parent / "peers"),
        "--host",
        "127.0.0.1",
        f"--port={port}",
        "--loop=uvloop",
        "--http=httptools",
        "--no-access-log",
        "--log-level=warning",
        "bare_forwarder:app",
    ]
    env = {**services.env, "UPSTREAM": upstream}
    with stack.started(args, env, services.work / "bare-forwarder.log") as process:
        url = f"http://127.0.0.1:{port}"
        stack.wait_listening(url, process)
        yield url


def print_table(rows: list[tuple[str, str, int, Samples]], gap_ms: float) -> None:
    base = {(mode, c): s for name, mode, c, s in rows if name == "upstream direct"}
    table = []
    for name, mode, c, s in rows:
        ref = None if name == "upstream direct" else base.get((mode, c))
        ttfb50, ttfb99 = percentile(s.ttfb_ms, 50), percentile(s.ttfb_ms, 99)
        collapsed = sum(g < gap_ms / 2 for g in s.gaps_ms) / max(len(s.gaps_ms), 1)
        table.append(
            (
                name,
                mode,
                c,
                len(s.ttfb_ms),
                f"{len(s.ttfb_ms) / s.seconds:,.1f}" if s.seconds else "-",
                f"{ttfb50:.3f}",
                f"{ttfb99:.3f}",
                "-" if ref is None else f"{ttfb50 - percentile(ref.ttfb_ms, 50):.3f}",
                "-" if ref is None else f"{ttfb99 - percentile(ref.ttfb_ms, 99):.3f}",
                f"{percentile(s.gaps_ms, 50):.3f}",
                f"{percentile(s.gaps_ms, 99):.3f}",
                f"{collapsed:.1%}",
                f"{percentile(s.total_ms, 50):.1f}",
                s.errors,
                s.usage_wrong,
            )
        )
    stack.print_table(
        (
            "target",
            "usage",
            "c",
            "streams",
            "streams/s",
            "TTFB p50",
            "TTFB p99",
            "added TTFB p50",
            "added TTFB p99",
            "gap p50",
            "gap p99",
            "gaps < half",
            "stream p50",
            "errors",
            "usage wrong",
        ),
        table,
    )


if __name__ == "__main__":
    main()

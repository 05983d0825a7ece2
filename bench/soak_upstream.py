"""The soak's providers: the suite's fake OpenAI and Anthropic servers, in a process of their own.

    python bench/soak_upstream.py OPENAI_PORT ANTHROPIC_PORT

Serves `tests/support`'s fakes (real aiohttp servers speaking OpenAI's and Anthropic's wire
formats, streams and usage included) on 127.0.0.1 at the two ports, each with a `/healthz`,
until SIGTERM or SIGINT. The fakes record every request and stream event they send; those lists
are emptied every second, so a long run holds no more than a second of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import fake_anthropic, fake_openai
from tests.support.fake_openai import FakeProvider

OPENAI_KEY = fake_openai.API_KEY
"""The credential the fake OpenAI server takes."""
ANTHROPIC_KEY = fake_anthropic.API_KEY
"""The credential the fake Anthropic server takes."""


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _serve(app: web.Application, port: int) -> web.AppRunner:
    app.router.add_get("/healthz", _healthz)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def _forget(fakes: list[FakeProvider], stop: asyncio.Event) -> None:
    while not stop.is_set():
        for fake in fakes:
            fake.received.clear()
            fake.streamed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


async def main(openai_port: int, anthropic_port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    openai = fake_openai.FakeOpenAI(url=f"http://127.0.0.1:{openai_port}/v1")
    anthropic = fake_anthropic.FakeAnthropic(url=f"http://127.0.0.1:{anthropic_port}")
    runners = [
        await _serve(fake_openai._app(openai), openai_port),
        await _serve(fake_anthropic._app(anthropic), anthropic_port),
    ]
    try:
        await _forget([openai, anthropic], stop)
    finally:
        for runner in runners:
            await runner.cleanup()


if __name__ == "__main__":
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it
        asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
    else:
        uvloop.run(main(int(sys.argv[1]), int(sys.argv[2])))

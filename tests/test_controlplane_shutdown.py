"""Stopping the control plane: readiness turns to draining, long-polls are answered, exit 0."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import pytest
from litestar import Litestar

from controlplane.lifecycle import Lifecycle
from tests.conftest import World, serve_in_loop, signed_get
from tests.support.clock import ManualClock
from tests.support.env import INTERNAL_SECRET, secrets_env
from tests.support.processes import clean_env, free_port, start, stop, wait_until_healthy
from vkgate import signing
from vkgate.wire import REVISION_HEADER

CHANGES = "/api/internal/gateway/changes"
EXIT_BOUND_S = 15.0
"""A bound on how long a stopping process may take, far below the grace and the poll timeout."""


def lifecycle_of(app: Litestar) -> Lifecycle:
    lifecycle: Lifecycle = app.state["vk"].lifecycle
    return lifecycle


async def test_a_draining_control_plane_is_not_ready_but_still_alive(
    client: httpx.AsyncClient, app: Litestar
) -> None:
    assert (await client.get("/readyz")).status_code == 200

    lifecycle_of(app).drain("test")

    ready = await client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json() == {"status": "draining", "database": "ok", "ledger": "ok"}
    assert (await client.get("/healthz")).status_code == 200
    assert "vkgate_controlplane_up 0.0" in (await client.get("/metrics")).text


async def test_draining_twice_is_draining_once(app: Litestar) -> None:
    lifecycle = lifecycle_of(app)
    lifecycle.drain("first")
    lifecycle.drain("second")
    assert lifecycle.draining


async def test_the_stop_signal_handler_is_wrapped_while_serving_and_restored_after(
    app: Litestar,
) -> None:
    # A server's Python handler, as uvicorn installs one, for the app to wrap. (What the test
    # run inherited may be "ignore", as in a shell's background job: nothing to wrap there.)
    def server_handler(sig: int, frame: FrameType | None) -> None:
        pass

    inherited = signal.signal(signal.SIGINT, server_handler)
    try:
        async with serve_in_loop(app, "http://cp.test"):
            assert signal.getsignal(signal.SIGINT) is not server_handler
        assert signal.getsignal(signal.SIGINT) is server_handler
    finally:
        signal.signal(signal.SIGINT, inherited)


# --- long-polls while draining, in the test's loop ---------------------------------------------
# The app re-reads the feed only hourly, so a poll that ends early was released, not timed out.


@pytest.fixture
async def concurrent(waking_app: Litestar) -> AsyncIterator[httpx.AsyncClient]:
    async with serve_in_loop(waking_app, "http://controlplane.test") as http:
        yield http


async def test_a_waiting_long_poll_is_answered_as_soon_as_draining_begins(
    waking_app: Litestar,
    concurrent: httpx.AsyncClient,
    parked: asyncio.Queue[None],
    clock: ManualClock,
    world: World,
) -> None:
    # The world's writes made revision 3: a poll since then waits.
    poll = asyncio.create_task(signed_get(concurrent, clock, f"{CHANGES}?since=3&timeout_s=25"))
    await asyncio.wait_for(parked.get(), 5)

    lifecycle_of(waking_app).drain("test")
    response = await asyncio.wait_for(poll, 5)

    assert response.status_code == 204
    assert response.headers[REVISION_HEADER] == "3"


async def test_a_new_long_poll_does_not_wait_while_draining(
    waking_app: Litestar, concurrent: httpx.AsyncClient, clock: ManualClock, world: World
) -> None:
    lifecycle_of(waking_app).drain("test")

    idle = signed_get(concurrent, clock, f"{CHANGES}?since=3&timeout_s=25")
    behind = signed_get(concurrent, clock, f"{CHANGES}?since=2&timeout_s=25")
    idle_answer = await asyncio.wait_for(idle, 5)
    behind_answer = await asyncio.wait_for(behind, 5)

    assert idle_answer.status_code == 204
    assert idle_answer.headers[REVISION_HEADER] == "3"
    # Events there are still delivered: a proxy catching up gets them before the door closes.
    assert behind_answer.status_code == 200
    assert behind_answer.json()["current_revision"] == 3


# --- a real process and a real signal -----------------------------------------------------------


def _long_poll(url: str) -> httpx.Response:
    path_and_query = f"{CHANGES}?timeout_s=25"
    with httpx.Client(timeout=40) as http:
        # The feed's revision first, so the poll waits instead of answering with old events.
        health = "/api/internal/gateway/health"
        headers = signing.signed_headers(INTERNAL_SECRET, "GET", health, b"", time.time())
        revision = http.get(f"{url}{health}", headers=headers).json()["revision"]
        path_and_query += f"&since={revision}"
        headers = signing.signed_headers(INTERNAL_SECRET, "GET", path_and_query, b"", time.time())
        return http.get(f"{url}{path_and_query}", headers=headers)


def _waiting_polls(url: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("vkgate_controlplane_feed_waiting_polls "):
            return float(line.split()[1])
    raise AssertionError("no vkgate_controlplane_feed_waiting_polls in /metrics")


def _events(output: str) -> dict[str, dict[str, Any]]:
    """The JSON log lines of the process's output, by event name (the last of each)."""
    found: dict[str, dict[str, Any]] = {}
    for line in output.splitlines():
        if line.startswith("{"):
            parsed = json.loads(line)
            if "event" in parsed:
                found[parsed["event"]] = parsed
    return found


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_answers_waiting_long_polls_and_exits_with_0(
    stop_signal: signal.Signals, tmp_path: Path
) -> None:
    port = free_port()
    env = clean_env(
        **secrets_env(f"sqlite:///{tmp_path / 'controlplane.db'}"),
        VKGATE_HOME=str(tmp_path),
        VKGATE_CONTROLPLANE_ADDR=f"127.0.0.1:{port}",
        # Longer than EXIT_BOUND_S: a poll left waiting would hold the process past the bound,
        # and then be cut rather than answered.
        VKGATE_SHUTDOWN_GRACE_SECONDS="20",
        VKGATE_LOG_FORMAT="json",
    )
    service = start(
        ["controlplane", "--migrate"], env=env, port=port, log=tmp_path / "cp.log", cwd=tmp_path
    )
    try:
        wait_until_healthy(service)
        with ThreadPoolExecutor(max_workers=1) as pool:
            poll = pool.submit(_long_poll, service.url)
            deadline = time.monotonic() + EXIT_BOUND_S
            while _waiting_polls(service.url) < 1:
                assert time.monotonic() < deadline, "the long-poll never started waiting"
                time.sleep(0.05)  # waiting on another process, bounded above

            service.process.send_signal(stop_signal)
            response = poll.result(timeout=EXIT_BOUND_S)
            code = service.process.wait(timeout=EXIT_BOUND_S)
    finally:
        stop(service.process)

    assert response.status_code == 204, response.text
    assert int(response.headers[REVISION_HEADER]) >= 0
    assert code == 0, service.output()
    events = _events(service.output())
    started = events["shutdown_started"]
    assert started["reason"] == stop_signal.name
    assert started["grace_s"] == 20.0
    assert started["released_polls"] == 1
    assert "shutdown_completed" in events

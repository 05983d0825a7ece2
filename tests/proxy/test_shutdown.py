"""`vkgate proxy` stopped by SIGTERM, as an orchestrator stops it: a stream in progress is
served to its end, the process exits 0, and its JSON log says what happened, in order."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import httpx

from tests.proxy.test_processes import admin_create, proxy_env
from tests.support.api import ADMIN
from tests.support.env import secrets_env
from tests.support.fake_openai import FakeOpenAI
from tests.support.processes import (
    EXIT_TIMEOUT_S,
    clean_env,
    free_port,
    running,
    start,
    stop,
    wait_until_healthy,
)

EVENTS = 20


def events(log: Path) -> list[dict[str, Any]]:
    """The log's JSON lines that are events."""
    lines = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # the last line, caught half written
            if "event" in record:
                lines.append(record)
    return lines


def logged(log: Path, name: str) -> None:
    """Wait until another process's log holds the event `name` (bounded: it fails after
    EXIT_TIMEOUT_S)."""
    deadline = time.monotonic() + EXIT_TIMEOUT_S
    while not any(record["event"] == name for record in events(log)):
        assert time.monotonic() < deadline, f"no {name} in {log.read_text()}"
        time.sleep(0.02)  # another process's log, polled: nothing here can be injected


async def test_sigterm_lets_a_stream_in_progress_finish_and_exits_cleanly(
    tmp_path: Path, fake_openai: FakeOpenAI
) -> None:
    port = free_port()
    env = clean_env(
        **secrets_env(f"sqlite:///{tmp_path / 'cp.db'}"),
        VKGATE_CONTROLPLANE_ADDR=f"127.0.0.1:{port}",
    )
    with running(
        ["controlplane", "--migrate"], env=env, port=port, log=tmp_path / "cp.log", cwd=tmp_path
    ) as controlplane:
        org = admin_create(controlplane, "/api/admin/organizations", {"name": "stopping"})["id"]
        project = admin_create(
            controlplane, "/api/admin/projects", {"organization_id": org, "name": "p"}
        )["id"]
        provider = admin_create(
            controlplane,
            "/api/admin/providers",
            {
                "organization_id": org,
                "name": "fake",
                "kind": "openai_compatible",
                "base_url": fake_openai.url,
                "api_key": fake_openai.api_key,
            },
        )["id"]
        policy = admin_create(
            controlplane,
            "/api/admin/routing-policies",
            {
                "organization_id": org,
                "name": "p",
                "aliases": {"chat": [{"provider_id": provider, "model": "gpt-4o-mini"}]},
            },
        )["id"]
        key = admin_create(
            controlplane,
            "/api/admin/virtual-keys",
            {"project_id": project, "name": "k", "routing_policy_id": policy},
        )["key"]
        assert ADMIN  # the admin token the control plane was started with

        proxy_port = free_port()
        proxy = start(
            ["proxy"],
            env=proxy_env(controlplane.url, proxy_port, VKGATE_SPOOL_DIR=str(tmp_path / "spool")),
            port=proxy_port,
            log=tmp_path / "proxy.log",
            cwd=tmp_path,
        )
        try:
            await asyncio.to_thread(wait_until_healthy, proxy)
            gate = fake_openai.stream_gate = asyncio.Event()
            fake_openai.stream_events = EVENTS
            body = {
                "model": "chat",
                "stream": True,
                "messages": [{"role": "user", "content": "count slowly"}],
            }
            received = b""
            async with (
                httpx.AsyncClient(timeout=30) as http,
                http.stream(
                    "POST",
                    f"{proxy.url}/v1/chat/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {key}"},
                ) as answer,
            ):
                assert answer.status_code == 200
                async for chunk in answer.aiter_bytes():
                    if not received:
                        # The stream is held open after its first event: stop the proxy now,
                        # and let the stream go on once the proxy has said it is stopping.
                        proxy.process.send_signal(signal.SIGTERM)
                        await asyncio.to_thread(logged, proxy.log, "shutdown_started")
                        gate.set()
                    received += chunk
            code = await asyncio.to_thread(proxy.process.wait, EXIT_TIMEOUT_S * 2)
        finally:
            fake_openai.stream_events, fake_openai.stream_gate = 0, None
            stop(proxy.process)
    assert received.rstrip().endswith(b"data: [DONE]"), received[-200:]
    # A stop that drained cleanly is a success, as the control plane's is: exit status 0.
    assert code == 0, proxy.output()
    names = [record["event"] for record in events(proxy.log)]
    assert "shutdown_started" in names and "shutdown_completed" in names, proxy.output()
    started = names.index("shutdown_started")
    assert names.index("request_completed") > started
    assert names.index("shutdown_completed") > names.index("request_completed")
    stopping = events(proxy.log)[started]
    assert stopping["reason"] == "SIGTERM" and stopping["in_flight"] == 1
    completed = next(r for r in events(proxy.log) if r["event"] == "request_completed")
    assert completed["status"] == 200
    assert events(proxy.log)[-1]["backlog_segments"] == 0

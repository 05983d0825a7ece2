"""How fast an admin write reaches a waiting change-feed long-poll (contract: within 1 s).

Starts the control plane in this process (SQLite in a temporary directory, served by uvicorn on
127.0.0.1 in a thread of its own), then N times: opens a signed long-poll (`timeout_s=20`),
makes an admin write that appends one event (a key PATCH), and times the poll's answer from
the moment the write was sent and from the moment its answer arrived. Prints a table in ms.

    .venv/bin/python bench/feed_wake.py [--iterations 50]
    .venv/bin/python bench/feed_wake.py --database-url postgresql+psycopg://postgres@127.0.0.1/DB \
        --cross-replica   # two control planes on one PostgreSQL: write to one, poll the other

The poll is given a moment to park on the server before each write; a negative "after the
write's answer" time means the woken poll answered before the write's own response did.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import math
import secrets
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from controlplane.app import create_app
from controlplane.migrate import upgrade
from controlplane.settings import ControlPlaneSettings
from vkgate import signing
from vkgate.wire import REVISION_HEADER

CHANGES = "/api/internal/gateway/changes"
POLL_TIMEOUT_S = 20
PARK_DELAY_S = 0.05  # lets the poll reach its wait before the write is sent
ITERATION_LIMIT_S = POLL_TIMEOUT_S + 5  # bounds a run even if a wake-up is lost


@dataclass(frozen=True)
class Sample:
    from_write_sent_ms: float
    from_write_answered_ms: float
    woken: bool


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def bench_env(home: Path, port: int, database_url: str | None) -> dict[str, str]:
    """Fresh secrets of the shapes start-up validation wants, like tests/support/env.py."""
    return {
        "VKGATE_HOME": str(home),
        "VKGATE_DATABASE_URL": database_url or f"sqlite:///{home / 'controlplane.db'}",
        "VKGATE_CONTROLPLANE_ADDR": f"127.0.0.1:{port}",
        "VKGATE_INTERNAL_SECRET": secrets.token_urlsafe(32),
        "VKGATE_JWT_SECRET": secrets.token_urlsafe(32),
        "VKGATE_KEY_PEPPER": secrets.token_urlsafe(32),
        "VKGATE_ENCRYPTION_KEY": base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
        "VKGATE_ADMIN_TOKEN": secrets.token_urlsafe(32),
        "VKGATE_LOG_LEVEL": "WARNING",
    }


@contextlib.contextmanager
def serving(settings: ControlPlaneSettings) -> Iterator[None]:
    """The control plane on uvicorn in a background thread, with its own event loop.

    A loop of its own keeps the bench client's work out of the server's timings."""
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings),
            host=settings.host,
            port=settings.port,
            log_level="warning",
            access_log=False,
        )
    )
    thread = threading.Thread(target=server.run, name="controlplane", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the control plane did not start")
        time.sleep(0.01)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(timeout=30)


class Bench:
    def __init__(
        self, client: httpx.AsyncClient, poller: httpx.AsyncClient, settings: ControlPlaneSettings
    ) -> None:
        self.client = client
        self.poller = poller
        self.secret = settings.internal_secret
        self.admin = {"Authorization": f"Bearer {settings.admin_token}"}

    async def post(self, path: str, body: dict[str, Any]) -> str:
        response = await self.client.post(path, json=body, headers=self.admin)
        response.raise_for_status()
        ident: str = response.json()["id"]
        return ident

    async def make_key(self) -> str:
        org = await self.post("/api/admin/organizations", {"name": "bench"})
        project = await self.post("/api/admin/projects", {"organization_id": org, "name": "p"})
        provider = await self.post(
            "/api/admin/providers", {"organization_id": org, "name": "demo", "kind": "mock"}
        )
        policy = await self.post(
            "/api/admin/routing-policies",
            {
                "organization_id": org,
                "name": "default",
                "aliases": {"fast": [{"provider_id": provider, "model": "mock-1"}]},
            },
        )
        return await self.post(
            "/api/admin/virtual-keys",
            {"project_id": project, "name": "bench", "routing_policy_id": policy},
        )

    async def poll(self, since: int) -> tuple[httpx.Response, float]:
        path = f"{CHANGES}?since={since}&timeout_s={POLL_TIMEOUT_S}"
        headers = signing.signed_headers(self.secret, "GET", path, b"", time.time())
        response = await self.poller.get(path, headers=headers)
        return response, time.perf_counter()

    async def current_revision(self) -> int:
        path = f"{CHANGES}?since=0&timeout_s=0"
        headers = signing.signed_headers(self.secret, "GET", path, b"", time.time())
        response = await self.client.get(path, headers=headers)
        if response.status_code == 204:
            return int(response.headers[REVISION_HEADER])
        return int(response.json()["current_revision"])

    async def one(self, vk_id: str, since: int, i: int) -> tuple[Sample, int]:
        poll = asyncio.create_task(self.poll(since))
        await asyncio.sleep(PARK_DELAY_S)
        sent = time.perf_counter()
        write = await self.client.patch(
            f"/api/admin/virtual-keys/{vk_id}", json={"metadata": {"i": str(i)}}, headers=self.admin
        )
        answered = time.perf_counter()
        write.raise_for_status()
        response, polled = await asyncio.wait_for(poll, ITERATION_LIMIT_S)
        woken = response.status_code == 200 and bool(response.json()["events"])
        revision = response.json()["current_revision"] if woken else since
        sample = Sample((polled - sent) * 1000, (polled - answered) * 1000, woken)
        return sample, revision


def percentile(values: list[float], p: float) -> float:
    """Nearest rank."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def table(samples: list[Sample]) -> str:
    rows = [
        ("write sent -> poll answered", [s.from_write_sent_ms for s in samples]),
        ("write answered -> poll answered", [s.from_write_answered_ms for s in samples]),
    ]
    header = f"{'ms':<33}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}"
    lines = [header, "-" * len(header)]
    for label, values in rows:
        cells = "".join(f"{percentile(values, p):>9.2f}" for p in (50, 90, 99))
        lines.append(f"{label:<33}{cells}{max(values):>9.2f}")
    woken = sum(s.woken for s in samples)
    lines.append(f"iterations: {len(samples)}, polls answered with the write's event: {woken}")
    return "\n".join(lines)


def url_of(settings: ControlPlaneSettings) -> str:
    return f"http://{settings.host}:{settings.port}"


async def run(
    writer: ControlPlaneSettings, poller: ControlPlaneSettings, iterations: int
) -> list[Sample]:
    timeout = POLL_TIMEOUT_S + 10
    async with (
        httpx.AsyncClient(base_url=url_of(writer), timeout=timeout) as client,
        httpx.AsyncClient(base_url=url_of(poller), timeout=timeout) as polls,
    ):
        bench = Bench(client, polls, writer)
        vk_id = await bench.make_key()
        since = await bench.current_revision()
        samples = []
        for i in range(iterations):
            sample, since = await bench.one(vk_id, since, i)
            samples.append(sample)
        return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--database-url", help="an empty, migratable database (default: SQLite)")
    parser.add_argument(
        "--cross-replica", action="store_true", help="write to one replica, poll another"
    )
    args = parser.parse_args()
    if args.cross_replica and not (args.database_url or "").startswith("postgresql"):
        parser.error("--cross-replica needs a PostgreSQL --database-url")
    with tempfile.TemporaryDirectory(prefix="vkgate-bench-") as tmp, contextlib.ExitStack() as up:
        home = Path(tmp)
        writer = ControlPlaneSettings.from_env(bench_env(home, free_port(), args.database_url))
        upgrade(writer.database_url)
        poller = dataclasses.replace(writer, port=free_port()) if args.cross_replica else writer
        for settings in {writer.port: writer, poller.port: poller}.values():
            up.enter_context(serving(settings))
        samples = asyncio.run(run(writer, poller, args.iterations))
    store = "PostgreSQL" if writer.database_url.startswith("postgresql") else "SQLite"
    topology = "write to replica A, poll replica B" if args.cross_replica else "one replica"
    print(f"feed wake-up latency, uvicorn + {store}, {topology}, N={len(samples)}")
    print(table(samples))


if __name__ == "__main__":
    main()

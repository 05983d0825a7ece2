"""`VKGATE_PROXY_WORKERS` above 1: worker processes that each listen on the port themselves.

The sockets and connections of each worker are read from /proc (Linux, as the proxy runs), so
nothing is asked of the proxy that a user would not ask.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from proxy.workers import STARTUP_FAILURE, Workers
from tests.support.env import INTERNAL_SECRET
from tests.support.processes import (
    EXIT_TIMEOUT_S,
    POLL_INTERVAL_S,
    READY_TIMEOUT_S,
    Service,
    clean_env,
    free_port,
    running,
    vkgate,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads sockets from /proc")

LISTEN, ESTABLISHED = "0A", "01"
CONNECTIONS = 32
"""Opened at once: with two workers, all of them on one worker has a chance of 2 in 2**32."""


def workers_env(port: int, **extra: str) -> dict[str, str]:
    return clean_env(
        VKGATE_INTERNAL_SECRET=INTERNAL_SECRET,
        # Nothing here needs the control plane: /healthz answers without it.
        VKGATE_CONTROLPLANE_URL="http://127.0.0.1:9",
        VKGATE_PROXY_ADDR=f"127.0.0.1:{port}",
        VKGATE_PROXY_WORKERS="2",
        **extra,
    )


@contextmanager
def proxy_workers(tmp_path: Path) -> Iterator[tuple[Service, int]]:
    port = free_port()
    with running(
        ["proxy"], env=workers_env(port), port=port, log=tmp_path / "proxy.log", cwd=tmp_path
    ) as proxy:
        yield proxy, port


def sockets_on(port: int, state: str) -> set[int]:
    """Inodes of the IPv4 TCP sockets whose local port is `port`, in `state`."""
    inodes = set()
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == state:
                inodes.add(int(fields[9]))
    return inodes


def owners(inodes: set[int], pids: list[int]) -> dict[int, int]:
    """How many of `inodes` each of `pids` holds open (pids holding none are left out)."""
    held: dict[int, int] = {}
    for pid in pids:
        try:
            names = os.listdir(f"/proc/{pid}/fd")
        except FileNotFoundError:
            continue
        for name in names:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{name}")
            except FileNotFoundError:
                continue
            if target.startswith("socket:[") and int(target[8:-1]) in inodes:
                held[pid] = held.get(pid, 0) + 1
    return held


def children(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as listed:
            found += [int(child) for child in listed.read().split()]
    return found


def listeners(proxy: Service, port: int, *, count: int = 2) -> dict[int, int]:
    """The worker processes listening on `port` once `count` of them are (each with one
    socket), waiting for workers still starting."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        held = owners(sockets_on(port, LISTEN), children(proxy.process.pid))
        if len(held) >= count or time.monotonic() > deadline:
            return held
        time.sleep(POLL_INTERVAL_S)  # waiting on worker processes to start, bounded above


def healthz_over(connections: list[socket.socket], port: int) -> None:
    request = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    for conn in connections:
        conn.sendall(request)
    for conn in connections:
        assert conn.recv(65536).startswith(b"HTTP/1.1 200 "), "a worker did not answer /healthz"


def test_each_worker_listens_itself_and_new_connections_reach_both(tmp_path: Path) -> None:
    with proxy_workers(tmp_path) as (proxy, port), ExitStack() as stack:
        held = listeners(proxy, port)
        assert sorted(held.values()) == [1, 1], proxy.output()
        # The parent holds the port but listens on nothing (no connection can wait on it).
        assert not owners(sockets_on(port, LISTEN), [proxy.process.pid])

        connections = [
            stack.enter_context(socket.create_connection(("127.0.0.1", port)))
            for _ in range(CONNECTIONS)
        ]
        healthz_over(connections, port)

        served = owners(sockets_on(port, ESTABLISHED), list(held))
        assert set(served) == set(held), served
        assert sum(served.values()) == CONNECTIONS


def test_a_worker_that_dies_is_replaced_and_sigterm_stops_them_all(tmp_path: Path) -> None:
    with proxy_workers(tmp_path) as (proxy, port):
        first = listeners(proxy, port)
        dead, kept = sorted(first)
        os.kill(dead, signal.SIGKILL)

        deadline = time.monotonic() + READY_TIMEOUT_S
        while (now := listeners(proxy, port)).keys() == first.keys() or len(now) < 2:
            assert time.monotonic() < deadline, proxy.output()
            time.sleep(POLL_INTERVAL_S)  # waiting on the replacement to start, bounded above
        assert kept in now and dead not in now
        with socket.create_connection(("127.0.0.1", port)) as conn:
            healthz_over([conn], port)
        assert '"event":"proxy_worker_died"' in proxy.output().replace(" ", "")

        proxy.process.terminate()
        assert proxy.process.wait(timeout=EXIT_TIMEOUT_S) == 0
        for pid in now:
            assert not os.path.exists(f"/proc/{pid}"), f"worker {pid} outlived the proxy"


def gone(pid: int) -> bool:
    """Exited: no process, or one its new parent has not reaped yet."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_workers_stop_when_their_parent_is_killed(tmp_path: Path) -> None:
    with proxy_workers(tmp_path) as (proxy, port):
        workers = listeners(proxy, port)
        assert len(workers) == 2, proxy.output()
        proxy.process.kill()
        proxy.process.wait(timeout=EXIT_TIMEOUT_S)
        deadline = time.monotonic() + EXIT_TIMEOUT_S
        while not all(gone(pid) for pid in workers):
            assert time.monotonic() < deadline, f"workers {sorted(workers)} outlived their parent"
            time.sleep(POLL_INTERVAL_S)  # waiting on other processes to exit, bounded above


def test_a_port_another_program_holds_is_refused_by_name(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = vkgate("proxy", env=workers_env(port), cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"vkgate proxy: cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


def fails_at_start(_host: str, _port: int, _options: dict[str, object]) -> None:
    sys.exit(STARTUP_FAILURE)


def test_a_worker_failing_before_it_serves_stops_the_rest_instead_of_restarting() -> None:
    workers = Workers(2, "127.0.0.1", 0, {}, stop_grace_s=1.0, target=fails_at_start)
    workers.run()
    assert workers.failed
    assert [p.exitcode for p in workers.processes] == [STARTUP_FAILURE] * 2 or all(
        p.exitcode is not None for p in workers.processes
    )

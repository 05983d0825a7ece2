"""Throwaway Redis servers of a test's own: one server, or a Redis Cluster of three masters.

Each is a real `redis-server` on loopback, on free ports, in a temporary directory, without
persistence; it is stopped by its PID at the end (never by name: other tests and other
checkouts share this machine's Redis). A cluster is made as an operator makes one, with
`redis-cli --cluster create`. Every wait is a poll bounded by a deadline.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from tests.support.processes import stop

READY_TIMEOUT_S = 45.0
POLL_INTERVAL_S = 0.05
BUS_OFFSET = 10_000
"""A cluster node also listens on its port plus this, for the other nodes."""


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed")
    return found


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def node_port() -> int:
    """A free port whose cluster bus port (port + 10,000) is free too."""
    for _ in range(200):
        port = random.randrange(20_000, 50_000)
        if _bindable(port) and _bindable(port + BUS_OFFSET):
            return port
    raise AssertionError("no free pair of ports for a Redis node")


@dataclass
class RedisServer:
    """One `redis-server` process; `restart` brings it back on the same port and directory."""

    port: int
    directory: Path
    cluster: bool
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [
            _binary("redis-server"),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.directory),
        ]
        if self.cluster:
            args += [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
            ]
        with (self.directory / "redis.log").open("ab") as log:
            self.process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        self._wait_for_ping()

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)
            self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def _wait_for_ping(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1)
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.exceptions.ConnectionError:
                    assert self.process is not None
                    if self.process.poll() is not None or time.monotonic() > deadline:
                        raise AssertionError(
                            f"redis-server on {self.port} did not come up"
                        ) from None
                    time.sleep(POLL_INTERVAL_S)  # waiting on another process, bounded above
        finally:
            client.close()


@dataclass
class RedisCluster:
    nodes: list[RedisServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        """One node's URL: the client finds the others."""
        return self.nodes[0].url

    def wait_until_ok(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Until every node says the cluster serves every slot."""
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            client = redis.Redis(host="127.0.0.1", port=node.port, socket_connect_timeout=1)
            try:
                while True:
                    try:
                        if client.cluster("info").get("cluster_state") == "ok":
                            break
                    except redis.exceptions.RedisError:
                        pass
                    assert time.monotonic() < deadline, f"cluster not ok on {node.port}"
                    time.sleep(POLL_INTERVAL_S)  # waiting on other processes, bounded above
            finally:
                client.close()


@contextmanager
def redis_server(directory: Path) -> Iterator[RedisServer]:
    server = RedisServer(node_port(), directory, cluster=False)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@contextmanager
def redis_cluster(directory: Path, masters: int = 3) -> Iterator[RedisCluster]:
    """`masters` cluster nodes joined by `redis-cli --cluster create`, no replicas."""
    cluster = RedisCluster()
    with ExitStack() as stack:
        for n in range(masters):
            node = RedisServer(node_port(), directory / f"node-{n}", cluster=True)
            stack.callback(node.stop)
            node.start()
            cluster.nodes.append(node)
        created = subprocess.run(
            [
                _binary("redis-cli"),
                "--cluster",
                "create",
                *(f"127.0.0.1:{node.port}" for node in cluster.nodes),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=READY_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        assert created.returncode == 0, created.stdout + created.stderr
        cluster.wait_until_ok()
        yield cluster

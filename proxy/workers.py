"""Several proxy worker processes on one port, each accepting from a listening socket of its own.

uvicorn's own supervisor binds one socket and hands it to every worker. A worker's event loop,
woken by a waiting connection, accepts every connection waiting then, so a burst of new
connections (a client pool opening, a load balancer reconnecting) lands on whichever worker
woke first, and stays there for as long as it is kept alive: 16 connections opened at once by
wrk after a run at c=1 went 16 to one worker and 0 to the other, and two workers served what
one does (bench/README.md). Here each worker binds its own socket to the port with
SO_REUSEPORT, and the kernel spreads new connections over the sockets by a hash of their
addresses.

The parent holds the port bound (not listening, so no connection waits on it): a port taken by
another program is refused before any worker starts, and port 0 names one port for them all.
It restarts a worker that dies, stops them all on SIGINT, SIGTERM or SIGHUP, and stops with an
error when a worker fails before it serves (the same failure would follow every restart). A
worker whose parent dies stops too.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.context import SpawnProcess
from types import FrameType
from typing import Any

from vkgate.logs import event
from vkgate.stopping import returning_server

log = logging.getLogger("vkgate.proxy")

STARTUP_FAILURE = 3
"""Exit code of a worker that never served (uvicorn's own for the same case)."""
PR_SET_PDEATHSIG = 1
POLL_S = 0.5
"""How often the parent looks for a worker that died."""
EXIT_MARGIN_S = 5.0
"""Allowed past a worker's own bound on stopping before it is killed."""


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Each stops the workers, then the parent (a hangup too: unhandled, it would end the parent
and leave its workers serving unsupervised)."""


class WorkersError(Exception):
    """The workers cannot be started: the message says why."""


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port) with SO_REUSEPORT, not yet listening."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def run_worker(host: str, port: int, options: dict[str, Any]) -> None:
    """One worker: its own socket on the port, served by uvicorn (`options`: uvicorn.Config's)."""
    import uvicorn

    _stop_with_parent()
    try:
        sock = listening_socket(host, port)
    except OSError as exc:
        print(f"proxy worker cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        sys.exit(STARTUP_FAILURE)
    server = returning_server(uvicorn.Config(**options, host=host, port=port, workers=1))
    server.run(sockets=[sock])
    if not server.started:
        sys.exit(STARTUP_FAILURE)


def _stop_with_parent() -> None:
    """Linux: be sent SIGTERM when the parent dies, even by SIGKILL, rather than serve on
    unsupervised (a worker stops as on any SIGTERM: its requests drain first)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # it died before the request was made
        sys.exit(STARTUP_FAILURE)


class Workers:
    """`count` worker processes serving (host, port), kept at that number until stopped."""

    def __init__(
        self,
        count: int,
        host: str,
        port: int,
        options: dict[str, Any],
        *,
        stop_grace_s: float,
        target: Callable[[str, int, dict[str, Any]], None] = run_worker,
    ) -> None:
        self.count = count
        self.host = host
        self._options = options
        self._stop_grace_s = stop_grace_s
        self._target = target
        self._context = multiprocessing.get_context("spawn")
        self._stop = threading.Event()
        self.failed = False
        """A worker failed before serving: the parent stopped the others and should exit 1."""
        try:
            self._held = listening_socket(host, port)
        except OSError as exc:
            raise WorkersError(f"cannot listen on {host}:{port}: {exc}") from None
        self.port: int = self._held.getsockname()[1]
        self.processes: list[SpawnProcess] = []

    def run(self) -> None:
        """Start the workers and keep them running until one of `STOP_SIGNALS` comes."""
        previous = {signum: signal.signal(signum, self._on_signal) for signum in STOP_SIGNALS}
        try:
            self.processes = [self._start() for _ in range(self.count)]
            event(
                log, "proxy_workers_started", workers=self.count, address=f"{self.host}:{self.port}"
            )
            while not self._stop.wait(POLL_S):
                self._replace_dead()
        finally:
            self._stop_all()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self._held.close()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._stop.set()

    def _start(self) -> SpawnProcess:
        process = self._context.Process(
            target=self._target,
            args=(self.host, self.port, self._options),
            name="vkgate-proxy-worker",
        )
        process.start()
        return process

    def _replace_dead(self) -> None:
        for index, process in enumerate(self.processes):
            if process.is_alive() or self._stop.is_set():
                continue
            process.join()
            if process.exitcode == STARTUP_FAILURE:
                event(
                    log,
                    "proxy_worker_failed_to_start",
                    level=logging.ERROR,
                    pid=process.pid,
                    reason="a worker failed before serving; stopping the others",
                )
                self.failed = True
                self._stop.set()
                return
            event(
                log,
                "proxy_worker_died",
                level=logging.ERROR,
                pid=process.pid,
                exit_code=process.exitcode,
                reason="starting another",
            )
            self.processes[index] = self._start()

    def _stop_all(self) -> None:
        for process in self.processes:
            if process.is_alive() and process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
        # A worker bounds its own stop (`stop_grace_s`); a little more is allowed for its exit
        # before it is killed. All were asked at once, so all take that time together.
        deadline = time.monotonic() + self._stop_grace_s + EXIT_MARGIN_S
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()

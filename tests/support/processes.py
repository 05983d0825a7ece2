"""vkgate as a user runs it: real `python -m vkgate` processes on loopback, always cleaned up."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx

READY_TIMEOUT_S = 45.0
POLL_INTERVAL_S = 0.05
EXIT_TIMEOUT_S = 10.0
CLI_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def clean_env(**extra: str) -> dict[str, str]:
    """The test runner's environment minus every `VKGATE_*` variable, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VKGATE_")}
    env["PYTHONUNBUFFERED"] = "1"  # so a banner reaches its log file before the server runs
    # Proxies started side by side would all ask for the default metrics port.
    env["VKGATE_METRICS_ADDR"] = "off"
    env.update(extra)
    return env


def vkgate(
    *args: str,
    env: Mapping[str, str],
    cwd: Path | None = None,
    timeout: float = CLI_TIMEOUT_S,
) -> subprocess.CompletedProcess[str]:
    """Run one `vkgate …` command to completion; a hung command is killed by the timeout."""
    return subprocess.run(
        [sys.executable, "-m", "vkgate", *args],
        env=dict(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@dataclass
class Service:
    """A running `vkgate` server process and where its output goes."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def wait_until_healthy(service: Service, timeout: float = READY_TIMEOUT_S) -> None:
    """Poll GET /healthz until it answers 200; fail with the process's output if it never does."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=1.0) as client:
        while time.monotonic() < deadline:
            if service.process.poll() is not None:
                raise AssertionError(
                    f"vkgate exited with {service.process.returncode} before it was healthy:\n"
                    f"{service.output()}"
                )
            try:
                if client.get(f"{service.url}/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(POLL_INTERVAL_S)  # waiting on another process to come up, bounded above
    raise AssertionError(f"vkgate was not healthy within {timeout} s:\n{service.output()}")


def wait_until_closed(url: str, timeout: float = EXIT_TIMEOUT_S) -> None:
    """Poll `url` until nothing accepts connections there: whatever served it has gone."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=1.0) as client:
        while time.monotonic() < deadline:
            try:
                client.get(f"{url}/healthz")
            except httpx.TransportError:
                return
            time.sleep(POLL_INTERVAL_S)  # waiting on another process to exit, bounded above
    raise AssertionError(f"{url} still answers {timeout} s after its server was stopped")


def stop(process: subprocess.Popen[bytes]) -> None:
    """Terminate this process (by its own PID), then kill it if it does not exit in time."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=EXIT_TIMEOUT_S)


def start(
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    port: int,
    log: Path,
    cwd: Path | None = None,
    own_group: bool = False,
) -> Service:
    """Start `vkgate ARGS` (to serve on 127.0.0.1:`port`) with its output going to `log`.

    `own_group` makes it lead a new process group, so `kill_group` can reach any child it
    leaves behind.
    """
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "vkgate", *args],
            env=dict(env),
            cwd=cwd,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=own_group,
        )
    return Service(process, f"http://127.0.0.1:{port}", log)


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """Kill what is left of the process group `process` leads (started with `own_group`)."""
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


@contextmanager
def running(
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    port: int,
    log: Path,
    cwd: Path | None = None,
) -> Iterator[Service]:
    """Start `vkgate ARGS` serving on 127.0.0.1:`port`, wait until healthy, stop it afterwards."""
    service = start(args, env=env, port=port, log=log, cwd=cwd)
    try:
        wait_until_healthy(service)
        yield service
    finally:
        stop(service.process)


def banner_value(output: str, label: str) -> str:
    """The value after `label` on a line of a banner `vkgate up` printed."""
    match = re.search(rf"^\s*{label}\s+(\S+)", output, re.MULTILINE)
    assert match, f"no {label!r} line in:\n{output}"
    return match.group(1)


@contextmanager
def sqlite_controlplane(home: Path) -> Iterator[Service]:
    """`vkgate controlplane --migrate` on a SQLite database and an embedded ledger in `home`."""
    from tests.support.env import secrets_env

    port = free_port()
    env = clean_env(
        **secrets_env(f"sqlite:///{home / 'controlplane.db'}"),
        VKGATE_HOME=str(home),
        VKGATE_CONTROLPLANE_ADDR=f"127.0.0.1:{port}",
    )
    with running(
        ["controlplane", "--migrate"], env=env, port=port, log=home / "controlplane.log", cwd=home
    ) as service:
        yield service

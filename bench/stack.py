"""What the benchmarks share: starting nginx, a control plane and proxies, seeding, measuring.

Everything listens on 127.0.0.1 only. Every process is started by `started`, which stops it by
its PID (SIGTERM, a wait, then SIGKILL) however the benchmark ends; `stack()` also removes its
working directory when the run succeeded (a failed run keeps it, for the services' logs).

    with stack() as services:                         # nginx and a control plane
        with services.admin() as admin:
            org = seed_organization(admin, {"plain": services.upstream + "/v1"}, {MODEL: ["plain"]})
            key = create_key(admin, org)["key"]
        with services.proxy({"VKGATE_LOG_LEVEL": "WARNING"}) as proxy:
            result = wrk(f"{proxy.url}/v1/chat/completions", 16, "5s", {"BENCH_KEY": key})
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import math
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
VKGATE = [sys.executable, "-m", "vkgate"]
MODEL = "gpt-4o-mini"
"""The upstream model every seeded alias names."""
PRICE = {"input_per_mtok": "0.15", "output_per_mtok": "0.6"}
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


# -- processes -------------------------------------------------------------------------------


def free_port() -> int:
    """A loopback port free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_ok(url: str, process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Wait until `url` answers 200; give up if `process` exits or `timeout` passes."""
    _wait(url, process, timeout, lambda status: status == 200)


def wait_listening(url: str, process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Wait until `url` gives any HTTP answer (for a server without a health route)."""
    _wait(url, process, timeout, lambda _status: True)


def _wait(
    url: str, process: subprocess.Popen[bytes], timeout: float, ready: Callable[[int], bool]
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{process.args!r} exited with {process.returncode}")
        try:
            if ready(httpx.get(url, timeout=1).status_code):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} did not answer in {timeout} s")


@contextmanager
def started(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`args` running, its output to `log`; stopped by its PID on the way out (SIGTERM, up to
    15 s, then SIGKILL)."""
    with log.open("wb") as out:
        process = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def require(*tools: str) -> None:
    for tool in tools:
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is needed: apt-get install nginx-light wrk")


def _descendants(pid: int) -> list[int]:
    """`pid` and every process below it (a server's worker processes)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields start after the last ")".
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(parents.get(current, ()))
    return found


def rss_bytes(pid: int) -> int:
    """Resident memory of `pid` and its descendants, from /proc/<pid>/statm."""
    total = 0
    for each in _descendants(pid):
        with contextlib.suppress(OSError):  # it ended meanwhile
            total += int(Path(f"/proc/{each}/statm").read_text().split()[1]) * _PAGE
    return total


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of `pid` and its descendants, from /proc/<pid>/stat."""
    ticks = 0
    for each in _descendants(pid):
        try:
            stat = Path(f"/proc/{each}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return ticks / _CLOCK_TICKS


# -- the services ----------------------------------------------------------------------------


def service_env(work: Path, controlplane_port: int, token: str, log_level: str) -> dict[str, str]:
    """The environment both services start with: this process's, minus any `VKGATE_*`, plus
    fresh secrets and a home under `work`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VKGATE_")}
    env.update(
        {
            "VKGATE_HOME": str(work / "home"),
            "VKGATE_CONTROLPLANE_ADDR": f"127.0.0.1:{controlplane_port}",
            "VKGATE_CONTROLPLANE_URL": f"http://127.0.0.1:{controlplane_port}",
            "VKGATE_INTERNAL_SECRET": secrets.token_urlsafe(48),
            "VKGATE_JWT_SECRET": secrets.token_urlsafe(48),
            "VKGATE_KEY_PEPPER": secrets.token_urlsafe(48),
            "VKGATE_ENCRYPTION_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            "VKGATE_ADMIN_TOKEN": token,
            # INFO, as deployed: a proxy then writes one `request_completed` line a request.
            "VKGATE_LOG_LEVEL": log_level,
        }
    )
    return env


def make_workdir() -> Path:
    work = Path(tempfile.mkdtemp(prefix="vkgate-bench-"))
    (work / "logs").mkdir()
    (work / "tmp").mkdir()
    return work


@contextmanager
def nginx(work: Path, env: dict[str, str], port: int) -> Iterator[str]:
    """The fixed-answer upstream of `upstream.nginx.conf`; yields its base URL."""
    conf = (HERE / "upstream.nginx.conf").read_text().replace("{port}", str(port))
    (work / "nginx.conf").write_text(conf)
    args = ["nginx", "-p", str(work), "-c", str(work / "nginx.conf")]
    with started(args, env, work / "nginx.log") as process:
        url = f"http://127.0.0.1:{port}"
        wait_ok(f"{url}/healthz", process)
        yield url


@contextmanager
def controlplane(work: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """`vkgate controlplane --migrate` at `env`'s VKGATE_CONTROLPLANE_URL, answering."""
    with started([*VKGATE, "controlplane", "--migrate"], env, work / "controlplane.log") as cp:
        wait_ok(f"{env['VKGATE_CONTROLPLANE_URL']}/healthz", cp)
        yield cp


@dataclass(frozen=True)
class Proxy:
    url: str
    """Base URL: `{url}/v1/chat/completions`."""
    metrics: str
    """The metrics listener's `/metrics` URL."""
    process: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.process.pid


@contextmanager
def proxy(
    work: Path, env: dict[str, str], extra: Mapping[str, str] | None = None, name: str = "proxy"
) -> Iterator[Proxy]:
    """`vkgate proxy` on a free port with `extra` settings, answering `/healthz`."""
    port, metrics_port = free_port(), free_port()
    proxy_env = {
        **env,
        "VKGATE_PROXY_ADDR": f"127.0.0.1:{port}",
        "VKGATE_METRICS_ADDR": f"127.0.0.1:{metrics_port}",
        **(extra or {}),
    }
    with started([*VKGATE, "proxy"], proxy_env, work / f"{name}.log") as process:
        url = f"http://127.0.0.1:{port}"
        wait_ok(f"{url}/healthz", process)
        yield Proxy(url, f"http://127.0.0.1:{metrics_port}/metrics", process)


@dataclass
class Stack:
    """A running upstream (unless left out) and control plane, and what proxies need."""

    work: Path
    env: dict[str, str]
    token: str
    controlplane: str
    """The control plane's base URL."""
    controlplane_pid: int = 0
    controlplane_process: subprocess.Popen[bytes] | None = None
    """The control plane's process, for a benchmark that stops it before the stack ends."""
    upstream: str = ""
    """nginx's base URL; empty when it was left out."""
    proxies: list[str] = field(default_factory=list)

    def admin(self) -> Admin:
        return Admin(self.controlplane, self.token)

    def key_to(self, base_url: str, provider: str = "plain") -> str:
        """A new organization's key whose `MODEL` goes to the OpenAI-compatible `base_url`."""
        with self.admin() as admin:
            org = seed_organization(admin, {provider: base_url}, {MODEL: [provider]})
            return str(create_key(admin, org)["key"])

    @contextmanager
    def proxy(self, extra: Mapping[str, str] | None = None, name: str = "proxy") -> Iterator[Proxy]:
        """A proxy of this stack; each gets a log of its own (`name`, made unique)."""
        unique = f"{name}-{len(self.proxies)}"
        self.proxies.append(unique)
        with proxy(self.work, self.env, extra, unique) as running:
            yield running


@contextmanager
def stack(log_level: str = "INFO", *, upstream: bool = True) -> Iterator[Stack]:
    """nginx (with `upstream`) and a control plane with a fresh SQLite store and secrets."""
    work = make_workdir()
    cp_port = free_port()
    token = "vka-" + secrets.token_urlsafe(32)
    env = service_env(work, cp_port, token, log_level)
    running = Stack(work, env, token, f"http://127.0.0.1:{cp_port}")
    try:
        with _upstream(upstream, work, env) as upstream_url, controlplane(work, env) as cp:
            running.upstream, running.controlplane_pid = upstream_url, cp.pid
            running.controlplane_process = cp
            yield running
    except BaseException:
        print(f"services' logs kept in {work}", file=sys.stderr)
        raise
    shutil.rmtree(work, ignore_errors=True)


@contextmanager
def _upstream(wanted: bool, work: Path, env: dict[str, str]) -> Iterator[str]:
    if not wanted:
        yield ""
        return
    with nginx(work, env, free_port()) as url:
        yield url


def add_service_arguments(parser: argparse.ArgumentParser) -> None:
    """`--proxy-env NAME=VALUE` (repeatable) and `--log-level`, which every benchmark takes."""
    parser.add_argument(
        "--proxy-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for the proxies measured (repeatable), e.g. VKGATE_LOG_REQUESTS=false",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        help="the services' VKGATE_LOG_LEVEL (INFO, the default, logs every request)",
    )


def proxy_env_args(settings: Sequence[str]) -> dict[str, str]:
    """`NAME=VALUE` settings from the command line (`--proxy-env`), as a mapping."""
    pairs = {}
    for setting in settings:
        name, sep, value = setting.partition("=")
        if not sep or not name.startswith("VKGATE_"):
            raise SystemExit(f"--proxy-env takes VKGATE_NAME=VALUE, got {setting!r}")
        pairs[name] = value
    return pairs


# -- seeding ---------------------------------------------------------------------------------


class Admin:
    """The control plane's admin API, as the admin token."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.headers = {"Authorization": f"Bearer {token}"}
        self._api = httpx.Client(base_url=url, headers=self.headers, timeout=30)

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self._api.close()

    def post(self, path: str, body: Mapping[str, object]) -> dict[str, Any]:
        response = self._api.post(path, json=body)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result


@dataclass(frozen=True)
class Organization:
    id: str
    project: str
    policy: str
    providers: dict[str, str]
    """Provider name -> id."""


def seed_organization(
    admin: Admin,
    providers: Mapping[str, str],
    aliases: Mapping[str, Sequence[str]],
    *,
    name: str = "bench",
) -> Organization:
    """An organization with a project, `openai_compatible` providers (name -> base URL, priced
    for `MODEL`) and one routing policy whose aliases (alias -> provider names, in order) all
    name `MODEL` upstream."""
    org = admin.post("/api/admin/organizations", {"name": name})["id"]
    project = admin.post("/api/admin/projects", {"organization_id": org, "name": name})["id"]
    ids = {}
    for provider, base_url in providers.items():
        ids[provider] = admin.post(
            "/api/admin/providers",
            {
                "organization_id": org,
                "name": provider,
                "kind": "openai_compatible",
                "base_url": base_url,
                "api_key": "sk-bench-upstream",
                "price_overrides": {MODEL: PRICE},
            },
        )["id"]
    policy = admin.post(
        "/api/admin/routing-policies",
        {
            "organization_id": org,
            "name": name,
            "aliases": {
                alias: [{"provider_id": ids[p], "model": MODEL} for p in chain]
                for alias, chain in aliases.items()
            },
        },
    )["id"]
    return Organization(org, project, policy, ids)


def key_body(
    org: Organization, name: str, limits: Mapping[str, int] | None = None
) -> dict[str, object]:
    body: dict[str, object] = {
        "project_id": org.project,
        "name": name,
        "routing_policy_id": org.policy,
    }
    if limits is not None:
        body["limits"] = dict(limits)
    return body


def create_key(
    admin: Admin, org: Organization, name: str = "bench", limits: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """A virtual key of `org`'s project and policy: the admin API's answer (`id`, `key`, …)."""
    return admin.post("/api/admin/virtual-keys", key_body(org, name, limits))


async def _create_keys(
    admin: Admin, org: Organization, n: int, concurrency: int, prefix: str
) -> list[str]:
    slots = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=admin.url, headers=admin.headers, timeout=60) as api:

        async def one(i: int) -> str:
            async with slots:
                response = await api.post(
                    "/api/admin/virtual-keys", json=key_body(org, f"{prefix}{i}")
                )
                response.raise_for_status()
                return str(response.json()["key"])

        return list(await asyncio.gather(*(one(i) for i in range(n))))


def create_keys(
    admin: Admin, org: Organization, n: int, *, concurrency: int = 4, prefix: str = "bench-"
) -> list[str]:
    """`n` keys through the admin API, `concurrency` POSTs at a time (there is no bulk route;
    the control plane serialises the writes, so more at once gains little)."""
    return asyncio.run(_create_keys(admin, org, n, concurrency, prefix))


# -- measuring -------------------------------------------------------------------------------

WRK_RESULT = re.compile(r"RESULT ([\d.]+) ([\d.]+) ([\d.]+) (\d+) (\d+) (\d+)")
PEERS_RESULT = re.compile(
    r"BENCH_RESULT rps=([\d.]+) p50_ms=([\d.]+) .*?p99_ms=([\d.]+) .*?requests=(\d+) "
    r"non2xx=(\d+) sockerr=(\d+)"
)
"""The line `peers/chat.lua` (run.sh's script) prints, read alike."""


@dataclass(frozen=True)
class WrkResult:
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    non2xx: int
    errors: int
    output: str


def _wrk_args(url: str, concurrency: int, duration: str, script: str) -> list[str]:
    return [
        "wrk",
        "-t1",
        f"-c{concurrency}",
        f"-d{duration}",
        "--latency",
        "-s",
        str(HERE / script),
        url,
    ]


def _wrk_result(output: str) -> WrkResult:
    found = WRK_RESULT.search(output) or PEERS_RESULT.search(output)
    if found is None:
        raise SystemExit(f"wrk printed no result:\n{output}")
    rps, p50, p99, requests, non2xx, errors = found.groups()
    return WrkResult(
        float(rps), float(p50), float(p99), int(requests), int(non2xx), int(errors), output
    )


def wrk(
    url: str,
    concurrency: int,
    duration: str,
    env: dict[str, str],
    script: str = "load.lua",
    timeout: float = 120,
) -> WrkResult:
    """One `wrk -t1` run with a script of this directory that prints a `RESULT` line (or
    `peers/chat.lua`, run.sh's own)."""
    output = subprocess.run(
        _wrk_args(url, concurrency, duration, script),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    ).stdout
    return _wrk_result(output)


def wrk_count(
    url: str,
    concurrency: int,
    requests: int,
    env: dict[str, str],
    script: str,
    work: Path,
    limit_s: int = 120,
) -> WrkResult:
    """`wrk -t1` until `script` has had `requests` responses, `limit_s` seconds at most.

    The script stops its thread at `BENCH_STOP_AFTER` responses and creates `BENCH_DONE_FILE`;
    wrk itself would still wait out its whole `-d`, so it is interrupted (SIGINT: it then
    prints its summary) as soon as that file exists.
    """
    done = work / f"wrk-done-{secrets.token_hex(4)}"
    env = {**env, "BENCH_STOP_AFTER": str(requests), "BENCH_DONE_FILE": str(done)}
    args = _wrk_args(url, concurrency, f"{limit_s}s", script)
    with tempfile.TemporaryFile() as out:
        process = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + limit_s + 30
            while process.poll() is None:
                if done.exists():
                    process.send_signal(signal.SIGINT)
                    process.wait(timeout=30)
                elif time.monotonic() > deadline:
                    raise SystemExit(f"wrk did not stop within {limit_s + 30} s")
                else:
                    time.sleep(0.01)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            finished = done.exists()
            done.unlink(missing_ok=True)
        out.seek(0)
        output = out.read().decode()
    if process.returncode != 0:
        raise SystemExit(f"wrk exited with {process.returncode}:\n{output}")
    if not finished:
        raise SystemExit(f"wrk had fewer than {requests} responses in {limit_s} s:\n{output}")
    return _wrk_result(output)


def scrape(url: str, headers: Mapping[str, str] | None = None) -> dict[str, float]:
    """A Prometheus text page as `name{labels}` -> value (labels as written)."""
    response = httpx.get(url, headers=headers, timeout=10)
    response.raise_for_status()
    samples = {}
    for line in response.text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def metric_sum(samples: Mapping[str, float], name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    wanted = [f'{label}="{value}"' for label, value in labels.items()]
    total = 0.0
    for sample, value in samples.items():
        base = sample.split("{", 1)[0]
        if base == name and all(w in sample for w in wanted):
            total += value
    return total


def metric_delta(
    before: Mapping[str, float], after: Mapping[str, float], name: str, **labels: str
) -> float:
    """How much `name` (summed over the samples matching `labels`) grew between two scrapes."""
    return metric_sum(after, name, **labels) - metric_sum(before, name, **labels)


def upstream_connections(upstream: str) -> int:
    """Connections nginx has accepted since it started (its `stub_status` page)."""
    text = httpx.get(f"{upstream}/nginx_status", timeout=5).text
    # "Active connections: 1 \nserver accepts handled requests\n 5 5 9 \n…"
    return int(text.splitlines()[2].split()[0])


def proxy_default(name: str) -> Any:
    """The default of a `ProxySettings` field: what a proxy started without that setting uses."""
    from proxy.settings import ProxySettings

    for setting in dataclasses.fields(ProxySettings):
        if setting.name == name:
            return setting.default
    raise KeyError(name)


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(math.ceil(pct / 100 * len(ordered)), 1) - 1]


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    print()
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")

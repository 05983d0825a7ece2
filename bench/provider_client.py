"""CPU per provider call of the proxy's own HTTP/1.1 client, direct and through a forward proxy.

Starts nginx (a fixed JSON answer, over http and over TLS with a certificate made here) and,
when installed, squid as the forward proxy; then, in this process on uvloop, makes `--calls`
sequential POSTs per row on kept-alive connections and prints the client's CPU per call (this
process's user + system time: nginx and squid run in processes of their own). Rows are
interleaved `--rounds` times; the table shows the minimum and the median.

    .venv/bin/python bench/provider_client.py
    .venv/bin/python bench/provider_client.py --rows http,https --calls 5000 --rounds 7

Rows: `http` and `https` straight to nginx (the path every call without a proxy takes),
`http-proxy` forwarded by squid (absolute form), `https-proxy` through a CONNECT tunnel of
squid's with TLS to nginx inside. Needs nginx (`apt-get install nginx-light`) and, for the
proxy rows, squid (`apt-get install squid`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import ssl
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import uvloop
from stack import free_port, started

from proxy.providers import HttpClient, Timeouts

NAME = "upstream.bench"
"""The upstream's name: squid resolves it (its hosts file), the certificate names it."""
ANSWER = (
    '{"id":"chatcmpl-b1","object":"chat.completion","created":1700000000,'
    '"model":"gpt-4o-mini-2024-07-18","choices":[{"index":0,"message":{"role":"assistant",'
    '"content":"A fixed answer."},"finish_reason":"stop"}],'
    '"usage":{"prompt_tokens":25,"completion_tokens":4,"total_tokens":29}}'
)
BODY = b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hello"}]}'
HEADERS = {"Authorization": "Bearer sk-bench", "Content-Type": "application/json"}
ROWS = ("http", "https", "http-proxy", "https-proxy")


def certificate(work: Path) -> tuple[Path, Path]:
    """A self-signed certificate for NAME and localhost (its own CA)."""
    cert, key = work / "upstream.crt", work / "upstream.key"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-nodes", "-days", "2", "-subj", f"/CN={NAME}"),
            *("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"),
            *("-keyout", str(key), "-out", str(cert)),
            *("-addext", f"subjectAltName=DNS:{NAME},DNS:localhost"),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return cert, key


@contextmanager
def nginx(work: Path, cert: Path, key: Path) -> Iterator[tuple[int, int]]:
    plain, tls = free_port(), free_port()
    (work / "tmp").mkdir(mode=0o777, exist_ok=True)
    conf = f"""
worker_processes 1;
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    client_body_temp_path {work}/tmp;
    proxy_temp_path {work}/tmp;
    fastcgi_temp_path {work}/tmp;
    uwsgi_temp_path {work}/tmp;
    scgi_temp_path {work}/tmp;
    server {{
        listen 127.0.0.1:{plain};
        listen 127.0.0.1:{tls} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        location / {{ default_type application/json; return 200 '{ANSWER}'; }}
    }}
}}
"""
    (work / "nginx.conf").write_text(conf)
    args = ["nginx", "-p", str(work), "-e", str(work / "nginx-error.log")]
    with started([*args, "-c", str(work / "nginx.conf")], dict(os.environ), work / "nginx.log"):
        _wait_port(plain)
        _wait_port(tls)
        yield plain, tls


@contextmanager
def squid(work: Path) -> Iterator[int]:
    port = free_port()
    (work / "hosts").write_text(f"127.0.0.1 {NAME}\n")
    (work / "squid.conf").write_text(
        "\n".join(
            [
                f"http_port 127.0.0.1:{port}",
                f"pid_filename {work}/squid.pid",
                f"cache_log {work}/squid-cache.log",
                "access_log none",
                f"coredump_dir {work}",
                "cache deny all",
                f"hosts_file {work}/hosts",
                "dns_nameservers 127.0.0.1",
                "pinger_enable off",
                "shutdown_lifetime 0 seconds",
                "acl loopback src 127.0.0.1",
                "http_access allow loopback",
                "http_access deny all",
                "",
            ]
        )
    )
    args = ["squid", "-N", "-f", str(work / "squid.conf")]
    with started(args, dict(os.environ), work / "squid.log"):
        _wait_port(port)
        yield port


def _wait_port(port: int) -> None:
    import socket

    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise SystemExit(f"nothing listens on 127.0.0.1:{port}")


def client(env: dict[str, str]) -> HttpClient:
    timeouts = Timeouts(connect_s=10, read_s=60, total_s=120)
    if not any(name.endswith("_PROXY") for name in env):
        # Built as before there was an egress, so that the direct rows run on older code too.
        bundle = env.get("VKGATE_PROVIDER_CA_BUNDLE")
        tls = ssl.create_default_context(cafile=bundle) if bundle else None
        return HttpClient(timeouts, user_agent="vkgate/bench", tls=tls)
    from proxy.egress import egress_from_env

    egress = egress_from_env(env)
    return HttpClient(timeouts, user_agent="vkgate/bench", tls=egress.provider_tls(), egress=egress)


async def measure(http: HttpClient, url: str, calls: int) -> float:
    """µs of this process's CPU per call, after a warm-up that opens the connection."""
    for _ in range(50):
        await (await http.post(url, BODY, HEADERS)).read()
    started_at = time.process_time()
    for _ in range(calls):
        reply = await http.post(url, BODY, HEADERS)
        await reply.read()
    return (time.process_time() - started_at) / calls * 1e6


async def run(rows: list[str], calls: int, rounds: int, ports: dict[str, int], cert: Path) -> None:
    bundle = {"VKGATE_PROVIDER_CA_BUNDLE": str(cert)}
    proxy = f"http://127.0.0.1:{ports.get('squid', 0)}"
    setups = {
        "http": ({}, f"http://127.0.0.1:{ports['http']}/v1/chat/completions"),
        "https": (bundle, f"https://localhost:{ports['https']}/v1/chat/completions"),
        "http-proxy": ({"HTTP_PROXY": proxy}, f"http://{NAME}:{ports['http']}/v1/chat/completions"),
        "https-proxy": (
            {**bundle, "HTTPS_PROXY": proxy},
            f"https://{NAME}:{ports['https']}/v1/chat/completions",
        ),
    }
    clients = {row: client(setups[row][0]) for row in rows}
    results: dict[str, list[float]] = {row: [] for row in rows}
    try:
        for _ in range(rounds):
            for row in rows:
                results[row].append(await measure(clients[row], setups[row][1], calls))
    finally:
        for http in clients.values():
            await http.close()
    print(f"\n{calls} sequential calls per row and round, {rounds} rounds interleaved")
    print(f"{'row':<12} {'µs CPU/call min':>16} {'median':>8} {'max':>8}")
    for row in rows:
        values = results[row]
        print(
            f"{row:<12} {min(values):>16.1f} {statistics.median(values):>8.1f} {max(values):>8.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(ROWS), help="comma list of " + ", ".join(ROWS))
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rows = [row for row in args.rows.split(",") if row]
    unknown = set(rows) - set(ROWS)
    if unknown:
        raise SystemExit(f"unknown rows: {', '.join(sorted(unknown))}")
    if shutil.which("nginx") is None:
        raise SystemExit("nginx is needed: apt-get install nginx-light")
    proxied = any(row.endswith("-proxy") for row in rows)
    if proxied and shutil.which("squid") is None:
        raise SystemExit("squid is needed for the proxy rows: apt-get install squid")
    work = Path(tempfile.mkdtemp(prefix="vkgate-bench-client-"))
    work.chmod(0o777)  # squid, started as root, runs as its own user
    try:
        with ExitStack() as stack:
            cert, key = certificate(work)
            plain, tls = stack.enter_context(nginx(work, cert, key))
            ports = {"http": plain, "https": tls}
            if proxied:
                ports["squid"] = stack.enter_context(squid(work))
            uvloop.run(run(rows, args.calls, args.rounds, ports, cert))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

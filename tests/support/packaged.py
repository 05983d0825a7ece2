"""Servers nobody here wrote, run by a test on loopback: nginx (TLS in front of a fake provider)
and squid (a forward proxy). Each runs in the foreground on free ports, in a directory of its
own, is waited for within a bound, and is stopped by its PID; a test skips, saying why, only
when the binary is not installed (`.ci/run` installs both).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.processes import EXIT_TIMEOUT_S, free_port

START_TIMEOUT_S = 45.0
POLL_S = 0.02


def binary(name: str) -> str:
    """The path of `name` (also looked for in the sbin directories), or the test skips."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin:/sbin")
    if found is None:
        pytest.skip(f"{name} is not installed (apt-get install {_PACKAGES.get(name, name)})")
    return found


_PACKAGES = {"nginx": "nginx-light", "squid": "squid"}


@contextlib.contextmanager
def work_directory(prefix: str) -> Iterator[Path]:
    """A directory the server's own user can use: run as root, nginx's workers and squid drop to
    an unprivileged user, which cannot enter a test's private temporary directory."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def serving(args: Sequence[str], port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run `args` until the test is done; ready once 127.0.0.1:`port` accepts connections."""
    with log.open("wb") as sink:
        process = subprocess.Popen(
            list(args), stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _accepts(port):
            if process.poll() is not None:
                raise AssertionError(
                    f"{args[0]} exited with {process.returncode}:\n{log.read_text(errors='replace')}"
                )
            assert time.monotonic() < deadline, (
                f"{args[0]} did not listen within {START_TIMEOUT_S} s"
            )
            time.sleep(POLL_S)  # another process starting, bounded above
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=EXIT_TIMEOUT_S)


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


# -- nginx ---------------------------------------------------------------------------------------


@dataclass
class Nginx:
    port: int
    """The TLS listener."""
    status_port: int
    """A plain listener with `/nginx_status` only."""
    directory: Path

    def accepted(self) -> int:
        """Connections nginx accepted so far, this count's own included."""
        with socket.create_connection(("127.0.0.1", self.status_port), timeout=5) as sock:
            sock.sendall(b"GET /nginx_status HTTP/1.0\r\nhost: status\r\n\r\n")
            answer = b""
            while data := sock.recv(4096):
                answer += data
        # "Active connections: 1 \nserver accepts handled requests\n 5 5 7 \n..."
        return int(answer.split(b"\r\n\r\n", 1)[1].splitlines()[2].split()[0])


@contextlib.contextmanager
def nginx_tls(
    certificate: Path, key: Path, locations: str, *, server_name: str = "api.provider.test"
) -> Iterator[Nginx]:
    """nginx serving TLS with `certificate` on a free port, its `server` block holding
    `locations` (nginx configuration text)."""
    nginx = binary("nginx")
    with work_directory("vkgate-nginx-") as directory:
        port, status_port = free_port(), free_port()
        for name in ("tmp",):
            (directory / name).mkdir(mode=0o777)
            (directory / name).chmod(0o777)
        body = textwrap.indent(textwrap.dedent(locations).strip(), " " * 12)
        (directory / "nginx.conf").write_text(
            f"""
            worker_processes 1;
            daemon off;
            pid {directory}/nginx.pid;
            error_log {directory}/error.log info;
            events {{ worker_connections 256; }}
            http {{
                access_log off;
                client_body_temp_path {directory}/tmp;
                proxy_temp_path {directory}/tmp;
                fastcgi_temp_path {directory}/tmp;
                uwsgi_temp_path {directory}/tmp;
                scgi_temp_path {directory}/tmp;
                server {{
                    listen 127.0.0.1:{port} ssl;
                    server_name {server_name};
                    ssl_certificate {certificate};
                    ssl_certificate_key {key};
{body}
                }}
                server {{
                    listen 127.0.0.1:{status_port};
                    location = /nginx_status {{ stub_status; }}
                }}
            }}
            """
        )
        args = [nginx, "-p", str(directory), "-e", str(directory / "error.log")]
        args += ["-c", str(directory / "nginx.conf")]
        with serving(args, port, directory / "nginx.log"):
            yield Nginx(port, status_port, directory)


# -- squid ---------------------------------------------------------------------------------------


@dataclass
class Squid:
    port: int
    directory: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def access_log(self) -> list[str]:
        """What squid logged of each request: `METHOD URL STATUS USER` (written as each ends)."""
        path = self.directory / "access.log"
        return path.read_text().splitlines() if path.exists() else []


@contextlib.contextmanager
def squid_proxy(
    hosts: Mapping[str, str], *, users: Mapping[str, str] | None = None, deny: Sequence[str] = ()
) -> Iterator[Squid]:
    """squid as a forward proxy on a free port, resolving `hosts` (name: address) itself (no
    DNS), asking for Basic credentials when `users` (name: password) are given, and refusing
    the domains of `deny` (403)."""
    squid = binary("squid")
    with work_directory("vkgate-squid-") as directory:
        port = free_port()
        (directory / "hosts").write_text(
            "".join(f"{address} {name}\n" for name, address in hosts.items())
        )
        rules = []
        if deny:
            rules += [f"acl denied dstdomain {' '.join(deny)}", "http_access deny denied"]
        if users:
            (directory / "passwd").write_text(
                "".join(f"{user}:{_apr1(password)}\n" for user, password in users.items())
            )
            helper = _squid_helper("basic_ncsa_auth")
            rules += [
                f"auth_param basic program {helper} {directory}/passwd",
                "auth_param basic children 1 startup=1 idle=1",
                "acl authenticated proxy_auth REQUIRED",
                "http_access allow loopback authenticated",
            ]
        else:
            rules.append("http_access allow loopback")
        for name in os.listdir(directory):
            (directory / name).chmod(0o644)
        (directory / "squid.conf").write_text(
            "\n".join(
                [
                    f"http_port 127.0.0.1:{port}",
                    f"pid_filename {directory}/squid.pid",
                    f"cache_log {directory}/cache.log",
                    "logformat plain %rm %ru %>Hs %un",
                    f"access_log stdio:{directory}/access.log plain",
                    f"coredump_dir {directory}",
                    "cache deny all",
                    "cache_mem 8 MB",
                    f"hosts_file {directory}/hosts",
                    # Names outside `hosts` fail at once rather than wait on a resolver.
                    "dns_nameservers 127.0.0.1",
                    "dns_timeout 1 seconds",
                    "pinger_enable off",
                    "shutdown_lifetime 0 seconds",
                    "acl loopback src 127.0.0.1",
                    *rules,
                    "http_access deny all",
                    "",
                ]
            )
        )
        args = [squid, "-N", "-d", "1", "-f", str(directory / "squid.conf")]
        with serving(args, port, directory / "squid.log"):
            yield Squid(port, directory)


def _squid_helper(name: str) -> str:
    for directory in ("/usr/lib/squid", "/usr/lib64/squid", "/usr/libexec/squid"):
        path = Path(directory) / name
        if path.exists():
            return str(path)
    pytest.skip(f"squid's {name} helper is not installed")


def _apr1(password: str) -> str:
    """`password` hashed as basic_ncsa_auth reads it (openssl's apr1, an htpasswd format)."""
    openssl = binary("openssl")
    result = subprocess.run(
        [openssl, "passwd", "-apr1", "-stdin"],
        input=password,
        capture_output=True,
        text=True,
        check=True,
        timeout=EXIT_TIMEOUT_S,
    )
    return result.stdout.strip()

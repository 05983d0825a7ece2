"""How the proxy's outbound calls leave: straight to their host, or through the HTTP proxy that
`HTTPS_PROXY` / `HTTP_PROXY` name for hosts `NO_PROXY` does not pass, trusting the CA bundle
`VKGATE_PROVIDER_CA_BUNDLE` for providers' certificates. Read once at start-up.

Each variable is read in its lowercase and its uppercase form; when both are set the lowercase
one wins, as curl, Python's urllib (so requests) and httpx decide. `ALL_PROXY` is not read: it
usually names a SOCKS proxy, which this client does not speak. A destination on the loopback
interface (`localhost`, 127.0.0.0/8, ::1) is always called directly, as Go's HTTP client does:
a proxy elsewhere would reach its own loopback, never this machine's.
"""

from __future__ import annotations

import base64
import ipaddress
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from vkgate.env import SettingError

if TYPE_CHECKING:
    import httpx

CA_BUNDLE = "VKGATE_PROVIDER_CA_BUNDLE"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_LOOPBACK: tuple[Network, ...] = (
    ipaddress.ip_network("127.0.0.0/8"),
    ipaddress.ip_network("::1/128"),
)


@dataclass(frozen=True, slots=True)
class ProxyServer:
    """An HTTP proxy: where it listens, and the credentials its URL carried."""

    host: str
    port: int
    variable: str
    """The variable that named it, for messages (`https_proxy`, `HTTPS_PROXY`, ...)."""
    authorization: str | None = field(default=None, repr=False)
    """`Basic ...` for `Proxy-Authorization`: kept out of reprs, so out of logs."""

    @property
    def address(self) -> str:
        """host:port, as a message may name it (never the credentials)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """The proxy's URL without its credentials."""
        return f"http://{self.address}"


@dataclass(frozen=True, slots=True)
class NoProxy:
    """The hosts called directly although a proxy is set (`NO_PROXY`)."""

    everything: bool = False
    names: tuple[tuple[str, int | None], ...] = ()
    """Host names, each matching itself and its subdomains, with the port it is limited to."""
    networks: tuple[tuple[Network, int | None], ...] = ()
    """Addresses and CIDR blocks, matching hosts given as IP addresses, with a port or None."""

    def covers(self, host: str, port: int) -> bool:
        if self.everything:
            return True
        host = host.rstrip(".").lower()
        address = _address(host)
        if address is not None:
            return any(
                address in network and (only is None or only == port)
                for network, only in self.networks
            )
        return any(
            (host == name or host.endswith("." + name)) and (only is None or only == port)
            for name, only in self.names
        )


@dataclass(frozen=True, slots=True)
class Egress:
    """Where each outbound call goes, and which certificates a provider's TLS is checked against."""

    http_proxy: ProxyServer | None = None
    https_proxy: ProxyServer | None = None
    no_proxy: NoProxy = NoProxy()
    no_proxy_variable: str = "NO_PROXY"
    ca_bundle: Path | None = None
    """A PEM file that replaces the system's trust store for provider calls."""

    def proxy_for(self, scheme: str, host: str, port: int) -> ProxyServer | None:
        """The proxy a call to scheme://host:port goes through; None: straight there."""
        proxy = self.https_proxy if scheme == "https" else self.http_proxy
        if proxy is None or _loopback(host) or self.no_proxy.covers(host, port):
            return None
        return proxy

    @property
    def configured(self) -> bool:
        """Whether anything is set that changes how calls leave."""
        return bool(self.http_proxy or self.https_proxy or self.ca_bundle)

    def proxy_for_url(self, url: str) -> ProxyServer | None:
        """`proxy_for` an http(s) URL (settings have checked it is one); a URL whose port cannot
        be read goes direct, to fail there with the client's own message."""
        parts = urlsplit(url)
        scheme, host = parts.scheme.lower(), parts.hostname or ""
        try:
            port = parts.port or (443 if scheme == "https" else 80)
        except ValueError:
            return None
        return self.proxy_for(scheme, host, port)

    def httpx_proxy(self, url: str) -> httpx.Proxy | None:
        """`proxy_for_url` as httpx takes it, for the clients that call the control plane: given
        to their transport, so that httpx does not read the variables by its own rules."""
        proxy = self.proxy_for_url(url)
        if proxy is None:
            return None
        import httpx

        auth = {"Proxy-Authorization": proxy.authorization} if proxy.authorization else None
        return httpx.Proxy(proxy.url, headers=auth)

    def provider_tls(self) -> ssl.SSLContext | None:
        """The TLS context for provider calls when a CA bundle is set; None: the system's
        store (loaded by the client on its first https call)."""
        if self.ca_bundle is None:
            return None
        return _bundle_context(self.ca_bundle)

    def describe(self) -> str:
        """For the start-up log: the proxies, the variables that named them, never credentials."""
        parts = []
        for scheme, proxy in (("https", self.https_proxy), ("http", self.http_proxy)):
            if proxy is not None:
                parts.append(f"{scheme} through {proxy.address} ({proxy.variable})")
        if parts:
            no_proxy = self.no_proxy
            entries = len(no_proxy.names) + len(no_proxy.networks)
            listed = f"{entries} entr{'y' if entries == 1 else 'ies'}"
            direct = "every host" if no_proxy.everything else listed
            parts.append(f"{self.no_proxy_variable}: {direct}, and loopback, direct")
        if self.ca_bundle is not None:
            parts.append(f"provider certificates checked against {self.ca_bundle}")
        return "; ".join(parts) or "direct"


def egress_from_env(env: Mapping[str, str]) -> Egress:
    """The egress the environment describes; `SettingError` names a malformed variable."""
    https = _proxy(env, "https_proxy")
    http = _proxy(env, "http_proxy")
    no_proxy, no_proxy_variable = NoProxy(), "NO_PROXY"
    if https is not None or http is not None:
        # Read only when a proxy is set: unused, a list in a form this parser does not know
        # must not stop the proxy from starting.
        found = _pick(env, "no_proxy")
        if found is not None:
            no_proxy_variable, raw = found
            no_proxy = _no_proxy(raw, no_proxy_variable)
    bundle = env.get(CA_BUNDLE) or None
    ca_bundle = None
    if bundle is not None:
        ca_bundle = Path(bundle)
        _bundle_context(ca_bundle)  # refused now, not at the first provider call
    return Egress(http, https, no_proxy, no_proxy_variable, ca_bundle)


def _pick(env: Mapping[str, str], lowercase: str) -> tuple[str, str] | None:
    """(name, value) of the lowercase form when set, else of the uppercase form."""
    for name in (lowercase, lowercase.upper()):
        value = env.get(name, "").strip()
        if value:
            return name, value
    return None


def _proxy(env: Mapping[str, str], lowercase: str) -> ProxyServer | None:
    found = _pick(env, lowercase)
    if found is None:
        return None
    name, raw = found
    # The URL may carry a password: no message below repeats it.
    if "://" not in raw:
        raw = "http://" + raw  # `proxy.corp:3128`, as curl, requests and httpx take it
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError:
        raise SettingError(f"{name} is not a URL (http://[user:password@]host:port)") from None
    scheme = parts.scheme.lower()
    if scheme != "http":
        raise SettingError(
            f"{name} names a {scheme}:// proxy; provider calls go through an http:// proxy only "
            "(an HTTPS request is tunnelled through it with CONNECT, TLS end to end)"
        )
    if not parts.hostname:
        raise SettingError(f"{name} names no host (http://[user:password@]host:port)")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise SettingError(f"{name} must be http://[user:password@]host:port, with no path")
    authorization = None
    if parts.username is not None:
        user, password = unquote(parts.username), unquote(parts.password or "")
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        authorization = f"Basic {token}"
    host = parts.hostname
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            raise SettingError(f"{name} names a host that cannot be encoded") from None
    return ProxyServer(host, port or 80, name, authorization)


def _no_proxy(raw: str, name: str) -> NoProxy:
    names: list[tuple[str, int | None]] = []
    networks: list[tuple[Network, int | None]] = []
    for entry in (part.strip() for part in raw.replace(" ", ",").split(",")):
        if not entry:
            continue
        if entry == "*":
            return NoProxy(everything=True)
        host, port = _split_port(entry, name)
        network = _network(host)
        if network is not None:
            networks.append((network, port))
            continue
        host = host.lower().removeprefix("*").strip(".")
        if not host or not all(part and _label(part) for part in host.split(".")):
            raise SettingError(
                f"{name} holds {entry!r}, which is not a host name, an IP address or a CIDR "
                "block (example: localhost,.corp.example,10.0.0.0/8)"
            )
        names.append((host.encode("idna").decode("ascii") if not host.isascii() else host, port))
    return NoProxy(False, tuple(names), tuple(networks))


def _split_port(entry: str, name: str) -> tuple[str, int | None]:
    """`host:port`, `[v6]:port`, or an entry without a port (a bare IPv6 address included)."""
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        if rest == "":
            return host, None
        if not rest.startswith(":"):
            raise SettingError(f"{name} holds {entry!r}, which is not [IPv6]:port")
        return host, _port(rest[1:], entry, name)
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host, _port(port, entry, name)
    return entry, None


def _port(text: str, entry: str, name: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise SettingError(f"{name} holds {entry!r}, whose port is not 1-65535")
    return int(text)


def _network(host: str) -> Network | None:
    try:
        return ipaddress.ip_network(host, strict=False)
    except ValueError:
        return None


def _label(part: str) -> bool:
    return part.replace("-", "").replace("_", "").isalnum()


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _loopback(host: str) -> bool:
    host = host.rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    address = _address(host)
    return address is not None and any(address in network for network in _LOOPBACK)


def _bundle_context(path: Path) -> ssl.SSLContext:
    if not path.is_file():
        raise SettingError(
            f"{CA_BUNDLE} must name a PEM file of CA certificates; {path} is not a file"
        )
    try:
        context = ssl.create_default_context(cafile=str(path))
    except ssl.SSLError as exc:
        raise SettingError(
            f"{CA_BUNDLE}: {path} holds no PEM CA certificate that can be read ({exc.reason or exc})"
        ) from None
    except OSError as exc:
        raise SettingError(f"{CA_BUNDLE}: cannot read {path}: {exc.strerror or exc}") from None
    return context

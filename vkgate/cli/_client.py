"""The CLI's client of the admin API: where to find it, how to authenticate, errors as messages."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import click
import httpx

from vkgate import env as E

SECRETS_FILE = "secrets.env"


def default_url(env: Mapping[str, str]) -> str:
    url = E.string(env, "VKGATE_CONTROLPLANE_URL")
    if url:
        return url.rstrip("/")
    host, port = E.address(env, "VKGATE_CONTROLPLANE_ADDR", "127.0.0.1:5560")
    host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host  # noqa: S104 - a bind-all address is not one to call
    return f"http://{host}:{port}"


def default_token(env: Mapping[str, str]) -> str | None:
    """VKGATE_ADMIN_TOKEN, else the one `vkgate up` wrote under VKGATE_HOME."""
    return E.string(env, "VKGATE_ADMIN_TOKEN") or E.load_secrets_file(
        E.home(env) / SECRETS_FILE
    ).get("VKGATE_ADMIN_TOKEN")


class AdminClient:
    def __init__(self, url: str, token: str | None, *, timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url
        # A control plane on this machine is called directly: a proxy from HTTP_PROXY would
        # reach its own loopback, never this one (the proxy's egress rule, too).
        self._http = httpx.Client(
            base_url=url, headers=headers, timeout=timeout, trust_env=not _on_loopback(url)
        )

    def close(self) -> None:
        self._http.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
    ) -> Any:
        query = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            response = self._http.request(method, path, json=json, params=query)
        except httpx.TransportError as exc:
            raise click.ClickException(
                f"cannot reach the control plane at {self.url} ({type(exc).__name__}); "
                "is it running? (vkgate up, or set VKGATE_CONTROLPLANE_URL)"
            ) from None
        if response.status_code >= 400:
            raise click.ClickException(_describe(response))
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, json=body)

    def patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, json=body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def list_all(self, path: str, **params: Any) -> Iterator[dict[str, Any]]:
        """Every row of a paginated list, following `next_cursor`."""
        cursor = None
        while True:
            page = self.get(path, cursor=cursor, limit=500, **params)
            yield from page["data"]
            cursor = page.get("next_cursor")
            if not cursor:
                return


def _on_loopback(url: str) -> bool:
    host = (urlsplit(url).hostname or "").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _describe(response: httpx.Response) -> str:
    try:
        error = response.json()["error"]
        where = f" (field: {error['param']})" if error.get("param") else ""
        return f"{response.status_code} {error['code']}: {error['message']}{where}"
    except (ValueError, KeyError, TypeError):
        return f"{response.status_code}: {response.text[:500]}"

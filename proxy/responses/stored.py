"""Responses a provider stores: `GET`, `DELETE`, `input_items` and `cancel`, on any replica.

The id in the path is opened (`proxy.responses.ids`): it names the credential that made the
response and its organization, so the call goes to that credential with nothing looked up but
the key's own bundle. An id that does not open, or opens to another organization, is OpenAI's
404; so is one whose credential the key can no longer use. An id of a translated response says
it was not stored. These calls are not priced: they leave no spend records, but count against
the key's rate limits like any request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl

import msgspec

from proxy.asgi import JSON, Head, Send, respond
from proxy.errors import ProxyError, invalid
from proxy.providers import ProviderTimeout, ProviderUnreachable, Upstream
from proxy.providers.base import StoresResponses
from proxy.responses.exchange import NOT_STORED, native, not_found, opened
from proxy.responses.ids import ResponseIds, Sealed
from proxy.runtime import KeyRuntime
from vkgate.errors import ErrorCode

PREFIX = "/responses/"
_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True, slots=True)
class Call:
    """A stored-response route, as its path says."""

    label: str
    """The route as metrics and logs name it (never the id itself: unbounded)."""
    method: str
    """The method it takes."""
    response_id: str
    suffix: str
    """What follows the id: "", "/input_items" or "/cancel"."""


_SUFFIXES = {
    "": ("/v1/responses/{id}", ("GET", "DELETE")),
    "/input_items": ("/v1/responses/{id}/input_items", ("GET",)),
    "/cancel": ("/v1/responses/{id}/cancel", ("POST",)),
}


def route(path: str, method: str) -> Call | None:
    """The stored-response call `path` (under `/v1`, no trailing slash) names, or None."""
    if not path.startswith(PREFIX):
        return None
    response_id, slash, rest = path[len(PREFIX) :].partition("/")
    suffix = slash + rest
    known = _SUFFIXES.get(suffix)
    if not response_id or known is None:
        return None
    label, methods = known
    return Call(label, method if method in methods else ", ".join(methods), response_id, suffix)


def allowed(call: Call, method: str) -> None:
    """405, saying which methods the route takes, for any other."""
    if call.method != method:
        raise ProxyError(
            ErrorCode.METHOD_NOT_ALLOWED,
            f"this route takes {call.method}, not {method}",
            headers=((b"allow", call.method.encode()),),
        )


class _Ids(msgspec.Struct):
    id: str | None = None
    previous_response_id: str | None = None


_ids = msgspec.json.Decoder(_Ids)


class StoredResponses:
    """Serves the stored-response routes for the gateway, with the process's id sealer."""

    def __init__(self, ids: ResponseIds) -> None:
        self._ids = ids

    async def serve(
        self,
        call: Call,
        query: str,
        runtime: KeyRuntime,
        head: Head,
        send: Send,
        extra: tuple[tuple[bytes, bytes], ...] = (),
    ) -> int:
        """Answer `call` from the credential that stored the response; its status."""
        if call.suffix == "" and call.method == "GET" and _streams(query):
            raise invalid(
                "`stream` cannot be asked here: only a background response streams again, and "
                "the gateway creates none",
                param="stream",
            )
        sealed = opened(self._ids, call.response_id, runtime.organization_id, "response_id")
        if not sealed.stored:
            raise ProxyError(
                ErrorCode.NOT_FOUND,
                f"Response '{call.response_id[:200]}' was not stored: {NOT_STORED}.",
                param="response_id",
            )
        upstream = _credential(runtime, sealed)
        if upstream is None:
            raise not_found(call.response_id, "response_id")
        adapter = upstream.adapter
        assert isinstance(adapter, StoresResponses)  # `_credential` picks only such adapters
        headers = {**upstream.headers, "X-Request-ID": head.request_id.decode()}
        if head.traceparent is not None:
            headers["traceparent"] = head.traceparent.decode()
        try:
            reply = await adapter.stored(
                upstream, call.method, "/" + sealed.upstream_id + call.suffix, query, headers
            )
            try:
                data = await reply.read()
            finally:
                reply.close()
        except ProviderTimeout:
            raise ProxyError(
                ErrorCode.PROVIDER_TIMEOUT,
                f"provider {upstream.provider_name} did not answer in time",
            ) from None
        except ProviderUnreachable:
            raise ProxyError(
                ErrorCode.PROVIDER_ERROR, f"provider {upstream.provider_name} could not be reached"
            ) from None
        if reply.status < 300:
            data = self._sealed(data, sealed, call.response_id)
        else:
            # The provider's message may name the id it was given: the client's, not its own.
            data = data.replace(sealed.upstream_id.encode(), call.response_id.encode())
        answer = [
            (b"content-type", reply.content_type or JSON),
            (b"x-request-id", head.request_id),
            (b"x-vkgate-provider", upstream.provider_name.encode()),
            *extra,
        ]
        await respond(send, reply.status, data, answer)
        return reply.status

    def _sealed(self, data: bytes, sealed: Sealed, client_id: str) -> bytes:
        """A stored object with the provider's response ids swapped for the client's."""
        try:
            found = _ids.decode(data)
        except msgspec.DecodeError:
            return data
        if found.id == sealed.upstream_id:
            data = data.replace(_encode(sealed.upstream_id), _encode(client_id))
        if found.previous_response_id:
            previous = self._ids.seal(
                sealed.provider_id,
                sealed.organization_id,
                found.previous_response_id,
                stored=True,
            )
            data = data.replace(_encode(found.previous_response_id), _encode(previous))
        return data


def _streams(query: str) -> bool:
    return any(
        name == "stream" and value.lower() not in ("", "false", "0")
        for name, value in parse_qsl(query)
    )


def _credential(runtime: KeyRuntime, sealed: Sealed) -> Upstream | None:
    """The key's compiled credential that stored the response, if the key may still use it."""
    chains: Mapping[str, tuple[Upstream, ...]] = runtime.chains
    for chain in chains.values():
        for upstream in chain:
            if (
                upstream.provider_id == sealed.provider_id
                and native(upstream)
                and isinstance(upstream.adapter, StoresResponses)
            ):
                return upstream
    return None

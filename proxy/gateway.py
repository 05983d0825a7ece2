"""The `/v1` API as one raw ASGI app: the request pipeline, in the contract's order.

Raw ASGI rather than Litestar handlers: measured, a Litestar handler alone costs a third of
what a Python forwarder can do per second (see the contract's "Hot path").
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

from proxy import body as B
from proxy.asgi import (
    JSON,
    ClientGone,
    Head,
    Receive,
    Scope,
    Send,
    read_body,
    respond,
    respond_error,
)
from proxy.auth import AuthCache
from proxy.dispatch import Recheck, forward, forward_stream
from proxy.errors import ProxyError
from proxy.providers import Operation, Upstream
from proxy.runtime import KeyRuntime
from proxy.settings import ProxySettings
from vkgate.errors import ErrorCode
from vkgate.keys import VIRTUAL_KEY_PREFIX

log = logging.getLogger("vkgate.proxy")

Handler = Callable[[KeyRuntime, Head, Receive, Send], Awaitable[None]]


def chain_for(runtime: KeyRuntime, model: str) -> tuple[Upstream, ...]:
    """Policy, then model resolution: the alias must be the key's to use."""
    chain = runtime.chains.get(model)
    if chain is None:
        if model in runtime.not_allowed:
            raise ProxyError(
                ErrorCode.MODEL_NOT_ALLOWED,
                f"this key may not use model {model!r}",
                param="model",
            )
        raise ProxyError(
            ErrorCode.MODEL_NOT_FOUND,
            f"model {model!r} is not available to this key; GET /v1/models lists the ones that are",
            param="model",
        )
    if not chain:
        raise ProxyError(
            ErrorCode.PROVIDER_ERROR,
            f"no provider this proxy can call serves model {model!r}",
            param="model",
        )
    return chain


def _provider_headers(head: Head) -> dict[str, str]:
    headers = {"X-Request-ID": head.request_id.decode()}
    if head.traceparent is not None:
        headers["traceparent"] = head.traceparent.decode()
    return headers


class Gateway:
    """What `/v1` serves, with everything wired once at start-up."""

    def __init__(self, settings: ProxySettings, cache: AuthCache) -> None:
        self._max_body = settings.max_body_bytes
        self._cache = cache
        self._routes: dict[str, tuple[str, Handler]] = {
            "/chat/completions": ("POST", self._chat),
            "/embeddings": ("POST", self._embeddings),
            "/models": ("GET", self._models),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        head = Head(scope)
        try:
            route = self._routes.get(scope["path"].rstrip("/"))
            if route is None:
                raise ProxyError(ErrorCode.NOT_FOUND, f"no route /v1{scope['path'].rstrip('/')}")
            method, handler = route
            if scope["method"] != method:
                raise ProxyError(
                    ErrorCode.METHOD_NOT_ALLOWED,
                    f"this route takes {method}, not {scope['method']}",
                    # RFC 9110: a 405 says which method the route does take.
                    headers=((b"allow", method.encode()),),
                )
            if head.key is None:
                raise ProxyError(
                    ErrorCode.INVALID_API_KEY,
                    "no virtual key: send it as `Authorization: Bearer vk-…` or `x-api-key`",
                )
            if not head.key.startswith(VIRTUAL_KEY_PREFIX):
                # Refused here: a stray bearer token costs no control-plane round trip.
                raise ProxyError(ErrorCode.INVALID_API_KEY, "invalid virtual key")
            runtime = await self._cache.authenticate(head.key)
            await handler(runtime, head, receive, send)
        except ProxyError as exc:
            await respond_error(send, exc, head.request_id)
        except ClientGone:
            return
        except Exception:
            # A bug, not a refusal: logged (never the body), and answered in OpenAI's shape.
            log.exception("unexpected error serving /v1%s", scope["path"].rstrip("/"))
            error = ProxyError(ErrorCode.INTERNAL_ERROR, "internal error in the gateway")
            # If the answer had already started, a second start is refused: nothing more to say.
            with contextlib.suppress(Exception):
                await respond_error(send, error, head.request_id)

    async def _chat(self, runtime: KeyRuntime, head: Head, receive: Receive, send: Send) -> None:
        body = await read_body(receive, self._max_body, head.content_length)
        fields = B.chat_fields(body)
        chain = chain_for(runtime, fields.model)
        requested = fields.model
        if not fields.stream:

            def plain(upstream: Upstream) -> bytes:
                return B.patch_model(body, requested, upstream.model_json)

            await forward(
                chain,
                Operation.CHAT,
                plain,
                _provider_headers(head),
                send,
                head.request_id,
                self._recheck(head, runtime, fields.model),
            )
            return
        options = fields.stream_options
        client_wants_usage = isinstance(options, B.StreamOptions) and bool(options.include_usage)
        with_usage = body if client_wants_usage else B.ask_for_usage(body, fields)

        def streamed(upstream: Upstream) -> bytes:
            source = with_usage if upstream.stream_usage else body
            return B.patch_model(source, requested, upstream.model_json)

        def strip_usage(upstream: Upstream) -> bool:
            return upstream.stream_usage and not client_wants_usage

        await forward_stream(
            chain,
            streamed,
            _provider_headers(head),
            strip_usage,
            receive,
            send,
            head.request_id,
            self._recheck(head, runtime, fields.model),
        )

    async def _embeddings(
        self, runtime: KeyRuntime, head: Head, receive: Receive, send: Send
    ) -> None:
        body = await read_body(receive, self._max_body, head.content_length)
        fields = B.embedding_fields(body)
        chain = chain_for(runtime, fields.model)

        def patched(upstream: Upstream) -> bytes:
            return B.patch_model(body, fields.model, upstream.model_json)

        await forward(
            chain,
            Operation.EMBEDDINGS,
            patched,
            _provider_headers(head),
            send,
            head.request_id,
            self._recheck(head, runtime, fields.model),
        )

    def _recheck(self, head: Head, runtime: KeyRuntime, model: str) -> Recheck:
        """Before a further paid attempt, whether the key may still be used for `model`.

        A cache hit costs no network call; a key the change feed evicted meanwhile (revoked or
        disabled) is resolved again, and its refusal ends the walk. When the key's revision
        changed, the model must still be one it may use.
        """
        key = head.key
        assert key is not None  # authenticated before any handler runs

        async def recheck() -> None:
            current = await self._cache.authenticate(key)
            if current.revision != runtime.revision:
                chain_for(current, model)

        return recheck

    async def _models(self, runtime: KeyRuntime, head: Head, receive: Receive, send: Send) -> None:
        await respond(
            send,
            200,
            runtime.models_body,
            [(b"content-type", JSON), (b"x-request-id", head.request_id)],
        )

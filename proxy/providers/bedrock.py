"""`bedrock`: Amazon Bedrock's runtime API, every request signed with SigV4.

Chat and messages go to Converse and ConverseStream, embeddings to InvokeModel, at
`https://bedrock-runtime.<region>.amazonaws.com` (or the credential's `base_url`, boto3's
`endpoint_url`). The model id goes in the path, URL-encoded whole: a foundation model id
(`anthropic.claude-…-v1:0`), an inference profile id (`us.anthropic.…`) or an ARN, whose `:` and
`/` are encoded too, as AWS's SDKs send them.

Bedrock's errors are told apart by their type (the `x-amzn-ErrorType` header, else the body's
`code` or `__type`, as botocore reads them), not by their status alone: a quota exceeded comes
as a 400, as a validation error does. Each type is given the status the chain's walk needs:
throttling, an exceeded quota and a model not ready yet are a 429, which falls through to the
next credential; an access denied (or a credential AWS does not recognise) a 403, which falls
through too, another credential may hold the access this one lacks; a model that timed out a
504 and a model that failed a 502, both falling through as a service error (500, 503) does; a
validation error (400) or an unknown model (404) is the answer, passed back in the client's
format. A type this table does not know keeps its status. A ConverseStream that opens with an
exception (a throttling, say) instead of its first event is turned into the error it stands
for before anything is committed.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Mapping
from urllib.parse import quote, urlsplit

import msgspec
from cachetools import LRUCache

from proxy.providers._aws import Keys, SigV4Signer, credentials_of
from proxy.providers._client import HttpClient
from proxy.providers._connection import Response
from proxy.providers._refresh import Refreshing
from proxy.providers.base import (
    Operation,
    ProviderMisconfigured,
    Reply,
    Upstream,
    WireFormat,
)
from proxy.translate._converse import opening
from vkgate.clock import Clock
from vkgate.wire import ChainTarget

DEFAULT_ENDPOINT = "https://bedrock-runtime.{region}.amazonaws.com"
REGION = "region"
PATHS = {
    Operation.CONVERSE: "/converse",
    Operation.CONVERSE_STREAM: "/converse-stream",
    Operation.INVOKE: "/invoke",
}
RESTATED = {408: 504, 424: 502}
"""Bedrock's statuses that stand for a provider failure, not the client's: ModelTimeout and
ModelError (for an error whose type is not told)."""
ERROR_STATUS = {
    "ThrottlingException": 429,
    "ServiceQuotaExceededException": 429,
    "ModelNotReadyException": 429,
    "ValidationException": 400,
    "AccessDeniedException": 403,
    "UnrecognizedClientException": 403,
    "InvalidSignatureException": 403,
    "ExpiredTokenException": 403,
    "ResourceNotFoundException": 404,
    "ModelTimeoutException": 504,
    "ModelErrorException": 502,
    "ModelStreamErrorException": 502,
    "InternalServerException": 500,
    "ServiceUnavailableException": 503,
}
"""The status each of Bedrock's error types is given (see the module's docstring)."""
_JSON = b"application/json"
_CACHED_CREDENTIALS = 1024
_encode = msgspec.json.Encoder().encode


def host_of(base: str) -> str:
    """The `host` header a request to `base` carries (and SigV4 signs): the host, with the port
    when it is not the scheme's default."""
    parts = urlsplit(base)
    host = (parts.hostname or "").encode("idna").decode("ascii")
    named = f"[{host}]" if ":" in host else host
    default = 443 if parts.scheme == "https" else 80
    return named if parts.port in (None, default) else f"{named}:{parts.port}"


class Bedrock:
    """The adapter for Bedrock, sharing the process's one pooled client."""

    kind = "bedrock"

    def __init__(self, client: HttpClient, clock: Clock) -> None:
        self._client = client
        self._clock = clock
        self._credentials: LRUCache[tuple[str, ...], Refreshing[Keys]] = LRUCache(
            _CACHED_CREDENTIALS
        )
        """Kept across compilations (a policy edit compiles every chain anew): temporary
        credentials are not fetched again, and the workload's chain is resolved once per
        region for the whole process."""

    def compile(self, target: ChainTarget) -> Upstream:
        region = target.settings.get(REGION)
        if not region:
            raise ProviderMisconfigured(
                f"provider {target.provider_id} of kind bedrock has no region"
            )
        base = (target.base_url or DEFAULT_ENDPOINT.format(region=region)).rstrip("/")
        model = base + "/model/" + quote(target.model, safe="")
        headers = {
            **{name.lower(): value for name, value in target.headers.items()},
            "content-type": "application/json",
            "host": host_of(base),
        }
        return Upstream(
            provider_id=target.provider_id,
            provider_name=target.provider_name,
            kind=target.kind,
            model=target.model,
            model_json=msgspec.json.encode(target.model),
            adapter=self,
            wire=WireFormat.CONVERSE,
            urls={operation: model + path for operation, path in PATHS.items()},
            headers=headers,
            stream_usage=False,
            price=target.price,
            signer=SigV4Signer(self._credentials_for(target, region), region),
        )

    def _credentials_for(self, target: ChainTarget, region: str) -> Refreshing[Keys]:
        stored = target.credentials
        if stored:
            material = _encode(sorted(stored.items()))
            key: tuple[str, ...] = (target.provider_id, hashlib.sha256(material).hexdigest())
        else:
            key = ("workload", region)
        credentials = self._credentials.get(key)
        if credentials is None:
            credentials = self._credentials[key] = credentials_of(
                stored, region, self._clock, target.provider_id
            )
        return credentials

    async def send(
        self, upstream: Upstream, operation: Operation, body: bytes, headers: Mapping[str, str]
    ) -> Reply:
        url = upstream.urls[operation]
        signed = dict(headers)
        if upstream.signer is not None:
            await upstream.signer.sign(url, body, signed)
        reply = await self._client.post(url, body, signed)
        if reply.status >= 400:
            return await _refused(reply)
        if reply.status == 200 and operation is Operation.CONVERSE_STREAM:
            return await _opened(reply)
        if operation is Operation.INVOKE and reply.input_token_count is not None:
            return await _counted(reply, reply.input_token_count)
        return reply


class _ErrorFields(msgspec.Struct):
    code: str | None = None
    Code: str | None = None
    type_: str | None = msgspec.field(default=None, name="__type")


_error_fields = msgspec.json.Decoder(_ErrorFields)


def error_type(header: bytes | None, body: bytes) -> str:
    """The type of a Bedrock error: its `x-amzn-ErrorType` header, else its body's `code` or
    `__type`, without the namespace or the URL either may carry; "" when none says."""
    if header:
        named = header.decode("latin-1")
    else:
        try:
            fields = _error_fields.decode(body)
        except msgspec.DecodeError:
            return ""
        named = fields.code or fields.Code or fields.type_ or ""
    return named.split(":", 1)[0].rsplit("#", 1)[-1].strip()


TOKEN_COUNT_FIELD = b"vkgateInputTokenCount"
"""Where an InvokeModel answer's header token count is written into its body for the usage
reader (`proxy.translate.openai_embeddings`); the body is always translated, so no client sees
it."""


async def _counted(reply: Response, count: bytes) -> Reply:
    """An InvokeModel answer with the input token count of its header written into its body
    (Cohere's embeddings say it nowhere else)."""
    try:
        data = await reply.read()
    finally:
        reply.close()
    stripped = data.lstrip()
    if count.strip().isdigit() and stripped.startswith(b"{"):
        head = b'{"' + TOKEN_COUNT_FIELD + b'":' + str(int(count)).encode()
        rest = stripped[1:].lstrip()
        data = head + (b"" if rest.startswith(b"}") else b",") + rest
    return _Whole(reply.status, data, reply.retry_after)


async def _refused(reply: Response) -> Reply:
    """A Bedrock error, read whole (errors are small), with the status its type stands for."""
    try:
        data = await reply.read()
    finally:
        reply.close()
    status = reply.status
    status = ERROR_STATUS.get(error_type(reply.error_type, data), RESTATED.get(status, status))
    return _Whole(status, data, reply.retry_after)


async def _opened(reply: Reply) -> Reply:
    """A ConverseStream whose first frame was read: the stream itself when it is an event, or
    the error its exception stands for (a throttling is a 429 the chain falls through)."""
    chunks = reply.chunks()
    head = b""
    try:
        async for chunk in chunks:
            head += chunk
            first = opening(head)
            if first is None:
                continue
            if first.status == 200:
                return _Resumed(reply, head, chunks)
            reply.close()
            return _Whole(first.status, _encode({"message": first.message}), None)
    except BaseException:
        reply.close()  # timed out, cut, or the client left: the connection is not reused
        raise
    return _Resumed(reply, head, chunks)


class _Resumed:
    """A stream whose opening bytes were read: they come first, then the rest."""

    __slots__ = ("_head", "_reply", "_rest", "content_type", "retry_after", "status")

    def __init__(self, reply: Reply, head: bytes, rest: AsyncIterator[bytes]) -> None:
        self._reply = reply
        self._head = head
        self._rest = rest
        self.status = reply.status
        self.content_type = reply.content_type
        self.retry_after = reply.retry_after

    async def read(self) -> bytes:
        return self._head + b"".join([chunk async for chunk in self._rest])

    async def chunks(self) -> AsyncIterator[bytes]:
        if self._head:
            yield self._head
        async for chunk in self._rest:
            yield chunk

    @property
    def drained(self) -> bool:
        return self._reply.drained

    def close(self) -> None:
        self._reply.close()


class _Whole:
    """An answer read whole: an error the provider gave (inside its stream, or as its answer)
    with the status the chain's walk needs, or an answer with its header's usage written in."""

    __slots__ = ("_body", "retry_after", "status")
    content_type = _JSON

    def __init__(self, status: int, body: bytes, retry_after: bytes | None) -> None:
        self.status = status
        self._body = body
        self.retry_after = retry_after

    async def read(self) -> bytes:
        return self._body

    async def chunks(self) -> AsyncIterator[bytes]:
        yield self._body

    drained = True

    def close(self) -> None:
        pass

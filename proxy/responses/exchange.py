"""`POST /v1/responses`: one request, ready for any credential of its chain.

A provider that serves the Responses API gets the client's bytes with `model` patched (and
`previous_response_id` turned back into its own id); its answer comes back as it sent it, but
for its response id, which is swapped for the sealed id the client keeps (`proxy.responses.
ids`), in the plain answer and in every event of a stream. Any other provider is translated
for, by its wire format (`proxy.responses.translated`: chat completions, Anthropic's Messages
API, Bedrock's Converse API, Google's Gemini API), and its answer gets a sealed id marked not
stored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import msgspec

from proxy import body as B
from proxy import usage as U
from proxy.errors import ProxyError, invalid
from proxy.providers import Operation, Upstream
from proxy.providers.base import WireFormat
from proxy.responses.ids import ResponseIds, Sealed
from proxy.responses.passthrough import PassThrough
from proxy.responses.translated import TRANSLATIONS, Pipe
from proxy.translate._responses_answer import (
    Frame,
    error_event,
)
from proxy.translate._responses_request import (
    Parsed,
    no_previous_response,
    parse,
)
from proxy.usage import TokenUsage
from vkgate.errors import ErrorCode

_encode = msgspec.json.Encoder().encode


def native(upstream: Upstream) -> bool:
    """Whether the credential's provider serves the Responses API itself."""
    return Operation.RESPONSES in upstream.urls


class ResponsesExchange:
    """One `POST /v1/responses`; its answers carry ids sealed for the credential that made them."""

    __slots__ = (
        "_body",
        "_created",
        "_facts",
        "_ids",
        "_organization_id",
        "_parsed",
        "_previous",
        "_previous_id",
        "_requested",
        "_stored",
        "_translated",
        "stream",
    )
    client = WireFormat.RESPONSES
    estimates_output = True
    same_format_headers: Mapping[str, str] = {}

    def __init__(
        self,
        body: bytes,
        requested: str,
        *,
        stream: bool,
        stored: bool,
        ids: ResponseIds,
        organization_id: str,
        created: int,
        previous: Sealed | None = None,
        previous_id: str | None = None,
    ) -> None:
        self.stream = stream
        self._body = body
        self._requested = requested
        self._stored = stored
        """Whether a provider with the API keeps the response (`store` is not false)."""
        self._ids = ids
        self._organization_id = organization_id
        self._created = created
        self._previous = previous
        """What `previous_response_id` says, opened; None when the request has none."""
        self._previous_id = previous_id
        """`previous_response_id` as the client sent it."""
        self._parsed: dict[str, Parsed] = {}
        self._translated: dict[tuple[object, ...], bytes] = {}
        self._facts: tuple[bytes, U.ResponseFacts] | None = None
        """The last answer read by `usage_of`, with what it said: `render` reads it again."""

    def operation(self, upstream: Upstream) -> Operation:
        if native(upstream):
            return Operation.RESPONSES
        translation = TRANSLATIONS[upstream.wire]
        return translation.streamed if self.stream else translation.plain

    def body_for(self, upstream: Upstream) -> bytes:
        if native(upstream):
            if self._previous is None:
                return B.patch_model(self._body, self._requested, upstream.model_json)
            return B.patch_fields(
                self._body, model=upstream.model, previous_response_id=self._previous.upstream_id
            )
        if self._previous_id is not None:
            raise no_previous_response()
        key = (upstream.wire, upstream.model_json, upstream.kind, upstream.stream_usage)
        translated = self._translated.get(key)
        if translated is None:
            translation = TRANSLATIONS[upstream.wire]
            try:
                translated = translation.request(self._parse(translation.target), upstream)
            except RecursionError:
                raise invalid(B.TOO_DEEP) from None
            self._translated[key] = translated
        return translated

    def _parse(self, target: str) -> Parsed:
        parsed = self._parsed.get(target)
        if parsed is None:
            parsed = self._parsed[target] = parse(self._body, target)
        return parsed

    def _sealer(self, upstream: Upstream, stored: bool) -> Callable[[str], str]:
        ids, provider, organization = self._ids, upstream.provider_id, self._organization_id

        def seal(upstream_id: str) -> str:
            return ids.seal(provider, organization, upstream_id, stored=stored)

        return seal

    def _frame(self, upstream: Upstream) -> Frame:
        return Frame.of(self._body, self._sealer(upstream, False), self._created)

    def usage_of(
        self, upstream: Upstream, status: int, data: bytes
    ) -> tuple[TokenUsage | None, str | None]:
        if status >= 300:
            return None, None
        if native(upstream):
            facts = U.response_facts(data)
            self._facts = (data, facts)
            return (U.from_responses(facts.usage) if facts.usage else None), facts.model
        return TRANSLATIONS[upstream.wire].usage(data)

    def render(self, upstream: Upstream, status: int, data: bytes) -> bytes:
        if native(upstream):
            if status >= 300:
                # The provider's message may name the id it was given: the client's, not its own.
                previous = self._previous
                if previous is not None and self._previous_id is not None:
                    data = data.replace(previous.upstream_id.encode(), self._previous_id.encode())
                return data
            return self._sealed(upstream, data)
        translation = TRANSLATIONS[upstream.wire]
        if status >= 300:
            return translation.error(status, data)
        return translation.response(data, self._frame(upstream), upstream)

    def _sealed(self, upstream: Upstream, data: bytes) -> bytes:
        """The provider's answer with its response ids swapped for the client's.

        The response's own id is the first place its string appears (OpenAI writes `id`
        first; any other place would be a later one): found, not replaced throughout, so the
        search stops there and the body is copied once.
        """
        read = self._facts
        facts = read[1] if read is not None and read[0] is data else U.response_facts(data)
        if facts.id:
            old = _encode(facts.id)
            at = data.find(old)
            if at >= 0:
                sealed = self._ids.seal(
                    upstream.provider_id, self._organization_id, facts.id, stored=self._stored
                )
                view = memoryview(data)
                data = b"".join((view[:at], _encode(sealed), view[at + len(old) :]))
        previous, previous_id = self._previous, self._previous_id
        if previous is not None and previous_id is not None:
            data = data.replace(_encode(previous.upstream_id), _encode(previous_id))
        return data

    def _swaps(self, upstream: Upstream, upstream_id: str | None) -> list[tuple[bytes, bytes]]:
        swaps = []
        if upstream_id:
            sealed = self._ids.seal(
                upstream.provider_id, self._organization_id, upstream_id, stored=self._stored
            )
            swaps.append((_encode(upstream_id), _encode(sealed)))
        if self._previous is not None and self._previous_id is not None:
            swaps.append((_encode(self._previous.upstream_id), _encode(self._previous_id)))
        return swaps

    def pipe(self, upstream: Upstream) -> Pipe:
        if native(upstream):
            return PassThrough(lambda found: self._swaps(upstream, found))
        return TRANSLATIONS[upstream.wire].stream(self._frame(upstream), upstream)


def stream_error(pipe: object, error: ProxyError) -> bytes:
    """The `error` event that ends a Responses stream which broke off after it began, numbered
    after the last event the client got."""
    sequence = getattr(pipe, "sequence", 0)
    return error_event(error, sequence if isinstance(sequence, int) else 0)


def not_found(client_id: str, param: str | None = None) -> ProxyError:
    """OpenAI's 404 for a response this key cannot reach (another organization's, or an id this
    gateway did not seal): the two are told apart by no one."""
    return ProxyError(
        ErrorCode.NOT_FOUND,
        f"No response found with id '{client_id[:200]}'.",
        param=param,
    )


def opened(ids: ResponseIds, client_id: str, organization_id: str, param: str) -> Sealed:
    """What `client_id` says, when it is this organization's; else OpenAI's 404."""
    sealed = ids.open(client_id)
    if sealed is None or sealed.organization_id != organization_id:
        raise not_found(client_id, param)
    return sealed


NOT_STORED = (
    "it was made with `store: false`, or by a provider without the Responses API, which the "
    "gateway translates for and which keeps nothing"
)


def opened_previous(ids: ResponseIds, client_id: str, organization_id: str) -> Sealed:
    """What `previous_response_id` says: a stored response of this organization's, or a 404
    (not found) or 400 (not stored)."""
    sealed = opened(ids, client_id, organization_id, "previous_response_id")
    if not sealed.stored:
        raise invalid(
            f"`previous_response_id` names a response that was not stored: {NOT_STORED}; send "
            "the conversation in `input` instead",
            param="previous_response_id",
        )
    return sealed


Chain = tuple[Upstream, ...]


def narrowed(previous: Sealed, model: str) -> Callable[[Chain], Chain]:
    """The chain cut to the credential that stored the previous response: only it has it."""

    def narrow(chain: Chain) -> Chain:
        kept = tuple(upstream for upstream in chain if upstream.provider_id == previous.provider_id)
        if not kept:
            raise invalid(
                "`previous_response_id` names a response stored with a provider that model "
                f"{model!r} does not route to; continue it with a model of that provider",
                param="previous_response_id",
            )
        return kept

    return narrow

"""Bedrock's answers as its runtime sends them: its errors (the type in `x-amzn-ErrorType`, or
`__type` in the body; the exception frames of a ConverseStream), each given the status the
chain's walk needs: throttling, exceeded quotas and a model not ready fall over as a 429, an access denied
as a 403, the model's and the service's failures as 5xx; a validation error or an unknown model
is the answer, in the client's format. And InvokeModel's token count header, which is the only
usage Cohere's embeddings give."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from proxy.providers import bedrock
from proxy.providers.bedrock import error_type
from proxy.translate.openai_embeddings import bedrock_usage
from proxy.usage import TokenUsage
from tests.proxy.cloud_support import BEDROCK, FAILOVER, HELLO, Clouds, make_clouds
from tests.proxy.conftest import RunningProxy
from tests.support import fake_bedrock as FB
from tests.support import fake_gemini as FG
from tests.support.fake_bedrock import FakeBedrock
from tests.support.fake_gemini import FakeGemini
from tests.support.fake_openai import Failure

NAMESPACE = ":http://internal.amazon.com/coral/com.amazon.bedrock/"


@pytest.fixture
async def clouds(
    client: httpx.AsyncClient,
    proxy: RunningProxy,
    fake_bedrock: FakeBedrock,
    fake_gemini: FakeGemini,
) -> Clouds:
    return await make_clouds(client, proxy, fake_bedrock, fake_gemini)


def refuse(fake: FakeBedrock, kind: str, status: int, message: str = "says no") -> None:
    """The next call gets Bedrock's error of type `kind`, with the status AWS gives it."""
    fake.failures.append(
        Failure(status, {"message": message}, {"x-amzn-ErrorType": kind + NAMESPACE})
    )


# The HTTP status each type comes with (botocore's service model of bedrock-runtime), and the
# status the client gets when the Bedrock credential is the only one.
FALLING_OVER = [
    ("ThrottlingException", 429, 429),
    ("ServiceQuotaExceededException", 400, 429),
    ("ModelNotReadyException", 429, 429),
    ("AccessDeniedException", 403, 403),
    ("ModelTimeoutException", 408, 502),
    ("ModelErrorException", 424, 502),
    ("InternalServerException", 500, 502),
    ("ServiceUnavailableException", 503, 502),
]


@pytest.mark.parametrize(("kind", "sent", "alone"), FALLING_OVER)
async def test_bedrocks_throttling_quota_access_and_service_errors_fall_over_to_gemini(
    clouds: Clouds, kind: str, sent: int, alone: int
) -> None:
    refuse(clouds.bedrock, kind, sent)
    async with clouds.openai() as sdk:
        raw = await sdk.chat.completions.with_raw_response.create(model=FAILOVER, messages=HELLO)
        assert raw.parse().choices[0].message.content == FG.REPLY
        assert raw.headers["x-vkgate-provider"] == "studio"
        assert raw.headers["x-vkgate-fallback-count"] == "1"
        refuse(clouds.bedrock, kind, sent, "the only credential says no")
        with pytest.raises(openai.APIStatusError) as refused:
            await sdk.chat.completions.create(model=BEDROCK, messages=HELLO)
    assert refused.value.status_code == alone
    if alone < 500:
        # A lone refusal is the provider's own answer, its message kept.
        assert refused.value.body["message"] == "the only credential says no"  # type: ignore[index]
        assert refused.value.body["code"] == "provider_error"  # type: ignore[index]
    assert len(clouds.gemini.received) == 1


@pytest.mark.parametrize(
    ("kind", "sent"), [("ValidationException", 400), ("ResourceNotFoundException", 404)]
)
async def test_a_validation_error_or_unknown_model_is_the_answer_in_the_clients_format(
    clouds: Clouds, kind: str, sent: int
) -> None:
    refuse(clouds.bedrock, kind, sent, "The provided model identifier is invalid.")
    async with clouds.anthropic() as sdk:
        with pytest.raises(anthropic.APIStatusError) as refused:
            await sdk.messages.create(model=FAILOVER, max_tokens=16, messages=HELLO)
    assert refused.value.status_code == sent
    error = refused.value.body["error"]  # type: ignore[index]
    assert error["type"] == ("invalid_request_error" if sent == 400 else "not_found_error")
    assert error["message"] == "The provided model identifier is invalid."
    assert clouds.gemini.received == []


async def test_an_error_typed_only_in_its_body_is_told_apart_too(clouds: Clouds) -> None:
    clouds.bedrock.failures.append(
        Failure(
            400,
            {
                "__type": "com.amazon.coral.service#ServiceQuotaExceededException",
                "message": "quota",
            },
        )
    )
    async with clouds.openai() as sdk:
        raw = await sdk.chat.completions.with_raw_response.create(model=FAILOVER, messages=HELLO)
    assert raw.headers["x-vkgate-provider"] == "studio"


def test_error_types_are_read_as_botocore_reads_them() -> None:
    assert error_type(b"ThrottlingException" + NAMESPACE.encode(), b"{}") == "ThrottlingException"
    assert error_type(None, b'{"__type": "a.b#ValidationException"}') == "ValidationException"
    assert error_type(None, b'{"code": "AccessDeniedException"}') == "AccessDeniedException"
    assert error_type(None, b'{"message": "nothing says"}') == ""
    assert error_type(None, b"<html>not JSON</html>") == ""


@pytest.mark.parametrize(
    ("exception", "status"),
    [("validationException", 400), ("serviceUnavailableException", 503)],
)
async def test_a_stream_opening_with_an_exception_is_that_error_before_any_byte(
    clouds: Clouds, exception: str, status: int
) -> None:
    clouds.bedrock.open_with_exception = exception
    async with clouds.openai() as sdk:
        if status >= 500:
            raw = await sdk.chat.completions.with_raw_response.create(
                model=FAILOVER, messages=HELLO, stream=True
            )
            assert raw.headers["x-vkgate-provider"] == "studio"
            return
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.chat.completions.create(model=FAILOVER, messages=HELLO, stream=True)
    assert "Too many requests" in refused.value.message  # the frame's own message
    assert clouds.gemini.received == []


async def test_an_exception_frame_mid_stream_ends_it_with_an_error_in_the_clients_format(
    clouds: Clouds,
) -> None:
    clouds.bedrock.exception_mid_stream = "modelStreamErrorException"
    async with clouds.openai() as sdk:
        stream = await sdk.chat.completions.create(model=FAILOVER, messages=HELLO, stream=True)
        pieces = []
        with pytest.raises(openai.APIError) as broke:
            async for chunk in stream:
                pieces.append(chunk.choices[0].delta.content if chunk.choices else "")
    assert "".join(p or "" for p in pieces) == FB.REPLY_PIECES[0]
    assert "The model stream failed" in broke.value.message
    assert clouds.gemini.received == [], "nothing falls over once the client has a byte"
    clouds.bedrock.exception_mid_stream = "throttlingException"
    async with clouds.openai() as sdk:
        responses = await sdk.responses.create(model=BEDROCK, input="hello", stream=True)
        events = [event async for event in responses]
    assert events[-1].type == "response.failed"
    assert events[-1].response.error is not None  # type: ignore[union-attr]
    assert "The model stream failed" in events[-1].response.error.message  # type: ignore[union-attr]


class _Answer:
    status = 200
    retry_after = None

    def __init__(self, body: bytes) -> None:
        self._body = body

    async def read(self) -> bytes:
        return self._body

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("body", "written"),
    [
        (b"{}", b'{"vkgateInputTokenCount":7}'),
        (b' { "texts": ["a"]}', b'{"vkgateInputTokenCount":7,"texts": ["a"]}'),
        (b"[1]", b"[1]"),  # not an object: left as it is
    ],
)
async def test_invoke_models_header_token_count_is_written_into_its_answer(
    body: bytes, written: bytes
) -> None:
    answer = await bedrock._counted(_Answer(body), b" 007 ")  # type: ignore[arg-type]
    assert await answer.read() == written
    if written != body:
        assert bedrock_usage(written)[0] == TokenUsage(input_tokens=7)

"""Audio and images through the proxy with the official OpenAI SDK, end to end: each call reaches
the fake provider with only `model` replaced, the answer comes back as the provider sent it, and
the ledger holds each request once, in the units it is priced in, to the nano-dollar."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import httpx
import openai
import pytest
from genai_prices import Usage, calc_price
from litestar import Litestar

from tests.proxy.conftest import (
    RunningProxy,
    Tenant,
    add_key,
    add_policy,
    add_provider,
    openai_error,
    proxy_settings,
    serve_proxy,
)
from tests.proxy.test_spend_ledger import drained, report
from tests.support.api import create
from tests.support.clock import ManualClock
from tests.support.fake_anthropic import FakeAnthropic
from tests.support.fake_openai import FakeOpenAI
from tests.support.fake_openai_media import (
    IMAGE_INPUT_IMAGE_TOKENS,
    IMAGE_OUTPUT_TOKENS,
    IMAGE_TEXT_TOKENS,
    PNG,
    SPEECH_CHUNKS,
    SPEECH_USAGE,
    TRANSCRIBE_USAGE,
    TRANSCRIPT,
    read_form,
    wav,
)
from tests.support.ledger import ledger_rows

NANO = Decimal("1e9")
SAY = "Hello from the gateway, in a voice."
DALLE_PRICES = {"1024x1024": "0.04", "1024x1024/hd": "0.08", "*/hd": "0.12"}
ALIASES = {
    "tts": "tts-1",
    "tts-mini": "gpt-4o-mini-tts",
    "whisper": "whisper-1",
    "transcribe": "gpt-4o-transcribe",
    "dalle": "dall-e-3",
    "image": "gpt-image-1",
}


@dataclass
class Media:
    proxy: RunningProxy
    tenant: Tenant
    claude: str
    """A provider that serves no audio and no images."""


def genai_nanos(model: str, **usage: Any) -> int:
    price = calc_price(Usage(**usage), model_ref=model, provider_id="openai").total_price
    return int((price * NANO).quantize(Decimal(1), rounding=ROUND_HALF_UP))


@pytest.fixture
async def media(
    client: httpx.AsyncClient,
    app: Litestar,
    clock: ManualClock,
    fake_openai: FakeOpenAI,
    fake_anthropic: FakeAnthropic,
) -> AsyncIterator[Media]:
    org = (await create(client, "/api/admin/organizations", {"name": "studio"}))["id"]
    project = (await create(client, "/api/admin/projects", {"organization_id": org, "name": "p"}))[
        "id"
    ]
    gpt = await add_provider(
        client,
        org,
        "openai",
        fake_openai.url,
        fake_openai.api_key,
        kind="openai",
        price_overrides={"dall-e-3": {"per_image": DALLE_PRICES}},
    )
    claude = await add_provider(
        client, org, "claude", fake_anthropic.url, fake_anthropic.api_key, kind="anthropic"
    )
    chains = {alias: [(gpt, model)] for alias, model in ALIASES.items()}
    chains["claude-only"] = [(claude, "claude-3-5-haiku-latest")]
    policy = await add_policy(client, org, chains)
    tenant = Tenant(org, project, gpt, policy, "", "")
    tenant.key_id, tenant.key = await add_key(client, tenant)
    async with serve_proxy(app, clock, proxy_settings()) as proxy:
        yield Media(proxy, tenant, claude)


async def rows_of(client: httpx.AsyncClient, media: Media, records: int) -> list[dict[str, Any]]:
    """The outcome rows of the requests made so far, in the order they were made."""
    await drained(media.proxy, records)
    rows = await ledger_rows(client, media.tenant.org)
    return sorted(rows, key=lambda r: r["seq"])


# -- speech ----------------------------------------------------------------------------------


async def test_speech_streams_the_providers_audio_and_is_priced_by_its_characters(
    media: Media, client: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    sdk = media.proxy.openai(media.tenant.key)
    async with (
        sdk,
        sdk.audio.speech.with_streaming_response.create(
            model="tts", voice="alloy", input=SAY
        ) as response,
    ):
        assert response.headers["content-type"] == "audio/mpeg"
        audio = b"".join([chunk async for chunk in response.iter_bytes()])
    assert audio == b"".join(SPEECH_CHUNKS)
    [received] = fake_openai.received
    assert received.path == "/v1/audio/speech"
    assert received.json() == {"model": "tts-1", "voice": "alloy", "input": SAY}

    [row] = await rows_of(client, media, 2)
    assert (row["route"], row["status"], row["stream"]) == ("/v1/audio/speech", 200, True)
    assert row["input_characters"] == len(SAY)
    assert (row["input_tokens"], row["output_tokens"]) == (0, 0)
    assert row["price_source"] == "genai-prices"
    # tts-1: $15 per million characters.
    assert Decimal(row["cost_usd"]) * NANO == len(SAY) * 15_000
    assert Decimal(row["cost_usd"]) * NANO == genai_nanos("tts-1", input_characters=len(SAY))


async def test_speech_of_a_token_priced_model_is_unpriced_without_usage_and_priced_with_it(
    media: Media, client: httpx.AsyncClient
) -> None:
    async with media.proxy.openai(media.tenant.key) as sdk:
        async with sdk.audio.speech.with_streaming_response.create(
            model="tts-mini", voice="alloy", input=SAY
        ) as response:
            await response.read()
        # Typed events carry the usage the binary stream cannot.
        async with sdk.audio.speech.with_streaming_response.create(
            model="tts-mini", voice="alloy", input=SAY, stream_format="sse"
        ) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            events = (await response.read()).decode()
    assert "speech.audio.done" in events

    binary, events_row = await rows_of(client, media, 4)
    # Characters are all a binary answer says, and this model is priced by tokens: not $0 in
    # silence, but unpriced, and counted so.
    assert binary["price_source"] == "unpriced" and binary["cost_usd"] == "0"
    assert binary["input_characters"] == len(SAY)
    assert events_row["price_source"] == "genai-prices"
    assert (events_row["input_tokens"], events_row["output_tokens"]) == (14, 101)
    assert events_row["output_audio_tokens"] == 101
    expected = genai_nanos(
        "gpt-4o-mini-tts",
        input_tokens=SPEECH_USAGE["input_tokens"],
        output_tokens=SPEECH_USAGE["output_tokens"],
        output_audio_tokens=SPEECH_USAGE["output_tokens"],
    )
    assert Decimal(events_row["cost_usd"]) * NANO == expected
    totals = (await report(client, media.tenant.org))["totals"]
    assert (totals["requests"], totals["unpriced"]) == (2, 1)
    assert totals["input_characters"] == 2 * len(SAY)


# -- transcription and translation ------------------------------------------------------------


async def test_transcription_is_priced_by_the_seconds_the_provider_reports(
    media: Media, client: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    recording = wav(2.5)
    async with media.proxy.openai(media.tenant.key) as sdk:
        plain = await sdk.audio.transcriptions.create(
            model="whisper", file=("speech.wav", recording, "audio/wav")
        )
        verbose = await sdk.audio.transcriptions.create(
            model="whisper",
            file=("speech.wav", recording, "audio/wav"),
            response_format="verbose_json",
        )
        translated = await sdk.audio.translations.create(
            model="whisper", file=("speech.wav", recording, "audio/wav")
        )
    assert plain.text == verbose.text == translated.text == TRANSCRIPT
    assert verbose.duration == 2.5
    first = fake_openai.received[0]
    assert first.path == "/v1/audio/transcriptions"
    upload = read_form(first.header("Content-Type") or "", first.body)
    assert upload.fields["model"] == "whisper-1"
    assert upload.files["file"] == [("speech.wav", recording, "audio/wav")]
    assert fake_openai.received[2].path == "/v1/audio/translations"

    rows = await rows_of(client, media, 6)
    assert [r["route"] for r in rows] == [
        "/v1/audio/transcriptions",
        "/v1/audio/transcriptions",
        "/v1/audio/translations",
    ]
    for row in rows:
        # The provider's usage says 2 seconds (it rounds); verbose_json's duration is not used
        # over it.
        assert (row["audio_seconds"], row["usage_source"]) == ("2.000", "provider")
        assert row["price_source"] == "genai-prices"
        # whisper-1: $0.006 a minute.
        assert Decimal(row["cost_usd"]) * NANO == 200_000
    totals = (await report(client, media.tenant.org, "route"))["totals"]
    assert totals["audio_seconds"] == "6.000"


@pytest.mark.parametrize(
    ("response_format", "content_type", "answer"),
    [
        ("text", "text/plain", TRANSCRIPT + "\n"),
        ("srt", "application/x-subrip", "1\n00:00:00,000 --> 00:00:02,500\n"),
        ("vtt", "text/vtt", "WEBVTT\n\n00:00:00.000 --> 00:00:02.500\n"),
    ],
)
async def test_text_and_subtitle_answers_pass_through_and_their_seconds_are_estimated(
    media: Media,
    client: httpx.AsyncClient,
    response_format: str,
    content_type: str,
    answer: str,
) -> None:
    async with media.proxy.openai(media.tenant.key) as sdk:
        raw = await sdk.audio.transcriptions.with_raw_response.create(
            model="whisper",
            file=("speech.wav", wav(2.5), "audio/wav"),
            response_format=response_format,  # type: ignore[arg-type]
        )
    assert raw.headers["content-type"].startswith(content_type)
    assert raw.http_response.text.startswith(answer)
    [row] = await rows_of(client, media, 2)
    # No usage in the answer: the WAV header's (or the last cue's) 2.5 s, said to be estimated.
    assert (row["audio_seconds"], row["usage_source"]) == ("2.500", "estimated")
    assert Decimal(row["cost_usd"]) * NANO == 250_000


async def test_a_token_priced_transcription_plain_and_streamed_is_priced_by_its_tokens(
    media: Media, client: httpx.AsyncClient
) -> None:
    async with media.proxy.openai(media.tenant.key) as sdk:
        plain = await sdk.audio.transcriptions.create(
            model="transcribe", file=("speech.wav", wav(1.0), "audio/wav")
        )
        stream = await sdk.audio.transcriptions.create(
            model="transcribe", file=("speech.wav", wav(1.0), "audio/wav"), stream=True
        )
        events = [event async for event in stream]
    assert plain.text == TRANSCRIPT
    assert events[-1].type == "transcript.text.done"
    assert "".join(e.delta for e in events[:-1] if e.type == "transcript.text.delta").strip() == (
        TRANSCRIPT
    )
    expected = genai_nanos(
        "gpt-4o-transcribe",
        input_tokens=TRANSCRIBE_USAGE["input_tokens"],
        input_audio_tokens=TRANSCRIBE_USAGE["input_token_details"]["audio_tokens"],  # type: ignore[index]
        output_tokens=TRANSCRIBE_USAGE["output_tokens"],
    )
    rows = await rows_of(client, media, 4)
    assert [r["stream"] for r in rows] == [False, True]
    for row in rows:
        assert (row["input_tokens"], row["input_audio_tokens"], row["output_tokens"]) == (
            58,
            50,
            11,
        )
        assert row["usage_source"] == "provider"
        assert Decimal(row["cost_usd"]) * NANO == expected


async def test_malformed_uploads_are_refused_naming_what_is_wrong(media: Media) -> None:
    headers = {"Authorization": f"Bearer {media.tenant.key}"}
    async with media.proxy.http() as http:
        no_boundary = await http.post(
            "/v1/audio/transcriptions",
            headers={**headers, "Content-Type": "multipart/form-data"},
            content=b"--x\r\n",
        )
        assert "boundary" in openai_error(no_boundary, 400, "invalid_request")["message"]
        truncated = await http.post(
            "/v1/audio/transcriptions",
            headers={**headers, "Content-Type": "multipart/form-data; boundary=b"},
            content=b'--b\r\ncontent-disposition: form-data; name="model"\r\n\r\nwhisper',
        )
        assert "truncated" in openai_error(truncated, 400, "invalid_request")["message"]
        no_model = await http.post(
            "/v1/audio/transcriptions", headers=headers, files={"file": ("a.wav", wav(0.1))}
        )
        openai_error(no_model, 400, "invalid_request", param="model")
        no_file = await http.post(
            "/v1/audio/transcriptions", headers=headers, data={"model": "whisper"}, files={}
        )
        assert no_file.status_code == 400


# -- images ------------------------------------------------------------------------------------


async def test_images_of_a_per_image_price_are_priced_by_count_size_and_quality(
    media: Media, client: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    async with media.proxy.openai(media.tenant.key) as sdk:
        made = await sdk.images.generate(
            model="dalle", prompt="a lighthouse", n=2, size="1024x1024", quality="hd"
        )
        unknown_size = await sdk.images.generate(model="dalle", prompt="a lighthouse")
    assert len(made.data or []) == 2 and len(unknown_size.data or []) == 1
    assert fake_openai.received[0].json()["model"] == "dall-e-3"
    hd, standard = await rows_of(client, media, 4)
    assert (hd["images"], hd["image_size"], hd["image_quality"]) == (2, "1024x1024", "hd")
    assert hd["price_source"] == "override"
    assert Decimal(hd["cost_usd"]) == Decimal("0.16")
    # Nothing asked: what the provider made is unknown, so `*` is the price that applies.
    assert (standard["image_size"], standard["image_quality"]) == (None, None)
    assert standard["price_source"] == "unpriced"
    totals = (await report(client, media.tenant.org))["totals"]
    assert (totals["images"], totals["unpriced"]) == (3, 1)


async def test_gpt_image_generation_and_edit_are_priced_by_their_tokens(
    media: Media, client: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    async with media.proxy.openai(media.tenant.key) as sdk:
        made = await sdk.images.generate(model="image", prompt="a lighthouse")
        edited = await sdk.images.edit(
            model="image",
            image=[("a.png", PNG, "image/png"), ("b.png", PNG, "image/png")],
            mask=("mask.png", PNG, "image/png"),
            prompt="add a boat",
        )
        streamed = await sdk.images.generate(model="image", prompt="a lighthouse", stream=True)
        events = [event async for event in streamed]
    assert made.usage is not None and made.usage.output_tokens == IMAGE_OUTPUT_TOKENS
    assert edited.usage is not None
    assert edited.usage.input_tokens_details.image_tokens == 2 * IMAGE_INPUT_IMAGE_TOKENS
    assert [e.type for e in events] == [
        "image_generation.partial_image",
        "image_generation.completed",
    ]
    edit_request = fake_openai.received[1]
    assert edit_request.path == "/v1/images/edits"
    upload = read_form(edit_request.header("Content-Type") or "", edit_request.body)
    assert upload.fields["model"] == "gpt-image-1"
    assert [name for name, _, _ in upload.files["image[]"]] == ["a.png", "b.png"]

    generated, edit, stream = await rows_of(client, media, 6)
    for row, uploaded in ((generated, 0), (edit, 2), (stream, 0)):
        assert (row["images"], row["image_size"], row["image_quality"]) == (1, "1024x1536", "low")
        assert row["input_tokens"] == IMAGE_TEXT_TOKENS + uploaded * IMAGE_INPUT_IMAGE_TOKENS
        assert row["input_image_tokens"] == uploaded * IMAGE_INPUT_IMAGE_TOKENS
        assert (row["output_tokens"], row["output_image_tokens"]) == (IMAGE_OUTPUT_TOKENS,) * 2
        expected = genai_nanos(
            "gpt-image-1",
            input_tokens=row["input_tokens"],
            input_image_tokens=row["input_image_tokens"],
            output_tokens=IMAGE_OUTPUT_TOKENS,
        )
        assert Decimal(row["cost_usd"]) * NANO == expected
    assert edit["route"] == "/v1/images/edits" and stream["stream"] is True


# -- governance ------------------------------------------------------------------------------


async def test_a_budget_for_one_image_refuses_two_before_any_provider_is_called(
    media: Media, client: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    tenant = media.tenant
    key_id, key = await add_key(client, tenant)
    body = {
        "organization_id": tenant.org,
        "scope": {"kind": "virtual_key", "id": key_id},
        "window": "day",
        "limit_usd": "0.10",
        "on_breach": "block",
    }
    await create(client, "/api/admin/budgets", body)
    async with media.proxy.openai(key) as sdk:
        with pytest.raises(openai.APIStatusError) as refused:
            await sdk.images.generate(
                model="dalle", prompt="two", n=2, size="1024x1024", quality="hd"
            )
        assert fake_openai.received == []
        made = await sdk.images.generate(
            model="dalle", prompt="one", n=1, size="1024x1024", quality="hd"
        )
    assert refused.value.status_code == 402
    error = refused.value.response.json()["error"]
    assert (error["code"], error["limit_usd"]) == ("budget_exceeded", "0.1")
    # Two images at the dearest price their size and quality have.
    assert "0.16 USD" in error["message"]
    assert len(made.data or []) == 1


async def test_an_image_alias_outside_the_keys_allowed_models_is_403(
    media: Media, client: httpx.AsyncClient, fake_openai: FakeOpenAI
) -> None:
    _, key = await add_key(client, media.tenant, allowed_models=["tts"])
    async with media.proxy.openai(key) as sdk:
        with pytest.raises(openai.PermissionDeniedError) as refused:
            await sdk.images.generate(model="dalle", prompt="a cat")
        with pytest.raises(openai.NotFoundError):
            await sdk.models.retrieve("dalle")
    openai_error(refused.value.response, 403, "model_not_allowed", param="model")
    assert fake_openai.received == []


async def test_a_chain_with_no_provider_for_the_operation_is_a_400_naming_it(
    media: Media,
) -> None:
    async with media.proxy.openai(media.tenant.key) as sdk:
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.images.generate(model="claude-only", prompt="a cat")
    error = openai_error(refused.value.response, 400, "invalid_request", param="model")
    assert "'claude-only'" in error["message"] and "image generation" in error["message"]
    assert [a["code"] for a in error["attempts"]] == ["unsupported_operation"]


async def test_models_retrieve_gives_one_alias_or_a_404_in_openais_shape(media: Media) -> None:
    async with media.proxy.openai(media.tenant.key) as sdk:
        model = await sdk.models.retrieve("whisper")
        with pytest.raises(openai.NotFoundError) as missing:
            await sdk.models.retrieve("nope")
    assert (model.id, model.object, model.owned_by) == ("whisper", "model", "openai")
    error = openai_error(missing.value.response, 404, "model_not_found")
    assert "nope" in error["message"]


async def test_audio_and_images_reach_azure_deployments(
    client: httpx.AsyncClient, app: Litestar, clock: ManualClock, fake_openai: FakeOpenAI
) -> None:
    org = (await create(client, "/api/admin/organizations", {"name": "azure"}))["id"]
    project = (await create(client, "/api/admin/projects", {"organization_id": org, "name": "p"}))[
        "id"
    ]
    azure = await add_provider(
        client,
        org,
        "azure",
        fake_openai.azure_endpoint,
        fake_openai.api_key,
        kind="azure_openai",
        api_version="2024-10-21",
    )
    policy = await add_policy(
        client, org, {"whisper": [(azure, "my-whisper")], "dalle": [(azure, "my-dalle")]}
    )
    tenant = Tenant(org, project, azure, policy, "", "")
    _, key = await add_key(client, tenant)
    async with serve_proxy(app, clock, proxy_settings()) as proxy, proxy.openai(key) as sdk:
        text = await sdk.audio.transcriptions.create(
            model="whisper", file=("a.wav", wav(0.5), "audio/wav")
        )
        image = await sdk.images.generate(model="dalle", prompt="a cat")
    assert text.text == TRANSCRIPT and len(image.data or []) == 1
    paths = [(r.path, r.query.get("api-version")) for r in fake_openai.received]
    assert paths == [
        ("/openai/deployments/my-whisper/audio/transcriptions", "2024-10-21"),
        ("/openai/deployments/my-dalle/images/generations", "2024-10-21"),
    ]
    assert json.loads(fake_openai.received[1].body)["model"] == "my-dalle"

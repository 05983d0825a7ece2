"""OpenAI's audio and image routes on the fake provider, in their real wire formats.

Speech answers a chunked binary stream (`audio/mpeg`), or typed events with `stream_format:
"sse"`; transcriptions and translations answer JSON, text, SRT, WebVTT or verbose JSON, and a
streamed transcription typed events; images answer `b64_json` data, with `usage` (and the size
and quality made) for GPT image models, or typed events when streamed. Uploads are read with
the standard library's MIME parser, not the proxy's.
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
import json
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from tests.support.fake_openai import FakeOpenAI

SPEECH_CHUNKS = (b"ID3\x04\x00fake-mp3-frame-one", b"\xff\xfbframe-two", b"\xff\xfbframe-three")
SPEECH_USAGE = {"input_tokens": 14, "output_tokens": 101, "total_tokens": 115}
TRANSCRIPT = "The quick brown fox jumps over the lazy dog."
TRANSCRIBE_USAGE = {
    "type": "tokens",
    "input_tokens": 58,
    "input_token_details": {"audio_tokens": 50, "text_tokens": 8},
    "output_tokens": 11,
    "total_tokens": 69,
}
# A 1x1 transparent PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="
)
IMAGE_TEXT_TOKENS = 9
IMAGE_INPUT_IMAGE_TOKENS = 323
IMAGE_OUTPUT_TOKENS = 272


def wav(seconds: float, rate: int = 8_000) -> bytes:
    """A mono 8-bit PCM WAV of silence, `seconds` long: its header says its duration."""
    frames = int(seconds * rate)
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate, 1, 8)
    return (
        b"RIFF"
        + struct.pack("<I", 4 + 8 + len(fmt) + 8 + frames)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<I", len(fmt))
        + fmt
        + b"data"
        + struct.pack("<I", frames)
        + b"\x80" * frames
    )


def wav_duration(data: bytes) -> float | None:
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    byte_rate = struct.unpack_from("<I", data, 28)[0]
    size = struct.unpack_from("<I", data, 40)[0]
    return size / byte_rate


@dataclass
class Upload:
    fields: dict[str, str]
    files: dict[str, list[tuple[str, bytes, str]]]


def read_form(content_type: str, body: bytes) -> Upload:
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body
    )
    fields: dict[str, str] = {}
    files: dict[str, list[tuple[str, bytes, str]]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        filename = part.get_filename()
        payload = part.get_payload(decode=True) or b""
        if filename is None:
            fields[str(name)] = payload.decode()
        else:
            files.setdefault(str(name), []).append((filename, payload, part.get_content_type()))
    return Upload(fields, files)


def _events(*events: dict[str, Any]) -> list[bytes]:
    return [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events]


Gate = Callable[[web.Request], web.Response | None]
Answer = Callable[[web.Request, bytes, str], Awaitable[web.StreamResponse]]


def add_routes(app: web.Application, fake: FakeOpenAI, gate: Gate, azure_gate: Gate) -> None:
    """The audio and image routes, under OpenAI's paths and Azure's deployment paths."""

    def route(
        answer: Answer, *, azure: bool
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            body = await fake.admit(request)
            refusal = (azure_gate if azure else gate)(request)
            if refusal is not None:
                return refusal
            deployment = request.match_info.get("deployment", "")
            return await answer(request, body, deployment)

        return handle

    async def speech(request: web.Request, body: bytes, deployment: str) -> web.StreamResponse:
        payload = json.loads(body)
        if not payload.get("input"):
            return web.json_response(fake.error_body(400, "input is required"), status=400)
        if payload.get("stream_format") == "sse":
            events = [
                *(
                    {"type": "speech.audio.delta", "audio": base64.b64encode(c).decode()}
                    for c in SPEECH_CHUNKS
                ),
                {"type": "speech.audio.done", "usage": SPEECH_USAGE},
            ]
            return await fake.stream(request, "text/event-stream", _events(*events))
        return await fake.stream(request, "audio/mpeg", SPEECH_CHUNKS)

    async def transcribe(request: web.Request, body: bytes, deployment: str) -> web.StreamResponse:
        upload = read_form(request.headers["Content-Type"], body)
        model = upload.fields.get("model") or deployment
        if "file" not in upload.files:
            return web.json_response(fake.error_body(400, "file is required"), status=400)
        _, audio, _ = upload.files["file"][0]
        seconds = wav_duration(audio) or 3.0
        fmt = upload.fields.get("response_format", "json")
        by_tokens = "gpt" in model
        if upload.fields.get("stream") == "true" and by_tokens:
            words = TRANSCRIPT.split(" ")
            events = [
                *({"type": "transcript.text.delta", "delta": w + " "} for w in words),
                {"type": "transcript.text.done", "text": TRANSCRIPT, "usage": TRANSCRIBE_USAGE},
            ]
            return await fake.stream(request, "text/event-stream", _events(*events))
        usage: dict[str, Any] = (
            TRANSCRIBE_USAGE if by_tokens else {"type": "duration", "seconds": round(seconds)}
        )
        if fmt == "json":
            return web.json_response({"text": TRANSCRIPT, "usage": usage})
        if fmt == "verbose_json":
            return web.json_response(
                {
                    "task": "transcribe",
                    "language": "english",
                    "duration": seconds,
                    "text": TRANSCRIPT,
                    "segments": [{"id": 0, "start": 0.0, "end": seconds, "text": TRANSCRIPT}],
                    "usage": usage,
                }
            )
        if fmt == "srt":
            return web.Response(text=_srt(seconds), content_type="application/x-subrip")
        if fmt == "vtt":
            return web.Response(text=_vtt(seconds), content_type="text/vtt")
        return web.Response(text=TRANSCRIPT + "\n", content_type="text/plain")

    async def generate(request: web.Request, body: bytes, deployment: str) -> web.StreamResponse:
        payload = json.loads(body)
        return await _images(request, payload.get("model") or deployment, payload, 0)

    async def edit(request: web.Request, body: bytes, deployment: str) -> web.StreamResponse:
        upload = read_form(request.headers["Content-Type"], body)
        images = upload.files.get("image", []) + upload.files.get("image[]", [])
        if not images:
            return web.json_response(fake.error_body(400, "image is required"), status=400)
        payload: dict[str, Any] = dict(upload.fields)
        payload["n"] = int(payload.get("n", 1))
        payload["stream"] = payload.get("stream") == "true"
        return await _images(request, payload.get("model") or deployment, payload, len(images))

    async def _images(
        request: web.Request, model: str, payload: dict[str, Any], uploaded: int
    ) -> web.StreamResponse:
        n = int(payload.get("n") or 1)
        gpt = model.startswith("gpt-image")
        size = payload.get("size") or ("1024x1024" if not gpt else "1024x1536")
        quality = payload.get("quality") or ("standard" if not gpt else "low")
        usage = {
            "input_tokens": IMAGE_TEXT_TOKENS + uploaded * IMAGE_INPUT_IMAGE_TOKENS,
            "input_tokens_details": {
                "text_tokens": IMAGE_TEXT_TOKENS,
                "image_tokens": uploaded * IMAGE_INPUT_IMAGE_TOKENS,
            },
            "output_tokens": n * IMAGE_OUTPUT_TOKENS,
            "total_tokens": IMAGE_TEXT_TOKENS
            + uploaded * IMAGE_INPUT_IMAGE_TOKENS
            + n * IMAGE_OUTPUT_TOKENS,
        }
        picture = base64.b64encode(PNG).decode()
        if payload.get("stream"):
            kind = "image_edit" if uploaded else "image_generation"
            per_image = {
                **usage,
                "output_tokens": IMAGE_OUTPUT_TOKENS,
                "total_tokens": usage["input_tokens"] + IMAGE_OUTPUT_TOKENS,
            }
            events = []
            for index in range(n):
                events.append(
                    {"type": f"{kind}.partial_image", "b64_json": picture, "partial_image_index": 0}
                )
                events.append(
                    {
                        "type": f"{kind}.completed",
                        "b64_json": picture,
                        "created_at": 1_700_000_000 + index,
                        "size": size,
                        "quality": quality,
                        "background": "opaque",
                        "output_format": "png",
                        "usage": per_image,
                    }
                )
            return await fake.stream(request, "text/event-stream", _events(*events))
        answer: dict[str, Any] = {
            "created": 1_700_000_000,
            "data": [{"b64_json": picture, "revised_prompt": payload.get("prompt")}] * n,
        }
        if gpt:
            answer.update(usage=usage, size=size, quality=quality, output_format="png")
        return web.json_response(answer)

    for path, answer in (
        ("/audio/speech", speech),
        ("/audio/transcriptions", transcribe),
        ("/audio/translations", transcribe),
        ("/images/generations", generate),
        ("/images/edits", edit),
    ):
        app.router.add_post("/v1" + path, route(answer, azure=False))
        app.router.add_post("/openai/deployments/{deployment}" + path, route(answer, azure=True))


def _stamp(seconds: float, separator: str) -> str:
    whole = int(seconds)
    millis = round((seconds - whole) * 1000)
    return f"{whole // 3600:02d}:{whole % 3600 // 60:02d}:{whole % 60:02d}{separator}{millis:03d}"


def _srt(seconds: float) -> str:
    return f"1\n00:00:00,000 --> {_stamp(seconds, ',')}\n{TRANSCRIPT}\n\n"


def _vtt(seconds: float) -> str:
    return f"WEBVTT\n\n00:00:00.000 --> {_stamp(seconds, '.')}\n{TRANSCRIPT}\n\n"

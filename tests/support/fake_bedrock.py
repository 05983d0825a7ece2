"""A fake Amazon Bedrock runtime, and a fake STS beside it: real HTTP on loopback, real wire formats.

Bedrock: `POST /model/{modelId}/converse`, `/converse-stream` (event-stream frames with their
CRCs) and `/invoke` (Titan and Cohere embeddings). Every request's SigV4 signature is checked
with botocore's own algorithm against the keys the fake knows, its date against the clock, and
its session token against the one the keys were issued with; a request that fails any of it
gets Bedrock's 403. Answers are Converse's JSON: a `toolUse` when the request offers tools and
no tool result came back yet, text otherwise, with settable usage.

STS: `POST /` with `Action=AssumeRoleWithWebIdentity` (the web identity flow IRSA uses), which
takes the token a test wrote to a file and issues temporary keys that the Bedrock side then
accepts, each expiring when the test says. Has the knobs of `FakeProvider` (failures, stalls,
cut streams), and can open a stream with an exception frame.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import secrets
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs

from aiohttp import web
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials

from tests.support import eventstream
from tests.support.fake_openai import FakeProvider, serving

ACCESS_KEY_ID = "AKIAFAKEBEDROCK00001"
SECRET_ACCESS_KEY = "fake/bedrock/secret+key/0123456789abcdefXYZ"
REGION = "us-east-1"
REPLY = "Hi there! I am the fake Bedrock upstream."
REPLY_PIECES = ("Hi", " there!", " I am the fake Bedrock upstream.")
TOOL_INPUT = {"city": "Paris"}
TOOL_USE_ID = "tooluse_FakeBedrockCall0001"
EVENT_STREAM = "application/vnd.amazon.eventstream"
ROLE_ARN = "arn:aws:iam::123456789012:role/vkgate-proxy"
_AUTHORIZATION = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<day>\d{8})/(?P<region>[^/]+)/"
    r"(?P<service>[^/]+)/aws4_request, SignedHeaders=(?P<signed>[^,]+), Signature=(?P<sig>[0-9a-f]{64})$"
)
ERROR_TYPES = {
    400: "ValidationException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ModelTimeoutException",
    424: "ModelErrorException",
    429: "ThrottlingException",
    500: "InternalServerException",
    503: "ServiceUnavailableException",
}


@dataclass
class Keys:
    secret: str
    token: str | None = None
    expired: bool = False


@dataclass
class FakeBedrock(FakeProvider):
    url: str = ""
    """The runtime's endpoint, as boto3's `endpoint_url` takes it."""
    region: str = REGION
    keys: dict[str, Keys] = field(default_factory=lambda: {ACCESS_KEY_ID: Keys(SECRET_ACCESS_KEY)})
    """Access key id → what the fake accepts with it."""
    web_identity_token: str = ""
    """What STS takes as proof of the workload's identity (the token file's content)."""
    issued: list[str] = field(default_factory=list)
    """Access key ids STS issued, in order."""
    sts_lifetime_s: int = 3600
    input_tokens: int = 13
    output_tokens: int = 8
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    open_with_exception: str | None = None
    """The next stream opens with this exception frame (`throttlingException`) instead of
    its answer."""
    exception_mid_stream: str | None = None
    """The next stream sends its first text, then this exception frame
    (`modelStreamErrorException`) instead of the rest."""
    signed_by: list[str] = field(default_factory=list)
    """The access key id of every request whose signature checked out, in order."""
    raw_paths: list[str] = field(default_factory=list)
    """Every Bedrock request's path as it arrived, percent-encoding and all."""

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        return {"message": message}

    def fail_next(self, status: int, message: str = "upstream says no", **headers: str) -> None:
        kind = ERROR_TYPES.get(status, "InternalServerException")
        headers.setdefault(
            "x-amzn-ErrorType", f"{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/"
        )
        super().fail_next(status, message, **headers)

    def usage(self) -> dict[str, int]:
        return {
            "inputTokens": self.input_tokens,
            "outputTokens": self.output_tokens,
            "totalTokens": self.input_tokens
            + self.output_tokens
            + self.cache_read_tokens
            + self.cache_write_tokens,
            "cacheReadInputTokens": self.cache_read_tokens,
            "cacheWriteInputTokens": self.cache_write_tokens,
        }

    @property
    def sts_url(self) -> str:
        return self.url


def _refusal(status: int, message: str) -> web.Response:
    kind = ERROR_TYPES.get(status, "InternalServerException")
    return web.json_response(
        {"message": message},
        status=status,
        headers={
            "x-amzn-ErrorType": f"{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/"
        },
    )


def check_signature(fake: FakeBedrock, request: web.Request, body: bytes) -> str | None:
    """Why the request's SigV4 signature does not check out, or None when it does.

    The signature is computed again with botocore's algorithm, from the request as it arrived:
    its path as sent (percent-encoding and all), its signed headers, its body.
    """
    fake.raw_paths.append(request.raw_path)
    found = _AUTHORIZATION.match(request.headers.get("Authorization", ""))
    if found is None:
        return "Authorization header is missing or is not SigV4"
    keys = fake.keys.get(found["key"])
    if keys is None:
        return "The security token included in the request is invalid."
    if keys.expired:
        return "The security token included in the request is expired"
    if (found["region"], found["service"]) != (fake.region, "bedrock"):
        return f"Credential should be scoped to a valid region and service, not {found['region']}"
    if keys.token != request.headers.get("X-Amz-Security-Token"):
        return "The security token included in the request is invalid."
    stamp = request.headers.get("X-Amz-Date", "")
    try:
        signed_at = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        return "X-Amz-Date is missing or malformed"
    if abs(datetime.now(UTC) - signed_at) > timedelta(minutes=5):
        return "Signature expired"
    names = found["signed"].split(";")
    if not {"host", "x-amz-date"} <= set(names):
        return "host and x-amz-date must be signed"
    signed = AWSRequest(
        method=request.method,
        url=f"http://{request.host}{request.raw_path}",
        data=body,
        headers={name: request.headers.get(name, "") for name in names},
    )
    signed.context["timestamp"] = stamp
    auth = SigV4Auth(
        ReadOnlyCredentials(found["key"], keys.secret, keys.token), "bedrock", fake.region
    )
    canonical = auth.canonical_request(signed)
    expected = auth.signature(auth.string_to_sign(signed, canonical), signed)
    if not secrets.compare_digest(expected, found["sig"]):
        return "The request signature we calculated does not match the signature you provided."
    fake.signed_by.append(found["key"])
    return None


def _tool_to_call(payload: dict[str, Any]) -> str | None:
    config = payload.get("toolConfig") or {}
    tools = [t["toolSpec"] for t in config.get("tools", []) if "toolSpec" in t]
    if not tools:
        return None
    last = payload["messages"][-1]
    if any("toolResult" in block for block in last.get("content", [])):
        return None
    choice = config.get("toolChoice") or {}
    return str(choice["tool"]["name"] if "tool" in choice else tools[0]["name"])


def _invalid(payload: Any) -> str | None:
    if not isinstance(payload, dict):
        return "body must be a JSON object"
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        return "The messages field is required and must not be empty"
    if messages[0].get("role") != "user":
        return "A conversation must start with a user message."
    for one, two in itertools.pairwise(messages):
        if one.get("role") == two.get("role"):
            return "A conversation must alternate between user and assistant roles."
    for message in messages:
        for block in message.get("content", []):
            if "text" in block and not block["text"].strip():
                return "The text field in the ContentBlock object is blank."
    if "model" in payload or "stream" in payload:
        return "Malformed input request: extraneous key [model or stream] is not permitted"
    return None


def _app(fake: FakeBedrock) -> web.Application:
    async def converse(request: web.Request) -> web.StreamResponse:
        body = await fake.admit(request)
        problem = check_signature(fake, request, body)
        if problem is not None:
            return _refusal(403, problem)
        failure = fake.next_failure()
        if failure is not None:
            return failure
        try:
            payload = json.loads(body)
        except ValueError:
            return _refusal(400, "Malformed input request")
        problem = _invalid(payload)
        if problem is not None:
            return _refusal(400, problem)
        tool = _tool_to_call(payload)
        if tool is None:
            content: dict[str, Any] = {"text": REPLY}
            stop = "end_turn"
        else:
            content = {"toolUse": {"toolUseId": TOOL_USE_ID, "name": tool, "input": TOOL_INPUT}}
            stop = "tool_use"
        if request.path.endswith("/converse"):
            return web.json_response(
                {
                    "output": {"message": {"role": "assistant", "content": [content]}},
                    "stopReason": stop,
                    "usage": fake.usage(),
                    "metrics": {"latencyMs": 123},
                }
            )
        return await fake.stream(request, EVENT_STREAM, _stream_frames(fake, tool, stop))

    async def invoke(request: web.Request) -> web.StreamResponse:
        body = await fake.admit(request)
        problem = check_signature(fake, request, body)
        if problem is not None:
            return _refusal(403, problem)
        failure = fake.next_failure()
        if failure is not None:
            return failure
        model = request.match_info["model"]
        payload = json.loads(body)
        if "titan-embed" in model:
            text = payload["inputText"]
            size = payload.get("dimensions", 3)
            return web.json_response(
                {"embedding": _vector(text, size), "inputTextTokenCount": len(text.split())},
                headers=_token_counts(len(text.split())),
            )
        if "cohere.embed" in model:
            vectors = [
                _vector(text, payload.get("output_dimension", 3)) for text in payload["texts"]
            ]
            # Cohere's body counts nothing: InvokeModel's headers are its only usage.
            return web.json_response(
                {
                    "id": "fake-cohere",
                    "embeddings": {"float": vectors},
                    "texts": payload["texts"],
                    "response_type": "embeddings_by_type",
                },
                headers=_token_counts(sum(len(text.split()) for text in payload["texts"])),
            )
        return _refusal(400, f"The provided model identifier is invalid: {model}")

    async def sts(request: web.Request) -> web.Response:
        form = parse_qs((await request.read()).decode())
        if form.get("Action") != ["AssumeRoleWithWebIdentity"]:
            return web.Response(status=400, text="unknown action")
        if form.get("WebIdentityToken") != [fake.web_identity_token] or not fake.web_identity_token:
            return web.Response(
                status=400,
                content_type="text/xml",
                text=_sts_error("InvalidIdentityToken", "the web identity token is not valid"),
            )
        if form.get("RoleArn") != [ROLE_ARN]:
            return web.Response(
                status=403,
                content_type="text/xml",
                text=_sts_error("AccessDenied", "not this role"),
            )
        key_id = "ASIA" + secrets.token_hex(8).upper()
        secret, token = secrets.token_urlsafe(30), "FwoG" + secrets.token_urlsafe(120)
        fake.keys[key_id] = Keys(secret, token)
        fake.issued.append(key_id)
        expiration = datetime.now(UTC) + timedelta(seconds=fake.sts_lifetime_s)
        return web.Response(
            content_type="text/xml", text=_sts_answer(key_id, secret, token, expiration)
        )

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/model/{model:.+}/converse", converse)
    app.router.add_post("/model/{model:.+}/converse-stream", converse)
    app.router.add_post("/model/{model:.+}/invoke", invoke)
    app.router.add_post("/", sts)
    return app


def _token_counts(count: int) -> dict[str, str]:
    """InvokeModel's usage headers, as Bedrock sends them with every model's answer."""
    return {
        "X-Amzn-Bedrock-Input-Token-Count": str(count),
        "X-Amzn-Bedrock-Output-Token-Count": "0",
        "X-Amzn-Bedrock-Invocation-Latency": "42",
    }


def _vector(text: str, size: int) -> list[float]:
    seed = sum(text.encode()) % 97
    return [round(0.01 * (seed + i), 4) for i in range(size)]


def _stream_frames(fake: FakeBedrock, tool: str | None, stop: str) -> list[bytes]:
    if fake.open_with_exception is not None:
        name, fake.open_with_exception = fake.open_with_exception, None
        return [eventstream.exception(name, "Too many requests, please wait before trying again.")]
    frames = [eventstream.event("messageStart", {"role": "assistant"})]
    if fake.exception_mid_stream is not None:
        name, fake.exception_mid_stream = fake.exception_mid_stream, None
        first = {"contentBlockIndex": 0, "delta": {"text": REPLY_PIECES[0]}}
        return [
            *frames,
            eventstream.event("contentBlockDelta", first),
            eventstream.exception(name, "The model stream failed; retry your request."),
        ]
    if tool is None:
        frames += [
            eventstream.event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": t}})
            for t in (*REPLY_PIECES, *(["."] * fake.stream_events))
        ]
    else:
        frames.append(
            eventstream.event(
                "contentBlockStart",
                {
                    "contentBlockIndex": 0,
                    "start": {"toolUse": {"toolUseId": TOOL_USE_ID, "name": tool}},
                },
            )
        )
        arguments = json.dumps(TOOL_INPUT)
        for piece in (arguments[:6], arguments[6:]):
            frames.append(
                eventstream.event(
                    "contentBlockDelta",
                    {"contentBlockIndex": 0, "delta": {"toolUse": {"input": piece}}},
                )
            )
    frames.append(eventstream.event("contentBlockStop", {"contentBlockIndex": 0}))
    frames.append(eventstream.event("messageStop", {"stopReason": stop}))
    frames.append(
        eventstream.event("metadata", {"usage": fake.usage(), "metrics": {"latencyMs": 99}})
    )
    return frames


def _sts_answer(key_id: str, secret: str, token: str, expiration: datetime) -> str:
    stamp = expiration.strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"""<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleWithWebIdentityResult>
    <Credentials>
      <AccessKeyId>{key_id}</AccessKeyId>
      <SecretAccessKey>{secret}</SecretAccessKey>
      <SessionToken>{token}</SessionToken>
      <Expiration>{stamp}</Expiration>
    </Credentials>
    <SubjectFromWebIdentityToken>system:serviceaccount:vkgate:proxy</SubjectFromWebIdentityToken>
    <AssumedRoleUser>
      <Arn>arn:aws:sts::123456789012:assumed-role/vkgate-proxy/session</Arn>
      <AssumedRoleId>AROAFAKE:session</AssumedRoleId>
    </AssumedRoleUser>
  </AssumeRoleWithWebIdentityResult>
  <ResponseMetadata><RequestId>{secrets.token_hex(16)}</RequestId></ResponseMetadata>
</AssumeRoleWithWebIdentityResponse>"""


def _sts_error(code: str, message: str) -> str:
    return f"""<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <Error><Type>Sender</Type><Code>{code}</Code><Message>{message}</Message></Error>
  <RequestId>{secrets.token_hex(16)}</RequestId>
</ErrorResponse>"""


def embedding_floats(encoded: str) -> list[float]:
    raw = base64.b64decode(encoded)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


@asynccontextmanager
async def serve_fake_bedrock() -> AsyncIterator[FakeBedrock]:
    fake = FakeBedrock()
    async with serving(_app(fake)) as origin:
        fake.url = origin
        yield fake

"""A fake Google Gemini API (AI Studio and Vertex AI) and a fake OAuth token endpoint: real HTTP on
loopback, real wire formats.

AI Studio: `/v1beta/models/{model}:{method}` with the API key in `x-goog-api-key`. Vertex AI:
`/v1/projects/{project}/locations/{location}/publishers/google/models/{model}:{method}` with an
OAuth bearer token, which only the token endpoint (`POST /token`, a service account's JWT
grant, its signature checked with the account's public key) issues. Methods: generateContent,
streamGenerateContent (`alt=sse`, `data:` events ended by CRLF CRLF as Google sends them),
countTokens, embedContent, batchEmbedContents. Answers carry `usageMetadata` (settable), a
`functionCall` when the request offers tools and no function response came back yet; a
prompt can be blocked, or an answer stopped, by the "safety filters". Errors are Google's
`{"error": {"code", "message", "status"}}`.
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import jwt
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.support.fake_openai import FakeProvider, serving

API_KEY = "AIzaFakeGeminiUpstreamKey0123456789abc"
PROJECT = "vkgate-test-project"
LOCATION = "us-central1"
REPLY = "Hi there! I am the fake Gemini upstream."
REPLY_PIECES = ("Hi", " there!", " I am the fake Gemini upstream.")
TOOL_ARGS = {"city": "Paris"}
THOUGHT_SIGNATURE = base64.b64encode(b"\xfb\xff\xfe fake thought signature").decode()
"""Valid base64 with `+`, `/` and padding in it, as Gemini's signatures are."""
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"
STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}
_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
PRIVATE_KEY_PEM = _KEY.private_bytes(
    serialization.Encoding.PEM,
    serialization.PrivateFormat.PKCS8,
    serialization.NoEncryption(),
).decode()
CLIENT_EMAIL = "vkgate-proxy@vkgate-test-project.iam.gserviceaccount.com"


@dataclass
class FakeGemini(FakeProvider):
    url: str = ""
    """The server's root: AI Studio's base URL, Vertex AI's too."""
    api_key: str = API_KEY
    tokens: dict[str, bool] = field(default_factory=dict)
    """Access tokens issued → still valid."""
    token_lifetime_s: int = 3600
    grants: int = 0
    """JWT grants the token endpoint honoured."""
    prompt_tokens: int = 12
    candidates_tokens: int = 9
    thoughts_tokens: int = 0
    cached_tokens: int = 0
    block_prompt: str | None = None
    """The next request's prompt is blocked for this reason (`SAFETY`)."""
    stop_for: str | None = None
    """The next answer stops for this reason (`SAFETY`) after its first words."""
    sign_calls: bool = True
    """Function calls carry a thought signature, as Gemini 3 models sign them."""

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        return {
            "error": {"code": status, "message": message, "status": STATUSES.get(status, "UNKNOWN")}
        }

    def usage(self) -> dict[str, int]:
        usage = {
            "promptTokenCount": self.prompt_tokens,
            "candidatesTokenCount": self.candidates_tokens,
            "totalTokenCount": self.prompt_tokens + self.candidates_tokens + self.thoughts_tokens,
        }
        if self.thoughts_tokens:
            usage["thoughtsTokenCount"] = self.thoughts_tokens
        if self.cached_tokens:
            usage["cachedContentTokenCount"] = self.cached_tokens
        return usage

    def service_account(self) -> dict[str, str]:
        """A service account's JSON key whose token endpoint is this fake."""
        return {
            "type": "service_account",
            "project_id": PROJECT,
            "private_key_id": "fakekey0001",
            "private_key": PRIVATE_KEY_PEM,
            "client_email": CLIENT_EMAIL,
            "client_id": "100000000000000000001",
            "token_uri": f"{self.url}/token",
        }

    def expire_tokens(self, *, but_the_last: bool = False) -> None:
        """Every token issued so far (or every one but the last) stops working, as at its
        expiry."""
        issued = list(self.tokens)
        for token in issued[:-1] if but_the_last else issued:
            self.tokens[token] = False


def _refusal(fake: FakeGemini, status: int, message: str) -> web.Response:
    return web.json_response(fake.error_body(status, message), status=status)


def _function_to_call(payload: dict[str, Any]) -> str | None:
    declarations = [
        d for tool in payload.get("tools", []) for d in tool.get("functionDeclarations", [])
    ]
    if not declarations:
        return None
    mode = (payload.get("toolConfig") or {}).get("functionCallingConfig") or {}
    if mode.get("mode") == "NONE":
        return None
    last = payload["contents"][-1]
    if any("functionResponse" in part for part in last.get("parts", [])):
        return None
    allowed = mode.get("allowedFunctionNames")
    return str(allowed[0] if allowed else declarations[0]["name"])


def _invalid(payload: Any) -> str | None:
    if not isinstance(payload, dict) or not isinstance(payload.get("contents"), list):
        return "* GenerateContentRequest.contents: contents is not specified"
    for content in payload["contents"]:
        if content.get("role") not in ("user", "model"):
            return "Please use a valid role: user, model."
        if not content.get("parts"):
            return "* GenerateContentRequest.contents.parts: contents.parts must not be empty."
    unknown = set(payload) - {
        "contents",
        "systemInstruction",
        "generationConfig",
        "tools",
        "toolConfig",
        "safetySettings",
        "cachedContent",
    }
    if unknown:
        return f'Invalid JSON payload received. Unknown name "{sorted(unknown)[0]}": Cannot find field.'
    return None


def _sse(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\r\n\r\n"


def _app(fake: FakeGemini) -> web.Application:
    def gate(request: web.Request, vertex: bool) -> web.Response | None:
        if vertex:
            header = request.headers.get("Authorization", "")
            token = header.removeprefix("Bearer ")
            if not header.startswith("Bearer ") or not fake.tokens.get(token):
                return _refusal(
                    fake,
                    401,
                    "Request had invalid authentication credentials. Expected OAuth 2 access "
                    "token, login cookie or other valid authentication credential.",
                )
        elif request.headers.get("x-goog-api-key") != fake.api_key:
            return _refusal(fake, 400, "API key not valid. Please pass a valid API key.")
        return fake.next_failure()

    async def method(request: web.Request) -> web.StreamResponse:
        body = await fake.admit(request)
        vertex = request.path.startswith("/v1/")
        refusal = gate(request, vertex)
        if refusal is not None:
            return refusal
        _, _, name = request.match_info["tail"].rpartition(":")
        try:
            payload = json.loads(body)
        except ValueError:
            return _refusal(fake, 400, "Invalid JSON payload received.")
        model = request.match_info["tail"].rpartition(":")[0]
        if name == "countTokens":
            contents = payload.get("contents") or payload.get("generateContentRequest", {}).get(
                "contents", []
            )
            words = sum(
                len(p.get("text", "").split()) for c in contents for p in c.get("parts", [])
            )
            return web.json_response({"totalTokens": words})
        if name == "embedContent":
            return web.json_response({"embedding": {"values": _vector(payload)}})
        if name == "batchEmbedContents":
            requests = payload.get("requests", [])
            for one in requests:
                if vertex and "model" in one:
                    return _refusal(fake, 400, 'Unknown name "model" at requests[0]')
                if not vertex and one.get("model") != f"models/{model}":
                    return _refusal(
                        fake, 400, "* BatchEmbedContentsRequest.model: unexpected model name format"
                    )
            return web.json_response({"embeddings": [{"values": _vector(one)} for one in requests]})
        if name not in ("generateContent", "streamGenerateContent"):
            return _refusal(fake, 404, f"method {name} not found")
        problem = _invalid(payload)
        if problem is not None:
            return _refusal(fake, 400, problem)
        stream = name == "streamGenerateContent"
        if stream and request.query.get("alt") != "sse":
            return _refusal(fake, 400, "this fake streams only with alt=sse")
        return await _generate(fake, request, payload, model, stream)

    async def token(request: web.Request) -> web.Response:
        form = await request.post()
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        try:
            claims = jwt.decode(
                str(form.get("assertion")),
                _KEY.public_key(),
                algorithms=["RS256"],
                # Google's token endpoint is the audience, whichever URL the grant is posted to.
                audience=GOOGLE_TOKEN_AUDIENCE,
            )
        except jwt.PyJWTError as exc:
            return web.json_response(
                {"error": "invalid_grant", "error_description": str(exc)}, status=400
            )
        if claims.get("iss") != CLIENT_EMAIL or SCOPE not in str(claims.get("scope", "")).split():
            return web.json_response({"error": "invalid_scope"}, status=400)
        fake.grants += 1
        issued = "ya29.fake-" + secrets.token_urlsafe(24)
        fake.tokens[issued] = True
        return web.json_response(
            {"access_token": issued, "expires_in": fake.token_lifetime_s, "token_type": "Bearer"}
        )

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1beta/models/{tail:.+}", method)
    app.router.add_post(
        f"/v1/projects/{PROJECT}/locations/{LOCATION}/publishers/google/models/{{tail:.+}}", method
    )
    app.router.add_post("/token", token)
    return app


def _vector(request: dict[str, Any]) -> list[float]:
    text = "".join(p.get("text", "") for p in request.get("content", {}).get("parts", []))
    seed = sum(text.encode()) % 89
    size = request.get("outputDimensionality", 3)
    return [round(0.02 * (seed + i), 4) for i in range(size)]


async def _generate(
    fake: FakeGemini, request: web.Request, payload: dict[str, Any], model: str, stream: bool
) -> web.StreamResponse:
    response_id = "fakeResp" + secrets.token_hex(6)
    base = {"modelVersion": f"{model}-001", "responseId": response_id}
    if fake.block_prompt is not None:
        reason, fake.block_prompt = fake.block_prompt, None
        blocked = {
            **base,
            "promptFeedback": {"blockReason": reason},
            "usageMetadata": {
                "promptTokenCount": fake.prompt_tokens,
                "totalTokenCount": fake.prompt_tokens,
            },
        }
        if stream:
            return await fake.stream(request, "text/event-stream", [_sse(blocked)])
        return web.json_response(blocked)
    function = _function_to_call(payload)
    stop_for, fake.stop_for = fake.stop_for, None
    if function is not None:
        part: dict[str, Any] = {"functionCall": {"name": function, "args": TOOL_ARGS}}
        if fake.sign_calls:
            part["thoughtSignature"] = THOUGHT_SIGNATURE
        pieces: list[list[dict[str, Any]]] = [[part]]
    else:
        texts = REPLY_PIECES[:1] if stop_for else (*REPLY_PIECES, *(["."] * fake.stream_events))
        pieces = [[{"text": text}] for text in texts]
    if fake.thoughts_tokens:
        pieces.insert(0, [{"text": "Let me think.", "thought": True}])
    finish = stop_for or "STOP"
    if not stream:
        parts = [p for group in pieces for p in group]
        merged: list[dict[str, Any]] = []
        for p in parts:  # Google joins a plain answer's text into one part
            if (
                "text" in p
                and merged
                and "text" in merged[-1]
                and not p.get("thought")
                and not merged[-1].get("thought")
            ):
                merged[-1] = {"text": merged[-1]["text"] + p["text"]}
            else:
                merged.append(p)
        return web.json_response(
            {
                **base,
                "candidates": [
                    {
                        "content": {"role": "model", "parts": merged},
                        "finishReason": finish,
                        "index": 0,
                    }
                ],
                "usageMetadata": fake.usage(),
            }
        )
    events = []
    for n, group in enumerate(pieces):
        last = n == len(pieces) - 1
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": group}, "index": 0}
        if last:
            candidate["finishReason"] = finish
        usage = (
            fake.usage()
            if last
            else {"promptTokenCount": fake.prompt_tokens, "totalTokenCount": fake.prompt_tokens}
        )
        events.append(_sse({**base, "candidates": [candidate], "usageMetadata": usage}))
    return await fake.stream(request, "text/event-stream", events)


@asynccontextmanager
async def serve_fake_gemini() -> AsyncIterator[FakeGemini]:
    fake = FakeGemini()
    async with serving(_app(fake)) as origin:
        fake.url = origin
        yield fake

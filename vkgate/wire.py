"""Wire types of the internal API (`/api/internal/gateway/`), imported by both services.

The control plane encodes these; the proxy decodes them into its runtime objects. Fields are
only ever added with defaults, so an older proxy keeps decoding a newer control plane's answer.
"""

from __future__ import annotations

import re
from enum import StrEnum

import msgspec

INTERNAL_PREFIX = "/api/internal/gateway"
CHANGES_DEFAULT_TIMEOUT_S = 10.0
CHANGES_MAX_TIMEOUT_S = 25.0
CHANGES_MAX_EVENTS = 500
REVISION_HEADER = "X-Vkgate-Revision"
VERSION_HEADER = "X-Vkgate-Version"
"""The sender's release, on every internal call and every answer to one: the proxy and the
control plane tell each other what they run (vkgate/versions.py says what works together)."""


class EventKind(StrEnum):
    VK_CREATED = "VK_CREATED"
    VK_CONFIG_UPDATED = "VK_CONFIG_UPDATED"
    VK_ROTATED = "VK_ROTATED"
    VK_REVOKED = "VK_REVOKED"
    VK_DISABLED = "VK_DISABLED"
    VK_ENABLED = "VK_ENABLED"
    BUDGET_CREATED = "BUDGET_CREATED"
    BUDGET_UPDATED = "BUDGET_UPDATED"
    BUDGET_DELETED = "BUDGET_DELETED"
    MODEL_PROVIDER_UPDATED = "MODEL_PROVIDER_UPDATED"
    ROUTING_POLICY_UPDATED = "ROUTING_POLICY_UPDATED"
    ROUTING_POLICY_DELETED = "ROUTING_POLICY_DELETED"
    CACHE_RULE_CREATED = "CACHE_RULE_CREATED"
    CACHE_RULE_UPDATED = "CACHE_RULE_UPDATED"
    CACHE_RULE_DELETED = "CACHE_RULE_DELETED"


class ResolveKeyRequest(msgspec.Struct, forbid_unknown_fields=True):
    key_sha256: str


class ResolveKeyResponse(msgspec.Struct):
    jwt: str
    vk_id: str
    organization_id: str
    revision: int
    expires_at: str
    """When the JWT (and so this resolution) expires, RFC 3339."""
    key_expires_at: str | None = None
    """When the presented key stops working (its expiry or rotation grace), if ever."""
    bundle: ConfigBundle | None = None
    """The key's bundle as `config` would send it, read in the same transaction, so a proxy
    need not ask `config` after resolving a key. None when the ledger could not give its
    budgets' spend (`config` then says why), and from a control plane older than the field."""
    etag: str | None = None
    """`bundle`'s ETag, the one `config` gives it."""


class Limits(msgspec.Struct, omit_defaults=True):
    """Rate limits of a key or a team; None is no limit."""

    rpm: int | None = None
    """Requests per minute (a token bucket of this capacity refilled over 60 s)."""
    tpm: int | None = None
    """Tokens (input + output) per minute."""
    rpd: int | None = None
    """Requests per day (refilled over 86,400 s)."""
    max_concurrency: int | None = None
    """Requests in flight at once."""


class Price(msgspec.Struct, omit_defaults=True):
    """USD per million tokens, as decimal strings."""

    input_per_mtok: str
    output_per_mtok: str
    cache_read_per_mtok: str | None = None
    cache_write_per_mtok: str | None = None


class UnitPrice(msgspec.Struct, omit_defaults=True):
    """What a model costs in the units other than text tokens, as decimal USD strings: audio
    and image tokens (per million; left out, the text rate), characters made into speech and
    seconds of audio transcribed (each), and images by `size/quality` (each)."""

    input_audio_per_mtok: str | None = None
    output_audio_per_mtok: str | None = None
    input_image_per_mtok: str | None = None
    output_image_per_mtok: str | None = None
    per_character: str | None = None
    per_second: str | None = None
    per_image: dict[str, str] = {}
    """`size/quality` (`1024x1024/hd`), `size`, `*/quality` or `*` → USD per image."""


_LINE_BREAK = re.compile(r"[\r\n\x00]")


def header_safe(value: str) -> bool:
    """Whether `value` can go in an HTTP header as it is: no CR, LF or NUL, which would end the
    header (or the head) early. The control plane refuses a credential that is not; a proxy
    leaves one it was given anyway out of its chain."""
    return _LINE_BREAK.search(value) is None


class ChainTarget(msgspec.Struct):
    provider_id: str
    provider_name: str
    kind: str
    base_url: str | None
    model: str
    api_key: str | None = None
    api_version: str | None = None
    headers: dict[str, str] = {}
    price: Price | None = None
    """What a million tokens of `model` cost through this provider: its override, else
    genai-prices' current price; None when neither knows the model (or a `mock` provider)."""
    max_output_tokens: int | None = None
    """The most tokens one answer of `model` can hold, when known: a budget reserves this much
    output for a request that names no `max_tokens`."""
    unit_price: UnitPrice | None = None
    """Its prices in other units than text tokens (override, else genai-prices); None when it
    has none. A model priced by them alone has no `price`."""
    responses_api: bool = True
    """An OpenAI-format provider serves the Responses API itself; when false the proxy
    translates `/v1/responses` to chat completions for it. Ignored for the other kinds."""
    settings: dict[str, str] = {}
    """A cloud kind's own fields: `region` (bedrock), `project` and `location` (vertex_ai)."""
    credentials: dict[str, str] = {}
    """A cloud kind's stored credential, decrypted: `aws_access_key_id`,
    `aws_secret_access_key` and `aws_session_token` (bedrock), `service_account_json`
    (vertex_ai). Empty: the proxy uses its workload's own credentials."""


class BudgetState(msgspec.Struct):
    budget_id: str
    name: str | None
    scope_kind: str
    scope_id: str | None
    window: str
    limit_usd: str
    on_breach: str
    provider_id: str | None = None
    spent_usd: str = "0"
    window_start: str | None = None
    window_end: str | None = None
    spent_as_of: str | None = None
    """When `spent_usd` was read from the ledger (RFC 3339): spend the ledger took after this
    is not in it."""
    spent_from: str = "ledger"
    """`ledger`: read for this bundle; `last_reading`: the ledger could not be read, and this
    is the last figure the control plane read of it, as of `spent_as_of`."""


class CacheRuleState(msgspec.Struct):
    """A response-cache rule that applies to a key: its requests for an alias matching one of
    `models` (globs) are answered from the cache for `ttl_seconds`. Only enabled rules whose
    scope covers the key are sent."""

    rule_id: str
    scope_kind: str
    """`organization`, `team`, `project` or `virtual_key`."""
    scope_id: str
    models: list[str]
    ttl_seconds: int


class ConfigBundle(msgspec.Struct):
    vk_id: str
    organization_id: str
    project_id: str
    team_id: str | None
    status: str
    revision: int
    limits: Limits
    allowed_models: list[str] | None
    aliases: dict[str, list[ChainTarget]]
    budgets: list[BudgetState]
    expires_at: str | None = None
    metadata: dict[str, str] = {}
    team_limits: Limits = msgspec.field(default_factory=Limits)
    """The rate limits of the key's team, shared by every key of the team's projects."""
    cache_rules: list[CacheRuleState] = []
    """The response-cache rules that cover the key (none: nothing is cached for it)."""


SPEND_MOVED = "budget_spend"
"""The `entity_kind` of a `BUDGET_UPDATED` that says only that the ledger's spend under the
budget moved (a segment was ingested); an edit of the budget itself says `budget`. A proxy
older than this treats both alike."""


class ChangeEvent(msgspec.Struct):
    revision: int
    kind: str
    """An `EventKind`; plain text on the wire so a proxy older than its control plane still
    decodes a batch holding a kind it does not know yet."""
    organization_id: str
    entity_kind: str
    entity_id: str
    at: str
    vk_id: str | None = None


class ChangesResponse(msgspec.Struct):
    events: list[ChangeEvent]
    current_revision: int


class HealthResponse(msgspec.Struct):
    status: str
    revision: int
    time: str
    version: str
    database: str = "ok"


class ErrorDetail(msgspec.Struct, omit_defaults=False):
    message: str
    type: str
    code: str
    param: str | None = None


class ErrorBody(msgspec.Struct):
    error: ErrorDetail

"""Spend records and spool segments: what a proxy writes to disk and ships to the control plane.

A proxy appends one `SpendRecord` per line (JSON, `\\n`-terminated) to its open segment file;
a segment is shipped as a `SpendSegment` to `POST /api/internal/gateway/spend-commands`, and the
control plane answers a `SpendAck` once the records are in the ledger. Both services import
these types; fields are only ever added with defaults.

Token counts follow OpenAI's convention whatever the provider: `input_tokens` counts every
input token, cache reads and writes included; `reasoning_tokens` are part of `output_tokens`.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

SPEND_COMMANDS_PATH = "/spend-commands"
SEGMENT_ENCODING = "gzip"
"""The one content coding a segment may be shipped in (`Content-Encoding: gzip`), besides none.
The control plane names it in an `Accept-Encoding` header on its internal API's answers, its
refusals of a segment included (as RFC 7694 lets a server say which codings it takes in
requests). A proxy compresses only once an answer said so; a gzip segment refused by an
answer that does not say so (an older replica behind the same address) is sent again as it
is."""
BUDGET_BUCKET_SPEND_PATH = "/budget-bucket-spend"


class RecordKind(StrEnum):
    ADMIT = "admit"
    """Written when a request enters the pipeline, before anything can refuse it."""
    CONFIRM = "confirm"
    """The request was served: a provider answered 2xx (a stream may still have broken later)."""
    FAIL = "fail"
    """The request was refused by the gateway, or no provider served it."""


class UsageSource(StrEnum):
    PROVIDER = "provider"
    """Counts are what the provider reported."""
    ESTIMATED = "estimated"
    """The provider reported none; counts were estimated with a tokenizer."""
    NONE = "none"
    """No tokens were spent (a refusal) or nothing could be counted."""


class SpendRecord(msgspec.Struct, omit_defaults=True, kw_only=True, gc=False):
    """One event of a request's life, as a proxy spools it and the ledger stores it.

    Its fields are strings, numbers and None, so it can be part of no reference cycle: it is
    kept out of the garbage collector's sight (`gc=False`). A proxy makes two a request and a
    control plane decodes thousands a segment; each one tracked made every collection longer.
    """

    id: str
    """Unique per record (a UUID in hex): the ledger's idempotency key."""
    kind: str
    """A `RecordKind`."""
    replica_id: str
    seq: int
    """Per replica, from 1 and without gaps across restarts: a gap is a lost record."""
    request_id: str
    at: str
    """When the record was written, RFC 3339 UTC with microseconds."""
    route: str
    """The route asked for: `/v1/chat/completions`, `/v1/audio/speech`, …"""
    organization_id: str | None = None
    team_id: str | None = None
    project_id: str | None = None
    virtual_key_id: str | None = None
    end_user: str | None = None
    model: str | None = None
    """The alias the client asked for."""
    served_model: str | None = None
    """The model the provider says it served."""
    upstream_model: str | None = None
    """The model asked of the provider: the chain target's `model`, which provider price
    overrides are keyed by (`served_model` may be a dated snapshot of it)."""
    provider_id: str | None = None
    provider_kind: str | None = None
    status: int = 0
    """The HTTP status the client got (0 on an admit record)."""
    error_code: str | None = None
    refused: bool = False
    """A fail record for a request the gateway refused before paying any provider."""
    stream: bool = False
    cancelled: bool = False
    """The client went away before the answer ended; usage is what was seen until then."""
    attempts: int = 0
    """Provider calls made (a fallback adds one)."""
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    usage_source: str = UsageSource.NONE
    latency_ms: float = 0.0
    ttfb_ms: float | None = None
    # The units audio and image calls are priced in. Token counts by modality are parts of
    # `input_tokens` and `output_tokens`, as cache reads are.
    input_audio_tokens: int = 0
    output_audio_tokens: int = 0
    input_image_tokens: int = 0
    output_image_tokens: int = 0
    audio_seconds: float = 0.0
    """Seconds of audio transcribed or translated, to the millisecond."""
    input_characters: int = 0
    """Characters of text turned into speech."""
    images: int = 0
    """Images made (generated or edited)."""
    image_size: str | None = None
    """Their size (`1024x1024`), as the provider said or else as asked."""
    image_quality: str | None = None
    """Their quality (`hd`, `high`, …), as the provider said or else as asked."""
    cache_hit: bool = False
    """Answered from the response cache: no provider was called, and the record's tokens are
    0 (nothing was used); `saved_nano_usd` is what the answer cost when it was made."""
    saved_nano_usd: int = 0
    """On a cache hit, the price of the provider call it spared (nano-USD)."""


class SpendSegment(msgspec.Struct, kw_only=True):
    replica_id: str
    segment_id: str
    """Unique per replica and segment (the file's name); shipping it again changes nothing."""
    records: list[SpendRecord]


class SpendAck(msgspec.Struct, kw_only=True):
    segment_id: str
    accepted: int
    """Records written to the ledger by this call."""
    duplicates: int
    """Records already in the ledger (the segment, or part of it, was shipped before)."""


class BudgetBucketSpend(msgspec.Struct, kw_only=True):
    """`GET budget-bucket-spend?budget_id=&end_user=`: one end user's bucket of a per-end-user
    budget (an `end_user` budget without a scope id), in the budget's current window."""

    budget_id: str
    end_user: str
    spent_usd: str
    """Decimal USD, from the ledger."""
    window_start: str | None = None
    """RFC 3339; none for a `total` budget."""
    as_of: str | None = None
    """When `spent_usd` was read from the ledger (RFC 3339)."""
    window_end: str | None = None

-- The spend ledger: one row per outcome (confirm or fail) record, priced.
--
-- Idempotency: the control plane inserts only record ids not already present, and the
-- ReplacingMergeTree collapses any duplicate that a race still lets through (two control
-- planes ingesting one segment at once): a record's sorting key (organization, time, id) is
-- fixed by the record itself, so every copy of it collapses into one row. Every read of this
-- table uses FINAL, so a duplicate not yet merged is never counted twice.
--
-- Rows of requests refused before their key was known carry organization_id ''.
-- Every statement here must be safe to run twice: a file that fails half-way is run again.
CREATE TABLE IF NOT EXISTS ledger_rows
(
    id String,
    kind LowCardinality(String),
    replica_id String,
    seq UInt64,
    segment_id String,
    request_id String,
    at DateTime64(6, 'UTC'),
    route LowCardinality(String),
    organization_id String,
    team_id Nullable(String),
    project_id Nullable(String),
    virtual_key_id Nullable(String),
    end_user Nullable(String),
    model Nullable(String),
    upstream_model Nullable(String),
    served_model Nullable(String),
    provider_id Nullable(String),
    provider_kind LowCardinality(Nullable(String)),
    status UInt16,
    error_code LowCardinality(Nullable(String)),
    refused Bool,
    stream Bool,
    cancelled Bool,
    attempts UInt32,
    input_tokens UInt64,
    output_tokens UInt64,
    cache_read_tokens UInt64,
    cache_write_tokens UInt64,
    reasoning_tokens UInt64,
    usage_source LowCardinality(String),
    latency_ms Float64,
    ttfb_ms Nullable(Float64),
    cost_nano_usd Int64,
    price_source LowCardinality(String),
    price_version LowCardinality(String),
    ingested_at DateTime64(6, 'UTC')
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(at)
ORDER BY (organization_id, at, id);

-- Admit records, apart from their outcomes: an admit whose request has no outcome row names a
-- request its proxy never finished (a killed process), and gaps in (replica_id, seq) name
-- records that were lost. Admits are written before the key is known, so they are keyed by
-- time and replica, not by organization.
CREATE TABLE IF NOT EXISTS ledger_admits
(
    id String,
    replica_id String,
    seq UInt64,
    segment_id String,
    request_id String,
    at DateTime64(6, 'UTC'),
    route LowCardinality(String),
    organization_id String,
    virtual_key_id Nullable(String),
    model Nullable(String),
    end_user Nullable(String),
    ingested_at DateTime64(6, 'UTC')
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(at)
ORDER BY (at, replica_id, id);

-- The web console's overview by day: each organization's served requests, refusals, failures
-- and cost per UTC day, by key and by model (one row per organization, day, dimension and
-- value), so that the overview reads a few rows a key and a model instead of every ledger row
-- of the month merged with FINAL (bench/console.py measured 775 ms a read of the overview over
-- a million rows of a month that way; a count of them with FINAL alone took 185 ms).
--
-- As the budgets' daily sums (0002_spend_daily.sql): a SummingMergeTree, read with sum()
-- and without FINAL; the rows ingested from `since` on (a minute after this file first ran)
-- are summed here, those ingested before are read from the ledger itself; a duplicate row a
-- race let through is summed twice here, where the reports' FINAL reads count it once. The
-- console's Spend page and CSV are the report itself and never read these sums.
--
-- Every statement here must be safe to run twice.
CREATE TABLE IF NOT EXISTS ledger_usage_daily_since
(
    since DateTime64(6, 'UTC')
)
ENGINE = MergeTree
ORDER BY tuple();

INSERT INTO ledger_usage_daily_since
SELECT now64(6, 'UTC') + toIntervalSecond(60)
WHERE (SELECT count() FROM ledger_usage_daily_since) = 0;

CREATE TABLE IF NOT EXISTS ledger_usage_daily
(
    organization_id String,
    day Date,
    dimension LowCardinality(String),
    value String,
    requests UInt64,
    refused UInt64,
    failed UInt64,
    cost_nano_usd Int64
)
ENGINE = SummingMergeTree((requests, refused, failed, cost_nano_usd))
PARTITION BY toYYYYMM(day)
ORDER BY (organization_id, day, dimension, value);

-- The sums are aliased apart from the columns inside (an alias `refused` would stand for the
-- aggregate in the other sums too), and renamed to the table's columns outside.
CREATE MATERIALIZED VIEW IF NOT EXISTS ledger_usage_daily_view TO ledger_usage_daily AS
SELECT
    organization_id,
    day,
    dimension,
    value,
    n_requests AS requests,
    n_refused AS refused,
    n_failed AS failed,
    n_cost AS cost_nano_usd
FROM
(
    SELECT
        organization_id,
        toDate(at, 'UTC') AS day,
        pair.1 AS dimension,
        pair.2 AS value,
        countIf(kind = 'confirm') AS n_requests,
        countIf(kind = 'fail' AND refused) AS n_refused,
        countIf(kind = 'fail' AND NOT refused) AS n_failed,
        sum(cost_nano_usd) AS n_cost
    FROM ledger_rows
    ARRAY JOIN [('virtual_key', ifNull(virtual_key_id, '')), ('model', ifNull(model, ''))] AS pair
    WHERE ingested_at >= (SELECT min(since) FROM ledger_usage_daily_since)
    GROUP BY organization_id, day, dimension, value
)

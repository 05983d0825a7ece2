-- Budgets' spend by day: what each budget's window has cost, read from a few rows a day
-- instead of every ledger row of the window merged with FINAL (which grew with the month:
-- bench/budget_spend_read.py measured 62 ms a read at a million rows, 292 ms at three
-- million, and a read follows every segment that moves a budget).
--
-- One row per organization, UTC day and scope a budget can name (team, project, key, end user,
-- provider; '' for none), summed as rows arrive: a SummingMergeTree's parts add up to the
-- right total with or without their merge, so a read sums without FINAL. Sums of nothing
-- are left out. A duplicate ledger row that a race let through (two control planes
-- ingesting one segment at once) is summed twice here, where the ledger's FINAL reads count it
-- once: a budget may then count more than was spent, never less.
--
-- The sums hold the rows ingested from `since` on: a minute after this file first ran, so
-- that no insert already under way when the view was made (one that would never reach it)
-- carries a later `ingested_at`, whatever the skew of a control plane's clock within that
-- minute. Budgets read what was ingested before `since` from the ledger itself (FINAL), a
-- part that stops growing once `since` has passed: see controlplane/ledger/queries.py.
--
-- Every statement here must be safe to run twice: a file that fails half-way is run again,
-- and two control planes starting at once may both run it (both then read the earlier
-- `since`, still in the future then).
CREATE TABLE IF NOT EXISTS ledger_spend_daily_since
(
    since DateTime64(6, 'UTC')
)
ENGINE = MergeTree
ORDER BY tuple();

INSERT INTO ledger_spend_daily_since
SELECT now64(6, 'UTC') + toIntervalSecond(60)
WHERE (SELECT count() FROM ledger_spend_daily_since) = 0;

CREATE TABLE IF NOT EXISTS ledger_spend_daily
(
    organization_id String,
    day Date,
    provider_id String,
    team_id String,
    project_id String,
    virtual_key_id String,
    end_user String,
    cost_nano_usd Int64
)
ENGINE = SummingMergeTree(cost_nano_usd)
PARTITION BY toYYYYMM(day)
ORDER BY (organization_id, day, provider_id, team_id, project_id, virtual_key_id, end_user);

CREATE MATERIALIZED VIEW IF NOT EXISTS ledger_spend_daily_view TO ledger_spend_daily AS
SELECT
    organization_id,
    toDate(at, 'UTC') AS day,
    ifNull(provider_id, '') AS provider_id,
    ifNull(team_id, '') AS team_id,
    ifNull(project_id, '') AS project_id,
    ifNull(virtual_key_id, '') AS virtual_key_id,
    ifNull(end_user, '') AS end_user,
    sum(cost_nano_usd) AS cost_nano_usd
FROM ledger_rows
WHERE ingested_at >= (SELECT min(since) FROM ledger_spend_daily_since)
GROUP BY organization_id, day, provider_id, team_id, project_id, virtual_key_id, end_user
HAVING cost_nano_usd != 0;

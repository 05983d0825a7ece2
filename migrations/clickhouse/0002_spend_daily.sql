-- Budgets' spend by day: what each budget's window has cost, read from a few rows a day
-- instead of every ledger row of the window merged with FINAL (which grew with the month:
-- 124 ms a read at a million rows, 260 ms at three million, and a read follows every segment
-- that moves a budget).
--
-- One row per organization, UTC day and scope a budget can name (team, project, key, end user,
-- provider; '' for none), summed as rows arrive: a SummingMergeTree's parts add up to the
-- right total with or without their merge, so a read sums without FINAL. Sums of nothing
-- are left out. A duplicate ledger row that a race let through (two control planes
-- ingesting one segment at once) is summed twice here, where the ledger's FINAL reads count it
-- once: a budget may then count more than was spent, never less.
--
-- Every statement here must be safe to run twice: a file that fails half-way is run again,
-- and two control planes starting at once may both run it.
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

-- Every ledger row inserted from now on.
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
GROUP BY organization_id, day, provider_id, team_id, project_id, virtual_key_id, end_user
HAVING cost_nano_usd != 0;

-- The rows the ledger held before the view: summed once from the ledger as it stood (FINAL),
-- up to the second after the view was made (a row ingested in that second may be counted by
-- both: more, never less). A ReplacingMergeTree read with FINAL, so running this again, or
-- twice at once, writes the same rows again and they collapse.
CREATE TABLE IF NOT EXISTS ledger_spend_daily_before
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
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(day)
ORDER BY (organization_id, day, provider_id, team_id, project_id, virtual_key_id, end_user);

INSERT INTO ledger_spend_daily_before
SELECT
    organization_id,
    toDate(at, 'UTC') AS day,
    ifNull(provider_id, '') AS provider_id,
    ifNull(team_id, '') AS team_id,
    ifNull(project_id, '') AS project_id,
    ifNull(virtual_key_id, '') AS virtual_key_id,
    ifNull(end_user, '') AS end_user,
    sum(cost_nano_usd) AS cost_nano_usd
FROM ledger_rows FINAL
WHERE ingested_at < (
    SELECT max(metadata_modification_time) + 1
    FROM system.tables
    WHERE database = currentDatabase() AND name = 'ledger_spend_daily_view'
)
GROUP BY organization_id, day, provider_id, team_id, project_id, virtual_key_id, end_user
HAVING cost_nano_usd != 0;

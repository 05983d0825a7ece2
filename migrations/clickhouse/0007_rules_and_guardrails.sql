-- What the gateway's own checks did to a request: the routing policy rule that refused it
-- (`policy_violation`), and the outcome of each guardrail that applied, by the guardrail's
-- name (`passed`, `blocked`, `redacted`, `warned`, `skipped`). Names only: never the text a
-- check matched. Rows written before this carry NULL and an empty map.
--
-- Every statement here must be safe to run twice: a file that fails half-way is run again.
ALTER TABLE ledger_rows ADD COLUMN IF NOT EXISTS policy_rule LowCardinality(Nullable(String));
ALTER TABLE ledger_rows ADD COLUMN IF NOT EXISTS guardrails Map(LowCardinality(String), LowCardinality(String));

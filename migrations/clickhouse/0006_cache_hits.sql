-- Response-cache hits: a row answered from the gateway's cache says so (cache_hit), with the
-- price of the provider call it spared (saved_nano_usd). Such a row has no tokens and costs 0.
-- Rows written before this carry 0.
--
-- Every statement here must be safe to run twice: a file that fails half-way is run again.
ALTER TABLE ledger_rows ADD COLUMN IF NOT EXISTS cache_hit Bool DEFAULT false;
ALTER TABLE ledger_rows ADD COLUMN IF NOT EXISTS saved_nano_usd Int64 DEFAULT 0;

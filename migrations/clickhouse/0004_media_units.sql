-- The units audio and image calls are priced in, beside the token counts: tokens by modality
-- (parts of input_tokens and output_tokens, as cache reads are), seconds of audio transcribed
-- (to the millisecond), characters made into speech, and images made with their size and
-- quality. Rows written before this carry 0 and NULL.
--
-- audio_seconds is a decimal, so sums of it are exact; the control plane writes it rounded to
-- the millisecond.
--
-- Every statement here must be safe to run twice: a file that fails half-way is run again.
ALTER TABLE ledger_rows ADD COLUMN IF NOT EXISTS input_audio_tokens UInt64 DEFAULT 0;
ALTER TABLE ledger_rows ADD COLUMN IF NOT EXISTS output_audio_tokens UInt64 DEFAULT 0;
ALTER TABLE ledger_rows ADD COLUMN IF NOT EXISTS input_image_tokens UInt64 DEFAULT 0;
ALTER TABLE ledger_rows ADD COLUMN IF NOT EXISTS output_image_tokens UInt64 DEFAULT 0;
ALTER TABLE ledger_rows ADD COLUMN IF NOT EXISTS audio_seconds Decimal(18, 3) DEFAULT 0;
ALTER TABLE ledger_rows ADD COLUMN IF NOT EXISTS input_characters UInt64 DEFAULT 0;
ALTER TABLE ledger_rows ADD COLUMN IF NOT EXISTS images UInt32 DEFAULT 0;
ALTER TABLE ledger_rows ADD COLUMN IF NOT EXISTS image_size LowCardinality(Nullable(String));
ALTER TABLE ledger_rows ADD COLUMN IF NOT EXISTS image_quality LowCardinality(Nullable(String));

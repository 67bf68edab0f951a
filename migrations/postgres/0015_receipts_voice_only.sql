-- A receipt from an unsigned callback (unsigned voice, allowed only outside production)
-- may only match a message sent by voice, pending or not. Keep in step with
-- migrations/sqlite/0015_receipts_voice_only.sql.
ALTER TABLE receipts ADD COLUMN voice_only BOOLEAN NOT NULL DEFAULT false;

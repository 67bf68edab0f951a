-- Indexes a delivery writes fewer entries in. Keep in step with
-- migrations/sqlite/0013_delivery_indexes.sql.

-- Receipts find their message by the provider's id alone; the provider is checked on
-- the row. With `provider` in no index, the update that starts an attempt (it sets the
-- provider, and the lease) changes no indexed column: with room left on the page it
-- is a heap-only update, which writes no index entry.
DROP INDEX IF EXISTS messages_provider_message;
CREATE INDEX messages_provider_message_id ON messages (provider_message_id);

-- Only pending receipts are looked up by their provider id (when a step records it).
-- A receipt is stored in its final state, so most are never pending and get no entry.
DROP INDEX IF EXISTS receipts_provider_message;
CREATE INDEX receipts_pending ON receipts (provider, provider_message_id) WHERE state = 'pending';

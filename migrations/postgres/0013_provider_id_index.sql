-- Receipts find their message by the provider's id alone; the provider is checked on
-- the row. With `provider` in no index, the update that starts an attempt (it sets the
-- provider, and the lease) changes no indexed column: with room left on the page it
-- is a heap-only update, which writes no index entry. Keep in step with
-- migrations/sqlite/0013_provider_id_index.sql.
DROP INDEX IF EXISTS messages_provider_message;
CREATE INDEX messages_provider_message_id ON messages (provider_message_id);

-- Receipts find their message by the provider's id alone; the provider is checked on
-- the row. The update that starts an attempt sets the provider: with `provider` in no
-- index, it rewrites no index entry. Keep in step with
-- migrations/postgres/0013_provider_id_index.sql.
DROP INDEX IF EXISTS messages_provider_message;
CREATE INDEX messages_provider_message_id ON messages (provider_message_id);

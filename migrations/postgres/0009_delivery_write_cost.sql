-- What a delivery writes, made cheaper (measured with pg_stat_statements under the
-- delivery benchmark).
--
-- Timeline and attempt rows are written only by statements that update or lock their
-- message's row in the same transaction, and messages are never deleted, so their
-- foreign keys only cost a `FOR KEY SHARE` lookup of the message per row written.
ALTER TABLE delivery_attempts DROP CONSTRAINT IF EXISTS delivery_attempts_event_id_fkey;
ALTER TABLE message_events DROP CONSTRAINT IF EXISTS message_events_event_id_fkey;

-- A claim's lease update changes no indexed column: with room left on the page it is
-- a heap-only update, which writes no index entry.
ALTER TABLE messages SET (fillfactor = 80);

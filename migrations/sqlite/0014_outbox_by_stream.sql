-- The relay drains the critical stream's held events before the bulk stream's, so
-- after a broker outage critical work is not published behind a bulk backlog. Keep in
-- step with migrations/postgres/0014_outbox_by_stream.sql.
CREATE INDEX outbox_stream_seq ON outbox (stream, seq);

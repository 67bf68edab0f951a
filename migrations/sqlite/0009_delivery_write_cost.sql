-- What a delivery writes, made cheaper (the PostgreSQL twin says why): timeline and
-- attempt rows lose their foreign key to `messages`. Every writer of those rows
-- updates or locks the message's row in the same transaction, and messages are never
-- deleted. SQLite drops a foreign key only by rebuilding the table.
CREATE TABLE delivery_attempts_new (
    event_id            TEXT NOT NULL,
    attempt_no          INTEGER NOT NULL CHECK (attempt_no >= 1),
    channel             TEXT NOT NULL,
    provider            TEXT NOT NULL,
    state               TEXT NOT NULL CHECK (state IN ('started', 'sent', 'failed')),
    provider_message_id TEXT,
    cost_micro_usd      INTEGER NOT NULL DEFAULT 0,
    detail              TEXT,
    started_at          TEXT NOT NULL,
    finished_at         TEXT,
    PRIMARY KEY (event_id, attempt_no)
) STRICT;
INSERT INTO delivery_attempts_new SELECT * FROM delivery_attempts;
DROP TABLE delivery_attempts;
ALTER TABLE delivery_attempts_new RENAME TO delivery_attempts;

CREATE TABLE message_events_new (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id    TEXT NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('queued', 'sent', 'delivered', 'failed')),
    occurred_at TEXT NOT NULL,
    provider    TEXT,
    detail      TEXT CHECK (detail IS NULL OR json_valid(detail))
) STRICT;
INSERT INTO message_events_new SELECT * FROM message_events;
-- The AUTOINCREMENT high-water mark goes with the old table: keep it, so that a `seq`
-- once given (to a row since deleted) is never given again.
CREATE TEMP TABLE message_events_seq AS
    SELECT seq FROM sqlite_sequence WHERE name = 'message_events';
DROP TABLE message_events;
ALTER TABLE message_events_new RENAME TO message_events;
UPDATE sqlite_sequence SET seq = max(seq, (SELECT seq FROM message_events_seq))
    WHERE name = 'message_events' AND EXISTS (SELECT 1 FROM message_events_seq);
INSERT INTO sqlite_sequence (name, seq)
    SELECT 'message_events', seq FROM message_events_seq
    WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'message_events');
DROP TABLE message_events_seq;
CREATE INDEX message_events_event ON message_events (event_id, seq);

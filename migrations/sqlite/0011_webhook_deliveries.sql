-- Delivery events on their way to callers' endpoints. Keep in step with
-- migrations/postgres/0011_webhook_deliveries.sql.
-- Timestamps through store::sqlite::encode_timestamp.
--
-- A row is written in the transaction that changes a message's status, one per
-- endpoint subscribed to the change (unique per endpoint and event id), with the exact
-- body to post. The relay publishes a row to the broker's webhooks stream once its
-- `next_attempt_at` has come (at once for a new row; a failed try that will be retried
-- unsets `published` and sets the time of the retry), so no retry waits in the broker.
-- `message_id` is the message a `message.*` event tells of: a message's events to one
-- endpoint are tried in order while the earlier ones have not been tried yet.
-- `round` counts manual retries (`round_start`: the tries before the round began, so
-- a retried delivery starts the retry schedule again); `handbacks` counts the times a
-- busy endpoint's delivery went back to the relay untried; with `attempts` it makes each publish's broker
-- message id unique (with `handbacks`).
CREATE TABLE webhook_deliveries (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    id              TEXT NOT NULL UNIQUE,
    endpoint_id     TEXT NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    workspace_id    TEXT NOT NULL,
    event_id        TEXT NOT NULL,
    message_id      TEXT,
    event_type      TEXT NOT NULL,
    body            TEXT NOT NULL,
    status          TEXT NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    round           INTEGER NOT NULL DEFAULT 0,
    round_start     INTEGER NOT NULL DEFAULT 0,
    handbacks       INTEGER NOT NULL DEFAULT 0,
    published       INTEGER NOT NULL DEFAULT 0,
    next_attempt_at TEXT NOT NULL,
    created_at      TEXT NOT NULL,
    updated_at      TEXT NOT NULL,
    UNIQUE (endpoint_id, event_id)
) STRICT;
-- The delivery log of one endpoint, newest first.
CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, seq DESC);
-- What the relay has still to publish, by when it is due.
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at, seq) WHERE published = 0;
-- A message's earlier events to the same endpoint, which go first.
CREATE INDEX webhook_deliveries_message ON webhook_deliveries (endpoint_id, message_id)
    WHERE message_id IS NOT NULL;
-- What is waiting for a try (the metrics' queue depth).
CREATE INDEX webhook_deliveries_pending ON webhook_deliveries (seq) WHERE status = 'PENDING';

-- Every try of a delivery: the receiver's status (none when it did not answer), how
-- long it took, why it failed, and when the next try is due.
CREATE TABLE webhook_attempts (
    delivery_id   TEXT NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
    attempt_no    INTEGER NOT NULL,
    attempted_at  TEXT NOT NULL,
    status_code   INTEGER,
    latency_ms    INTEGER NOT NULL,
    error         TEXT,
    next_retry_at TEXT,
    PRIMARY KEY (delivery_id, attempt_no)
) STRICT;

-- Since when an endpoint has failed every try (NULL while it succeeds): past the
-- configured period the gateway disables it.
ALTER TABLE webhook_endpoints ADD COLUMN failing_since TEXT;

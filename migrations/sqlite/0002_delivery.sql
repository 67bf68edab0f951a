-- Delivery: attempts, timelines, subscribers, preferences, erasure, workflows,
-- provider routes and the voice DND list. Keep in step with migrations/postgres/0002_delivery.sql.
-- Timestamps through store::sqlite::encode_timestamp; booleans 0/1; JSON in TEXT.

ALTER TABLE messages ADD COLUMN lease_owner TEXT;
ALTER TABLE messages ADD COLUMN lease_until TEXT;

CREATE INDEX messages_workspace_status ON messages (workspace_id, status, created_at DESC, event_id DESC);
CREATE INDEX messages_workspace_subscriber ON messages (workspace_id, subscriber_id, created_at DESC, event_id DESC);

CREATE TABLE delivery_attempts (
    event_id            TEXT NOT NULL REFERENCES messages (event_id) ON DELETE CASCADE,
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

CREATE TABLE message_events (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id    TEXT NOT NULL REFERENCES messages (event_id) ON DELETE CASCADE,
    status      TEXT NOT NULL CHECK (status IN ('queued', 'sent', 'delivered', 'failed')),
    occurred_at TEXT NOT NULL,
    provider    TEXT,
    detail      TEXT CHECK (detail IS NULL OR json_valid(detail))
) STRICT;
CREATE INDEX message_events_event ON message_events (event_id, seq);

CREATE TABLE subscribers (
    workspace_id   TEXT NOT NULL REFERENCES workspaces (id),
    subscriber_key TEXT NOT NULL,
    subscriber_id  TEXT,
    email          TEXT,
    phone_masked   TEXT,
    device_tokens  TEXT CHECK (device_tokens IS NULL OR json_valid(device_tokens)),
    created_at     TEXT NOT NULL,
    updated_at     TEXT NOT NULL,
    deleted_at     TEXT,
    PRIMARY KEY (workspace_id, subscriber_key)
) STRICT;

CREATE TABLE preference_channels (
    workspace_id  TEXT NOT NULL REFERENCES workspaces (id),
    subscriber_id TEXT NOT NULL,
    channel       TEXT NOT NULL CHECK (channel IN ('sms', 'email', 'push', 'whatsapp', 'voice')),
    enabled       INTEGER NOT NULL CHECK (enabled IN (0, 1)),
    updated_at    TEXT NOT NULL,
    PRIMARY KEY (workspace_id, subscriber_id, channel)
) STRICT;

CREATE TABLE preference_categories (
    workspace_id  TEXT NOT NULL REFERENCES workspaces (id),
    subscriber_id TEXT NOT NULL,
    category      TEXT NOT NULL,
    flags         TEXT NOT NULL CHECK (json_valid(flags)),
    updated_at    TEXT NOT NULL,
    PRIMARY KEY (workspace_id, subscriber_id, category)
) STRICT;

CREATE TABLE erasure_audit (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    workspace_id        TEXT NOT NULL REFERENCES workspaces (id),
    subscriber_key      TEXT NOT NULL,
    known_subscriber    INTEGER NOT NULL CHECK (known_subscriber IN (0, 1)),
    messages_scrubbed   INTEGER NOT NULL,
    preferences_deleted INTEGER NOT NULL,
    requested_at        TEXT NOT NULL
) STRICT;

CREATE TABLE workflows (
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    name         TEXT NOT NULL,
    definition   TEXT NOT NULL CHECK (json_valid(definition)),
    updated_at   TEXT NOT NULL,
    PRIMARY KEY (workspace_id, name)
) STRICT;

CREATE TABLE provider_routes (
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    channel      TEXT NOT NULL CHECK (channel IN ('sms', 'email', 'push', 'whatsapp', 'voice')),
    providers    TEXT NOT NULL CHECK (json_valid(providers)),
    updated_at   TEXT NOT NULL,
    PRIMARY KEY (workspace_id, channel)
) STRICT;

CREATE TABLE dnd_numbers (
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    phone_hash   TEXT NOT NULL,
    phone_masked TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    PRIMARY KEY (workspace_id, phone_hash)
) STRICT;

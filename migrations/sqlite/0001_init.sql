-- Switchboard schema, SQLite. Keep in step with migrations/postgres/0001_init.sql.
--
-- Timestamps are TEXT in one fixed-width RFC 3339 form, UTC with exactly six
-- fractional digits (`2024-05-01T12:00:00.000000Z`), so that text order is time
-- order. Always write them through `store::sqlite::encode_timestamp`. Booleans are
-- INTEGER 0/1. STRICT tables reject values of the wrong type.

CREATE TABLE workspaces (
    id          TEXT NOT NULL PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    tier        TEXT NOT NULL CHECK (tier IN ('paid', 'free')),
    created_at  TEXT NOT NULL
) STRICT;

CREATE TABLE api_keys (
    id           TEXT NOT NULL PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    mode         TEXT NOT NULL CHECK (mode IN ('live', 'test')),
    -- SHA-256 of the raw key; the key itself is never stored.
    hash         BLOB NOT NULL UNIQUE CHECK (length(hash) = 32),
    hint         TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    revoked_at   TEXT,
    -- Revocation order: MAX + 1, computed inside the revoking UPDATE (SQLite runs one
    -- writer at a time, so numbers are unique and increase in commit order).
    revoked_seq  INTEGER UNIQUE,
    CHECK ((revoked_at IS NULL) = (revoked_seq IS NULL))
) STRICT;

CREATE INDEX api_keys_workspace_created ON api_keys (workspace_id, created_at DESC, id DESC);

CREATE TABLE messages (
    event_id            TEXT NOT NULL PRIMARY KEY,
    workspace_id        TEXT NOT NULL REFERENCES workspaces (id),
    event_name          TEXT NOT NULL,
    subscriber_id       TEXT NOT NULL,
    category            TEXT,
    priority            INTEGER NOT NULL,
    channel             TEXT NOT NULL,
    status              TEXT NOT NULL,
    attempts            INTEGER NOT NULL DEFAULT 0,
    cost_micro_usd      INTEGER NOT NULL DEFAULT 0,
    test_mode           INTEGER NOT NULL CHECK (test_mode IN (0, 1)),
    -- Keys of the payload only (a JSON array of strings); values are never stored.
    variables_keys      TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(variables_keys)),
    provider            TEXT,
    provider_message_id TEXT,
    error_code          TEXT,
    error_detail        TEXT,
    created_at          TEXT NOT NULL,
    updated_at          TEXT NOT NULL
) STRICT;

-- Listing a workspace's messages, newest first, with a stable keyset cursor.
CREATE INDEX messages_workspace_created ON messages (workspace_id, created_at DESC, event_id DESC);
-- Delivery receipts find their message by the provider's id.
CREATE INDEX messages_provider_message ON messages (provider, provider_message_id);

-- Broker messages held while the broker is unreachable, replayed in seq order.
-- AUTOINCREMENT: a seq is never reused, even after the newest rows are deleted.
CREATE TABLE outbox (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    stream     TEXT NOT NULL,
    subject    TEXT NOT NULL,
    msg_id     TEXT NOT NULL,
    payload    BLOB NOT NULL,
    created_at TEXT NOT NULL
) STRICT;

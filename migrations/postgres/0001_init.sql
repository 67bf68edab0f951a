-- Switchboard schema, PostgreSQL. Keep in step with migrations/sqlite/0001_init.sql.

CREATE TABLE workspaces (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    tier        TEXT NOT NULL CHECK (tier IN ('paid', 'free')),
    created_at  TIMESTAMPTZ NOT NULL
);

-- Revocation order, so that every process can poll "what was revoked after N".
-- Revocations take an advisory lock (see PgStore::revoke_api_key) so that sequence
-- order is also commit order and a poller never skips a number that commits late.
CREATE SEQUENCE api_key_revocation_seq AS BIGINT;

CREATE TABLE api_keys (
    id           TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    mode         TEXT NOT NULL CHECK (mode IN ('live', 'test')),
    -- SHA-256 of the raw key; the key itself is never stored.
    hash         BYTEA NOT NULL UNIQUE CHECK (octet_length(hash) = 32),
    hint         TEXT NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL,
    revoked_at   TIMESTAMPTZ,
    revoked_seq  BIGINT UNIQUE,
    CHECK ((revoked_at IS NULL) = (revoked_seq IS NULL))
);

CREATE INDEX api_keys_workspace_created ON api_keys (workspace_id, created_at DESC, id DESC);

CREATE TABLE messages (
    event_id            TEXT PRIMARY KEY,
    workspace_id        TEXT NOT NULL REFERENCES workspaces (id),
    event_name          TEXT NOT NULL,
    subscriber_id       TEXT NOT NULL,
    category            TEXT,
    priority            INTEGER NOT NULL,
    channel             TEXT NOT NULL,
    status              TEXT NOT NULL,
    attempts            INTEGER NOT NULL DEFAULT 0,
    cost_micro_usd      BIGINT NOT NULL DEFAULT 0,
    test_mode           BOOLEAN NOT NULL,
    -- Keys of the payload only (a JSON array of strings); values are never stored.
    variables_keys      JSONB NOT NULL DEFAULT '[]'::jsonb,
    provider            TEXT,
    provider_message_id TEXT,
    error_code          TEXT,
    error_detail        TEXT,
    created_at          TIMESTAMPTZ NOT NULL,
    updated_at          TIMESTAMPTZ NOT NULL
);

-- Listing a workspace's messages, newest first, with a stable keyset cursor.
CREATE INDEX messages_workspace_created ON messages (workspace_id, created_at DESC, event_id DESC);
-- Delivery receipts find their message by the provider's id.
CREATE INDEX messages_provider_message ON messages (provider, provider_message_id);

-- Broker messages held while the broker is unreachable, replayed in seq order.
CREATE TABLE outbox (
    seq        BIGSERIAL PRIMARY KEY,
    stream     TEXT NOT NULL,
    subject    TEXT NOT NULL,
    msg_id     TEXT NOT NULL,
    payload    BYTEA NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Delivery: attempts, timelines, subscribers, preferences, erasure, workflows,
-- provider routes and the voice DND list. Keep in step with migrations/sqlite/0002_delivery.sql.

-- A worker leases a message while it dispatches it: a broker redelivery that reaches a
-- second worker waits instead of dispatching the same event twice.
ALTER TABLE messages ADD COLUMN lease_owner TEXT;
ALTER TABLE messages ADD COLUMN lease_until TIMESTAMPTZ;

-- Filters of GET /v1/messages, each with the listing order as the tail.
CREATE INDEX messages_workspace_status ON messages (workspace_id, status, created_at DESC, event_id DESC);
CREATE INDEX messages_workspace_subscriber ON messages (workspace_id, subscriber_id, created_at DESC, event_id DESC);

-- One row per provider call. Written `started` before the call and `sent`/`failed`
-- after it: a redelivery finds a completed attempt and does not send it again.
CREATE TABLE delivery_attempts (
    event_id            TEXT NOT NULL REFERENCES messages (event_id) ON DELETE CASCADE,
    attempt_no          INTEGER NOT NULL CHECK (attempt_no >= 1),
    channel             TEXT NOT NULL,
    provider            TEXT NOT NULL,
    state               TEXT NOT NULL CHECK (state IN ('started', 'sent', 'failed')),
    provider_message_id TEXT,
    cost_micro_usd      BIGINT NOT NULL DEFAULT 0,
    detail              TEXT,
    started_at          TIMESTAMPTZ NOT NULL,
    finished_at         TIMESTAMPTZ,
    PRIMARY KEY (event_id, attempt_no)
);

-- The MessageDto timeline. `seq` is global, so it is monotonic per message too.
CREATE TABLE message_events (
    seq         BIGSERIAL PRIMARY KEY,
    event_id    TEXT NOT NULL REFERENCES messages (event_id) ON DELETE CASCADE,
    status      TEXT NOT NULL CHECK (status IN ('queued', 'sent', 'delivered', 'failed')),
    occurred_at TIMESTAMPTZ NOT NULL,
    provider    TEXT,
    detail      JSONB
);
CREATE INDEX message_events_event ON message_events (event_id, seq);

-- Subscribers as last seen by a worker. `subscriber_key` is the hex SHA-256 of
-- `{workspace_id}:{subscriber_id}`: an erased row keeps only it (and `deleted_at`),
-- so later events for the same id are recognised and suppressed.
CREATE TABLE subscribers (
    workspace_id   TEXT NOT NULL REFERENCES workspaces (id),
    subscriber_key TEXT NOT NULL,
    -- NULL once erased.
    subscriber_id  TEXT,
    email          TEXT,
    -- Masked (`+44*******123`): no plaintext phone number is stored.
    phone_masked   TEXT,
    device_tokens  JSONB,
    created_at     TIMESTAMPTZ NOT NULL,
    updated_at     TIMESTAMPTZ NOT NULL,
    deleted_at     TIMESTAMPTZ,
    PRIMARY KEY (workspace_id, subscriber_key)
);

-- Channel flags: one row per (subscriber, channel), so concurrent updates of
-- different channels touch different rows and never overwrite each other.
CREATE TABLE preference_channels (
    workspace_id  TEXT NOT NULL REFERENCES workspaces (id),
    subscriber_id TEXT NOT NULL,
    channel       TEXT NOT NULL CHECK (channel IN ('sms', 'email', 'push', 'whatsapp', 'voice')),
    enabled       BOOLEAN NOT NULL,
    updated_at    TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (workspace_id, subscriber_id, channel)
);

-- Category rules: one row per (subscriber, category); a category sent replaces its
-- flags wholesale (a JSON object channel -> boolean).
CREATE TABLE preference_categories (
    workspace_id  TEXT NOT NULL REFERENCES workspaces (id),
    subscriber_id TEXT NOT NULL,
    category      TEXT NOT NULL,
    flags         JSONB NOT NULL,
    updated_at    TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (workspace_id, subscriber_id, category)
);

-- Who was erased, when, and what was done. Holds the digest, never the id.
CREATE TABLE erasure_audit (
    id                 BIGSERIAL PRIMARY KEY,
    workspace_id       TEXT NOT NULL REFERENCES workspaces (id),
    subscriber_key     TEXT NOT NULL,
    known_subscriber   BOOLEAN NOT NULL,
    messages_scrubbed  BIGINT NOT NULL,
    preferences_deleted BIGINT NOT NULL,
    requested_at       TIMESTAMPTZ NOT NULL
);

-- Workflows: per-channel templates, as a JSON document (see host/src/workflow.rs).
CREATE TABLE workflows (
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    name         TEXT NOT NULL,
    definition   JSONB NOT NULL,
    updated_at   TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (workspace_id, name)
);

-- Per channel, the ordered providers (slug and config, secrets included) to attempt.
CREATE TABLE provider_routes (
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    channel      TEXT NOT NULL CHECK (channel IN ('sms', 'email', 'push', 'whatsapp', 'voice')),
    providers    JSONB NOT NULL,
    updated_at   TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (workspace_id, channel)
);

-- Voice do-not-disturb list: numbers are kept as a hex SHA-256 digest and a masked form.
CREATE TABLE dnd_numbers (
    workspace_id TEXT NOT NULL REFERENCES workspaces (id),
    phone_hash   TEXT NOT NULL,
    phone_masked TEXT NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (workspace_id, phone_hash)
);

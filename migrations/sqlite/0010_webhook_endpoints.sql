-- Callers' webhook endpoints: where a workspace's delivery events are posted, signed
-- per the Standard Webhooks specification. Keep in step with
-- migrations/postgres/0010_webhook_endpoints.sql.
-- Timestamps through store::sqlite::encode_timestamp; JSON in TEXT.
--
-- `event_types` is a JSON array, NULL for every type. `secret` signs every request;
-- after a rotation `previous_secret` signs alongside it until `previous_expires_at`.
CREATE TABLE webhook_endpoints (
    id                  TEXT PRIMARY KEY,
    workspace_id        TEXT NOT NULL REFERENCES workspaces (id),
    url                 TEXT NOT NULL,
    description         TEXT,
    event_types         TEXT,
    disabled            INTEGER NOT NULL DEFAULT 0,
    disabled_reason     TEXT,
    secret              TEXT NOT NULL,
    previous_secret     TEXT,
    previous_expires_at TEXT,
    created_at          TEXT NOT NULL,
    updated_at          TEXT NOT NULL
) STRICT;
-- Listing newest first within a workspace (ids are time-ordered).
CREATE INDEX webhook_endpoints_workspace ON webhook_endpoints (workspace_id, id DESC);

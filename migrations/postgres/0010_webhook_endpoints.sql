-- Callers' webhook endpoints: where a workspace's delivery events are posted, signed
-- per the Standard Webhooks specification. Keep in step with
-- migrations/sqlite/0010_webhook_endpoints.sql.
--
-- `event_types` is a JSON array, NULL for every type. `secret` signs every request;
-- after a rotation `previous_secret` signs alongside it until `previous_expires_at`.
CREATE TABLE webhook_endpoints (
    id                  TEXT PRIMARY KEY,
    workspace_id        TEXT NOT NULL REFERENCES workspaces (id),
    url                 TEXT NOT NULL,
    description         TEXT,
    event_types         JSONB,
    disabled            BOOLEAN NOT NULL DEFAULT FALSE,
    disabled_reason     TEXT,
    secret              TEXT NOT NULL,
    previous_secret     TEXT,
    previous_expires_at TIMESTAMPTZ,
    created_at          TIMESTAMPTZ NOT NULL,
    updated_at          TIMESTAMPTZ NOT NULL
);
-- Listing newest first within a workspace (ids are time-ordered).
CREATE INDEX webhook_endpoints_workspace ON webhook_endpoints (workspace_id, id DESC);

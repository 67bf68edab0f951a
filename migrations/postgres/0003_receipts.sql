-- Webhooks and delivery receipts: per-provider webhook secrets, replay keys of accepted
-- callbacks and the receipts applied (or waiting to be applied) to messages.
-- Keep in step with migrations/sqlite/0003_receipts.sql.

-- Webhook signing secrets. `workspace_id` is '' for the provider-wide secret (a key
-- column cannot be NULL), otherwise the workspace whose secret it is.
CREATE TABLE webhook_secrets (
    provider     TEXT NOT NULL,
    workspace_id TEXT NOT NULL DEFAULT '',
    secret       TEXT NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL,
    updated_at   TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (provider, workspace_id)
);

-- Replay keys (digests of accepted callback bodies), remembered until `expires_at`:
-- an identical callback within the window is refused. An expired row counts as absent.
CREATE TABLE webhook_replays (
    provider   TEXT NOT NULL,
    replay_key TEXT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (provider, replay_key)
);
CREATE INDEX webhook_replays_expires ON webhook_replays (expires_at);

-- One row per receipt (`{dlr}.{index}`): a second delivery of the same key is a
-- duplicate. A receipt whose message is not known yet (the worker has not recorded the
-- provider's id) stays `pending` with everything needed to apply it later; applying
-- makes it `applied` (the message moved) or `ignored` (the message was already at an
-- equal or higher rank), with the message's `event_id`.
CREATE TABLE receipts (
    receipt_key          TEXT PRIMARY KEY,
    provider             TEXT NOT NULL,
    provider_message_id  TEXT NOT NULL,
    -- The workspace whose secret verified the callback; NULL for the provider-wide one.
    workspace_id         TEXT,
    -- The reported status (MessageStatus, upper case).
    status               TEXT NOT NULL,
    state                TEXT NOT NULL CHECK (state IN ('pending', 'applied', 'ignored')),
    event_id             TEXT,
    occurred_at          TIMESTAMPTZ NOT NULL,
    cost_micro_usd       BIGINT,
    error_code           TEXT,
    error_detail         TEXT,
    -- The timeline entry written when the receipt is applied.
    timeline_status      TEXT NOT NULL CHECK (timeline_status IN ('queued', 'sent', 'delivered', 'failed')),
    timeline_occurred_at TIMESTAMPTZ NOT NULL,
    timeline_provider    TEXT,
    timeline_detail      JSONB,
    received_at          TIMESTAMPTZ NOT NULL,
    CHECK ((state = 'pending') = (event_id IS NULL))
);
-- Pending receipts of a provider id, found when a worker records it.
CREATE INDEX receipts_provider_message ON receipts (provider, provider_message_id, state);
-- Pruning by age.
CREATE INDEX receipts_received ON receipts (received_at);

-- Random secrets of the gateway's database, made the first time one is asked for
-- (insert-or-nothing, so every process sharing the database reads the same one): the
-- delivery log's cursors are sealed with one, so that a page's cursor tells a tenant
-- nothing of other tenants' deliveries. Keep in step with
-- migrations/postgres/0018_gateway_secrets.sql.
CREATE TABLE gateway_secrets (
    name   TEXT PRIMARY KEY,
    secret BLOB NOT NULL
) STRICT;

-- Console sessions signed out before they expire: a copy of a signed-out cookie is
-- refused by every process. Rows past their expiry mean nothing and are deleted at the
-- next sign-out. Keep in step with migrations/sqlite/0016_console_sign_outs.sql.
CREATE TABLE console_sign_outs (
    session_id BYTEA PRIMARY KEY,
    expires_at BIGINT NOT NULL
);
CREATE INDEX console_sign_outs_expiry ON console_sign_outs (expires_at);

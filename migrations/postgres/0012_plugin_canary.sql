-- Canary swaps: an installed version may serve a share of its slug's sends beside the
-- active one while their failure rates are compared (see host/src/canary).
-- Keep in step with migrations/sqlite/0012_plugin_canary.sql.
--
-- `state` gains 'canary'. `canary_percent` (1-99) is the share of the slug's events it
-- serves and `canary_since` when the trial began; both are set only while it is one.
-- `canary_result` is how the version's last trial ended ("promoted: ..." or
-- "rolled back: ..."), kept after it ends.
ALTER TABLE plugin_versions DROP CONSTRAINT plugin_versions_state_check;
ALTER TABLE plugin_versions ADD CONSTRAINT plugin_versions_state_check
    CHECK (state IN ('active', 'standby', 'rejected', 'canary'));
ALTER TABLE plugin_versions ADD COLUMN canary_percent BIGINT
    CHECK (canary_percent BETWEEN 1 AND 99);
ALTER TABLE plugin_versions ADD COLUMN canary_since TIMESTAMPTZ;
ALTER TABLE plugin_versions ADD COLUMN canary_result TEXT;
ALTER TABLE plugin_versions ADD CONSTRAINT plugin_versions_canary_fields
    CHECK ((state = 'canary') = (canary_percent IS NOT NULL AND canary_since IS NOT NULL));
-- At most one canary per slug; also what the poll of canaries reads.
CREATE UNIQUE INDEX plugin_versions_canary ON plugin_versions (slug)
    INCLUDE (digest, canary_percent, canary_since) WHERE state = 'canary';

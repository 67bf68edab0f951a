-- Canary swaps: an installed version may serve a share of its slug's sends beside the
-- active one while their failure rates are compared (see host/src/canary).
-- Keep in step with migrations/postgres/0012_plugin_canary.sql.
--
-- `state` gains 'canary'. `canary_percent` (1-99) is the share of the slug's events it
-- serves and `canary_since` when the trial began; both are set only while it is one.
-- `canary_result` is how the version's last trial ended ("promoted: ..." or
-- "rolled back: ..."), kept after it ends.
--
-- Rebuilt rather than altered, as in 0006: a CHECK cannot be changed in place, and
-- `wasm` stays last.
CREATE TABLE plugin_versions_new (
    slug           TEXT NOT NULL,
    version        TEXT NOT NULL,
    digest         TEXT NOT NULL,
    outbound_hosts TEXT NOT NULL
        CHECK (json_valid(outbound_hosts) AND json_type(outbound_hosts) = 'array'),
    state          TEXT NOT NULL CHECK (state IN ('active', 'standby', 'rejected', 'canary')),
    report         TEXT,
    installed_by   TEXT NOT NULL,
    installed_at   TEXT NOT NULL,
    activated_at   TEXT,
    kind           TEXT NOT NULL CHECK (kind IN ('wasm', 'native')),
    canary_percent INTEGER CHECK (canary_percent BETWEEN 1 AND 99),
    canary_since   TEXT,
    canary_result  TEXT,
    wasm           BLOB NOT NULL,
    PRIMARY KEY (slug, digest),
    CHECK ((state = 'canary') = (canary_percent IS NOT NULL AND canary_since IS NOT NULL))
) STRICT;
INSERT INTO plugin_versions_new (slug, version, digest, outbound_hosts, state, report,
    installed_by, installed_at, activated_at, kind, wasm)
SELECT slug, version, digest, outbound_hosts, state, report, installed_by, installed_at,
    activated_at, kind, wasm
FROM plugin_versions;
DROP TABLE plugin_versions;
ALTER TABLE plugin_versions_new RENAME TO plugin_versions;
-- As in 0004: at most one active version per slug, and the index behind the poll.
CREATE UNIQUE INDEX plugin_versions_active ON plugin_versions (slug) WHERE state = 'active';
-- At most one canary per slug; also what the poll of canaries reads.
CREATE UNIQUE INDEX plugin_versions_canary ON plugin_versions (slug) WHERE state = 'canary';

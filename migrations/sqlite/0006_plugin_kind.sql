-- How an installed version's code runs: 'wasm' (a sandboxed component) or 'native'
-- (a trusted native library), so that listings say so without reading the bytes.
-- Keep in step with migrations/postgres/0006_plugin_kind.sql.
--
-- The table is rebuilt rather than altered: ADD COLUMN would put `kind` after `wasm`,
-- and `wasm` stays last so that listings never walk a component's overflow pages
-- (0004). Existing rows get their kind from the bytes' magic, as
-- `plugins::native::artifact_kind` tells it (ELF, Mach-O, PE: native). No default:
-- every insert says what it stores.
CREATE TABLE plugin_versions_new (
    slug           TEXT NOT NULL,
    version        TEXT NOT NULL,
    digest         TEXT NOT NULL,
    outbound_hosts TEXT NOT NULL
        CHECK (json_valid(outbound_hosts) AND json_type(outbound_hosts) = 'array'),
    state          TEXT NOT NULL CHECK (state IN ('active', 'standby', 'rejected')),
    report         TEXT,
    installed_by   TEXT NOT NULL,
    installed_at   TEXT NOT NULL,
    activated_at   TEXT,
    kind           TEXT NOT NULL CHECK (kind IN ('wasm', 'native')),
    wasm           BLOB NOT NULL,
    PRIMARY KEY (slug, digest)
) STRICT;
INSERT INTO plugin_versions_new (slug, version, digest, outbound_hosts, state, report,
    installed_by, installed_at, activated_at, kind, wasm)
SELECT slug, version, digest, outbound_hosts, state, report, installed_by, installed_at,
    activated_at,
    CASE WHEN substr(wasm, 1, 4) IN (X'7F454C46', X'CFFAEDFE', X'CEFAEDFE', X'CAFEBABE')
              OR substr(wasm, 1, 2) = X'4D5A'
         THEN 'native' ELSE 'wasm' END,
    wasm
FROM plugin_versions;
DROP TABLE plugin_versions;
ALTER TABLE plugin_versions_new RENAME TO plugin_versions;
-- As in 0004: at most one active version per slug, and the index behind the poll.
CREATE UNIQUE INDEX plugin_versions_active ON plugin_versions (slug) WHERE state = 'active';

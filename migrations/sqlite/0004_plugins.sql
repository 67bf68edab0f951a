-- Plugin registry: provider plugin versions installed at run time, with their component
-- bytes, and which one (if any) serves each slug.
-- Keep in step with migrations/postgres/0004_plugins.sql.
-- Timestamps through store::sqlite::encode_timestamp; JSON in TEXT.

-- One row per installed version of a slug, keyed by the component's digest (hex
-- SHA-256): installing the same bytes twice is a no-op. `state` is 'active' (serving
-- its slug on every process), 'standby' (installed and checked, not serving) or
-- 'rejected' (failed the conformance kit or widened its hosts; never served, `report`
-- says why). `activated_at` is when the version last became active; a row turned
-- standby keeps it.
--
-- `wasm` comes last: a record is read front to back, so every other column is read
-- without walking the component's overflow pages.
CREATE TABLE plugin_versions (
    slug           TEXT NOT NULL,
    version        TEXT NOT NULL,
    digest         TEXT NOT NULL,
    -- The hosts the version declares, a JSON array of strings.
    outbound_hosts TEXT NOT NULL
        CHECK (json_valid(outbound_hosts) AND json_type(outbound_hosts) = 'array'),
    state          TEXT NOT NULL CHECK (state IN ('active', 'standby', 'rejected')),
    report         TEXT,
    installed_by   TEXT NOT NULL,
    installed_at   TEXT NOT NULL,
    activated_at   TEXT,
    wasm           BLOB NOT NULL,
    PRIMARY KEY (slug, digest)
) STRICT;
-- At most one active version per slug. Also the index behind the poll every process
-- runs each second (`WHERE state = 'active' ORDER BY slug`): it holds only the active
-- rows, so the poll reads one index entry and one row (its first page) per slug.
CREATE UNIQUE INDEX plugin_versions_active ON plugin_versions (slug) WHERE state = 'active';

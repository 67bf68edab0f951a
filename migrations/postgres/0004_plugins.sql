-- Plugin registry: provider plugin versions installed at run time, with their component
-- bytes, and which one (if any) serves each slug.
-- Keep in step with migrations/sqlite/0004_plugins.sql.

-- One row per installed version of a slug, keyed by the component's digest (hex
-- SHA-256): installing the same bytes twice is a no-op. `state` is 'active' (serving
-- its slug on every process), 'standby' (installed and checked, not serving) or
-- 'rejected' (failed the conformance kit or widened its hosts; never served, `report`
-- says why). `activated_at` is when the version last became active; a row turned
-- standby keeps it.
--
-- `slug` and `digest` sort bytewise (COLLATE "C", as SQLite sorts text), so listings
-- come out in the same order on both backends whatever the database's collation, and
-- the active index below gives `active_plugin_versions` its order without a sort.
-- `wasm` (stored out of line) comes last, as in SQLite.
CREATE TABLE plugin_versions (
    slug           TEXT COLLATE "C" NOT NULL,
    version        TEXT NOT NULL,
    digest         TEXT COLLATE "C" NOT NULL,
    -- The hosts the version declares, a JSON array of strings.
    outbound_hosts JSONB NOT NULL CHECK (jsonb_typeof(outbound_hosts) = 'array'),
    state          TEXT NOT NULL CHECK (state IN ('active', 'standby', 'rejected')),
    report         TEXT,
    installed_by   TEXT NOT NULL,
    installed_at   TIMESTAMPTZ NOT NULL,
    activated_at   TIMESTAMPTZ,
    wasm           BYTEA NOT NULL,
    PRIMARY KEY (slug, digest)
);
-- At most one active version per slug. Also the index behind the poll every process
-- runs each second (`WHERE state = 'active' ORDER BY slug`): it holds only the active
-- rows, and `digest` is included so that the poll can be an index-only scan.
CREATE UNIQUE INDEX plugin_versions_active ON plugin_versions (slug) INCLUDE (digest)
    WHERE state = 'active';

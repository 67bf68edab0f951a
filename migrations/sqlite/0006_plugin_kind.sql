-- How an installed version's code runs: 'wasm' (a sandboxed component) or 'native'
-- (a trusted native library), so that listings say so without reading the bytes.
-- Every row before this migration is a component: native versions arrive with it.
-- Keep in step with migrations/postgres/0006_plugin_kind.sql.
ALTER TABLE plugin_versions ADD COLUMN kind TEXT NOT NULL DEFAULT 'wasm'
    CHECK (kind IN ('wasm', 'native'));

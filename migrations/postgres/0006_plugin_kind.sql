-- How an installed version's code runs: 'wasm' (a sandboxed component) or 'native'
-- (a trusted native library), so that listings say so without reading the bytes.
-- Keep in step with migrations/sqlite/0006_plugin_kind.sql.
--
-- Added at the end: PostgreSQL keeps a large `wasm` out of line (TOAST), so a column
-- after it costs listings nothing (SQLite rebuilds its table to keep `wasm` last).
-- Existing rows get their kind from the bytes' magic, as `plugins::native::artifact_kind`
-- tells it (ELF, Mach-O, PE: native); then the default goes, so every insert says what
-- it stores.
ALTER TABLE plugin_versions ADD COLUMN kind TEXT NOT NULL DEFAULT 'wasm'
    CHECK (kind IN ('wasm', 'native'));
UPDATE plugin_versions SET kind = 'native'
WHERE substring(wasm FROM 1 FOR 4) IN ('\x7f454c46'::bytea, '\xcffaedfe'::bytea,
                                      '\xcefaedfe'::bytea, '\xcafebabe'::bytea)
   OR substring(wasm FROM 1 FOR 2) = '\x4d5a'::bytea;
ALTER TABLE plugin_versions ALTER COLUMN kind DROP DEFAULT;

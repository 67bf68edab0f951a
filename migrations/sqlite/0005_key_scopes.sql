-- Scopes on API keys: a comma-separated list; empty means an application key (every
-- /v1/ route except /v1/admin/*). `admin` grants /v1/admin/*.
ALTER TABLE api_keys ADD COLUMN scopes TEXT NOT NULL DEFAULT '';

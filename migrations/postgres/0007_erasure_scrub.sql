-- Messages of an erased subscriber kept for audit: `erased_as` holds the pseudonym
-- (`erased:<digest>`) their `subscriber_id` takes once they pass the audit window, set
-- by the erasure for messages still inside it and by a worker for messages written
-- for the subscriber since; NULL otherwise (and once scrubbed). A periodic job
-- (`Store::scrub_erased_messages`) scrubs them as they age past the window, oldest
-- first through the partial index.
-- Keep in step with migrations/sqlite/0007_erasure_scrub.sql.
ALTER TABLE messages ADD COLUMN erased_as TEXT;
CREATE INDEX messages_erasure_due ON messages (created_at) WHERE erased_as IS NOT NULL;

-- The dispatch lease of a message's first try, kept on the try's own row: the claim that
-- starts a fresh message's first attempt inserts that row anyway, so the message row is
-- left as ingested until the attempt's outcome (one row version less per delivery).
-- While one of these is set, the message row holds no lease; any later step of the
-- holder moves the lease back to the message row and clears these. Keep in step with
-- migrations/sqlite/0019_attempt_leases.sql.
ALTER TABLE delivery_attempts ADD COLUMN lease_owner TEXT;
ALTER TABLE delivery_attempts ADD COLUMN lease_until TIMESTAMPTZ;

-- A try of a delivery event is leased before its request is sent: the process that
-- takes the lease is the only one that may post that try until it is logged (which
-- clears the lease) or the lease runs out (its process died). A second copy of the
-- publication, taken by another process meanwhile, is handed back, and a leased row is
-- not published again as stale. Keep in step with
-- migrations/postgres/0017_delivery_event_leases.sql.
-- Timestamps through store::sqlite::encode_timestamp.
ALTER TABLE webhook_deliveries ADD COLUMN leased_until TEXT;

-- Every message has its `queued` timeline entry. A build whose ingestion left that
-- entry to the worker's claim could leave an accepted, unclaimed message without one;
-- the claim now writes it only for a row it inserts itself, so such rows get it here.
INSERT INTO message_events (event_id, status, occurred_at, provider, detail)
SELECT m.event_id, 'queued', m.created_at, NULL, jsonb_build_object('channel', m.channel)
FROM messages m
WHERE NOT EXISTS (SELECT 1 FROM message_events e WHERE e.event_id = m.event_id);

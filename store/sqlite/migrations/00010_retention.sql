-- Berth schema, version 10: when a sandbox ended, so retention can delete terminal sandboxes
-- and their events once they are older than --retention (issue 15, point 5). ended_at is set
-- by every transition into a terminal state; rows that ended before this migration take the
-- time of their latest event (their end), or their creation time if they have none.

-- +goose Up
ALTER TABLE sandboxes ADD COLUMN ended_at INTEGER;
UPDATE sandboxes SET ended_at = COALESCE(
    (SELECT MAX(at) FROM events WHERE entity = 'sandbox/' || sandboxes.id), created_at)
WHERE state IN ('stopped', 'failed', 'lost', 'evicted', 'reconstructed', 'migrated');
CREATE INDEX sandboxes_ended_at ON sandboxes (ended_at) WHERE ended_at IS NOT NULL;

-- +goose Down
DROP INDEX sandboxes_ended_at;
ALTER TABLE sandboxes DROP COLUMN ended_at;

-- Berth schema, version 10: the PostgreSQL translation of
-- store/sqlite/migrations/00010_retention.sql (issue 15, point 5): sandboxes.ended_at, set
-- when a sandbox enters a terminal state, so retention can delete old terminal rows.

-- +goose Up
ALTER TABLE sandboxes ADD COLUMN ended_at BIGINT;
UPDATE sandboxes SET ended_at = COALESCE(
    (SELECT MAX(at) FROM events WHERE entity = 'sandbox/' || sandboxes.id), created_at)
WHERE state IN ('stopped', 'failed', 'lost', 'evicted', 'reconstructed', 'migrated');
CREATE INDEX sandboxes_ended_at ON sandboxes (ended_at) WHERE ended_at IS NOT NULL;

-- +goose Down
DROP INDEX sandboxes_ended_at;
ALTER TABLE sandboxes DROP COLUMN ended_at;

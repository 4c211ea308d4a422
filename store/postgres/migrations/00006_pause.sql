-- Berth schema, version 6: the PostgreSQL translation of store/sqlite/migrations/00006_pause.sql
-- (PAUSE-1, SPOT-3). sandboxes: volume ('' = none, POOL-2), paused_at (unix ms, NULL = not
-- paused), image (checkpoint image, '' = none); agents: runtime ('' = not reported) and
-- checkpoint (ISO-4).

-- +goose Up
ALTER TABLE sandboxes ADD COLUMN volume TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN paused_at BIGINT;
ALTER TABLE sandboxes ADD COLUMN image TEXT NOT NULL DEFAULT '';
ALTER TABLE agents ADD COLUMN runtime TEXT NOT NULL DEFAULT '';
ALTER TABLE agents ADD COLUMN checkpoint BOOLEAN NOT NULL DEFAULT FALSE;

-- +goose Down
ALTER TABLE agents DROP COLUMN checkpoint;
ALTER TABLE agents DROP COLUMN runtime;
ALTER TABLE sandboxes DROP COLUMN image;
ALTER TABLE sandboxes DROP COLUMN paused_at;
ALTER TABLE sandboxes DROP COLUMN volume;

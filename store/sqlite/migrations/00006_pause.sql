-- Berth schema, version 6: pause/resume and stateful evacuation moves (PAUSE-1, SPOT-3).
-- sandboxes: volume names the tenant's volume the sandbox mounts ('' = none, POOL-2);
-- paused_at (unix ms, NULL = not paused) is when its TTL clock stopped; image names its
-- checkpoint image in the snapshot store ('' = none).
-- agents: runtime is the agent's runtime driver ('gvisor', 'process', 'noop'; '' = not
-- reported) and checkpoint (0/1) whether it can checkpoint and restore guests (ISO-4).

-- +goose Up
ALTER TABLE sandboxes ADD COLUMN volume TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN paused_at INTEGER;
ALTER TABLE sandboxes ADD COLUMN image TEXT NOT NULL DEFAULT '';
ALTER TABLE agents ADD COLUMN runtime TEXT NOT NULL DEFAULT '';
ALTER TABLE agents ADD COLUMN checkpoint INTEGER NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE agents DROP COLUMN checkpoint;
ALTER TABLE agents DROP COLUMN runtime;
ALTER TABLE sandboxes DROP COLUMN image;
ALTER TABLE sandboxes DROP COLUMN paused_at;
ALTER TABLE sandboxes DROP COLUMN volume;

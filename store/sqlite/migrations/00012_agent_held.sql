-- Berth schema, version 12: heartbeats cost what changed, not what is held (issue 16, goal 2).
-- An agent's held sandboxes live one row each in agent_held, so a delta heartbeat writes the
-- rows it changes instead of rewriting the whole list (agents.sandboxes is no longer written
-- and is emptied here). held_boot/held_seq name the heartbeat whose held list agent_held
-- holds: a delta applies only onto exactly that base. Kept in step between
-- store/sqlite/migrations and store/postgres/migrations.

-- +goose Up
CREATE TABLE agent_held (
    agent_id    TEXT    NOT NULL,
    sandbox_id  TEXT    NOT NULL,
    resident_mb INTEGER NOT NULL DEFAULT 0,
    measured    INTEGER NOT NULL DEFAULT 0,
    starting    INTEGER NOT NULL DEFAULT 0,
    oom_kills   INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (agent_id, sandbox_id)
);
ALTER TABLE agents ADD COLUMN held_boot TEXT NOT NULL DEFAULT '';
ALTER TABLE agents ADD COLUMN held_seq INTEGER NOT NULL DEFAULT 0;
INSERT OR IGNORE INTO agent_held (agent_id, sandbox_id, resident_mb, measured, starting, oom_kills)
    SELECT a.id, json_extract(j.value, '$.id'),
           COALESCE(json_extract(j.value, '$.resident_mb'), 0),
           COALESCE(json_extract(j.value, '$.measured'), 0),
           COALESCE(json_extract(j.value, '$.starting'), 0),
           COALESCE(json_extract(j.value, '$.oom_kills'), 0)
    FROM agents a, json_each(a.sandboxes) j
    WHERE json_valid(a.sandboxes) AND j.type = 'object' AND json_extract(j.value, '$.id') IS NOT NULL;
UPDATE agents SET sandboxes = '[]';
-- A heartbeat looks up the agent's starting and resuming sandboxes: by (agent, state), not
-- by reading every sandbox of the agent. The old index is this one's prefix.
DROP INDEX sandboxes_agent_id;
CREATE INDEX sandboxes_agent_state ON sandboxes (agent_id, state);

-- +goose Down
DROP INDEX sandboxes_agent_state;
CREATE INDEX sandboxes_agent_id ON sandboxes (agent_id);
DROP TABLE agent_held;
ALTER TABLE agents DROP COLUMN held_boot;
ALTER TABLE agents DROP COLUMN held_seq;

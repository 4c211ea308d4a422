-- Berth schema, version 12: heartbeats cost what changed, not what is held (issue 16, goal 2).
-- An agent's held sandboxes live one row each in agent_held, so a delta heartbeat writes the
-- rows it changes instead of rewriting the whole list (agents.sandboxes is no longer written
-- and is emptied here). held_boot/held_seq name the heartbeat whose held list agent_held
-- holds: a delta applies only onto exactly that base. Kept in step between
-- store/sqlite/migrations and store/postgres/migrations.

-- +goose Up
CREATE TABLE agent_held (
    agent_id    TEXT COLLATE "C" NOT NULL,
    sandbox_id  TEXT COLLATE "C" NOT NULL,
    resident_mb BIGINT  NOT NULL DEFAULT 0,
    measured    BOOLEAN NOT NULL DEFAULT FALSE,
    starting    BOOLEAN NOT NULL DEFAULT FALSE,
    oom_kills   BIGINT  NOT NULL DEFAULT 0,
    PRIMARY KEY (agent_id, sandbox_id)
);
ALTER TABLE agents ADD COLUMN held_boot TEXT NOT NULL DEFAULT '';
ALTER TABLE agents ADD COLUMN held_seq BIGINT NOT NULL DEFAULT 0;
INSERT INTO agent_held (agent_id, sandbox_id, resident_mb, measured, starting, oom_kills)
    SELECT a.id, j->>'id', COALESCE((j->>'resident_mb')::BIGINT, 0),
           COALESCE((j->>'measured')::BOOLEAN, FALSE), COALESCE((j->>'starting')::BOOLEAN, FALSE),
           COALESCE((j->>'oom_kills')::BIGINT, 0)
    FROM agents a,
         jsonb_array_elements(CASE WHEN jsonb_typeof(a.sandboxes) = 'array' THEN a.sandboxes ELSE '[]'::jsonb END) j
    WHERE jsonb_typeof(j) = 'object' AND j->>'id' IS NOT NULL
    ON CONFLICT DO NOTHING;
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

-- Berth schema, version 15: the agent's incarnation of each copy it holds (AGT-6). A copy
-- whose sandbox the store places on another host, or on none (paused), is left over from a
-- create or checkpoint whose answer was lost; the sweep reads the incarnation here to stop
-- that copy only, never one placed on the agent again since. 0 for agents that do not number
-- their copies (never stopped as stale). Kept in step between store/sqlite/migrations and
-- store/postgres/migrations.

-- +goose Up
ALTER TABLE agent_held ADD COLUMN incarnation BIGINT NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE agent_held DROP COLUMN incarnation;

-- Berth schema, version 8: heartbeats are ordered by the agent's sequence number, never by its
-- clock (C32). agents.heartbeat_seq is the Seq of the latest heartbeat applied for the agent's
-- current boot (0 = the agent does not number its heartbeats, or rows from before this version).

-- +goose Up
ALTER TABLE agents ADD COLUMN heartbeat_seq INTEGER NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE agents DROP COLUMN heartbeat_seq;

-- Berth schema, version 8: the PostgreSQL translation of store/sqlite/migrations/00008_heartbeat_seq.sql
-- (C32). agents.heartbeat_seq is the Seq of the latest heartbeat applied for the agent's current
-- boot (0 = not numbered).

-- +goose Up
ALTER TABLE agents ADD COLUMN heartbeat_seq BIGINT NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE agents DROP COLUMN heartbeat_seq;

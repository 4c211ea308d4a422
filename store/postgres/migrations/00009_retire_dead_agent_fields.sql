-- Berth schema, version 9: the PostgreSQL translation of
-- store/sqlite/migrations/00009_retire_dead_agent_fields.sql (issue 14): natid_free and
-- stream_restore_enabled, which nothing read, are gone.

-- +goose Up
ALTER TABLE agents DROP COLUMN natid_free;
ALTER TABLE agents DROP COLUMN stream_restore_enabled;

-- +goose Down
ALTER TABLE agents ADD COLUMN natid_free BIGINT NOT NULL DEFAULT 0;
ALTER TABLE agents ADD COLUMN stream_restore_enabled BOOLEAN NOT NULL DEFAULT FALSE;

-- Berth schema, version 9: two heartbeat figures nothing read are gone (issue 14).
-- natid_free counted network slots of a pool that does not exist (sandboxes have no network
-- but their own loopback); stream_restore_enabled was never set by any agent — whether an
-- agent restores is agents.checkpoint (ISO-4).

-- +goose Up
ALTER TABLE agents DROP COLUMN natid_free;
ALTER TABLE agents DROP COLUMN stream_restore_enabled;

-- +goose Down
ALTER TABLE agents ADD COLUMN natid_free INTEGER NOT NULL DEFAULT 0;
ALTER TABLE agents ADD COLUMN stream_restore_enabled INTEGER NOT NULL DEFAULT 0;

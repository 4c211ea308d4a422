-- Berth schema, version 2: the PostgreSQL translation of store/sqlite/migrations/00002_quarantine.sql.
-- create_failures counts consecutive creates that failed on the host after admission;
-- quarantined_until (unix ms, NULL = not quarantined) keeps it out of placement until then.

-- +goose Up
ALTER TABLE agents ADD COLUMN create_failures INTEGER NOT NULL DEFAULT 0;
ALTER TABLE agents ADD COLUMN quarantined_until BIGINT;

-- +goose Down
ALTER TABLE agents DROP COLUMN quarantined_until;
ALTER TABLE agents DROP COLUMN create_failures;

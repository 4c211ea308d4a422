-- Berth schema, version 2: quarantine of hosts that keep failing creates (PLC-9, C19).
-- create_failures counts consecutive creates that failed on the host after admission;
-- quarantined_until (unix ms, NULL = not quarantined) keeps it out of placement until then.

-- +goose Up
ALTER TABLE agents ADD COLUMN create_failures INTEGER NOT NULL DEFAULT 0;
ALTER TABLE agents ADD COLUMN quarantined_until INTEGER;

-- +goose Down
ALTER TABLE agents DROP COLUMN quarantined_until;
ALTER TABLE agents DROP COLUMN create_failures;

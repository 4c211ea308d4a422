-- Berth schema, version 4: tenant quotas (ADM-11). Zero means no limit.

-- +goose Up
CREATE TABLE quotas (
    tenant        TEXT    NOT NULL PRIMARY KEY REFERENCES tenants (name),
    max_sandboxes INTEGER NOT NULL DEFAULT 0,
    max_memory_mb INTEGER NOT NULL DEFAULT 0
);

-- +goose Down
DROP TABLE quotas;

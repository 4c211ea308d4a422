-- Berth schema, version 4: the PostgreSQL translation of store/sqlite/migrations/00004_quotas.sql.

-- +goose Up
CREATE TABLE quotas (
    tenant        TEXT COLLATE "C" NOT NULL PRIMARY KEY REFERENCES tenants (name),
    max_sandboxes INTEGER NOT NULL DEFAULT 0,
    max_memory_mb BIGINT  NOT NULL DEFAULT 0
);

-- +goose Down
DROP TABLE quotas;

-- Berth schema, version 5: the PostgreSQL translation of store/sqlite/migrations/00005_apps.sql
-- (APP-1).

-- +goose Up
CREATE TABLE apps (
    name     TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    tenant   TEXT COLLATE "C" NOT NULL,
    state    TEXT    NOT NULL,
    revision BIGINT  NOT NULL,
    doc      TEXT    NOT NULL
);
CREATE INDEX apps_tenant ON apps (tenant, name);

-- +goose Down
DROP TABLE apps;

-- Berth schema, version 5: apps (APP-1). The record is one JSON document; the columns beside
-- it are what queries select on (name, tenant) and what writes compare (revision).

-- +goose Up
CREATE TABLE apps (
    name     TEXT    NOT NULL PRIMARY KEY,
    tenant   TEXT    NOT NULL,
    state    TEXT    NOT NULL,
    revision INTEGER NOT NULL,
    doc      TEXT    NOT NULL
);
CREATE INDEX apps_tenant ON apps (tenant, name);

-- +goose Down
DROP TABLE apps;

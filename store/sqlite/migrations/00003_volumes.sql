-- Berth schema, version 3: volumes, named durable directories pinned to a host (POOL-2).

-- +goose Up
CREATE TABLE volumes (
    tenant     TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    agent_id   TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (tenant, name)
);

-- +goose Down
DROP TABLE volumes;

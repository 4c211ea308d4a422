-- Berth schema, version 3: the PostgreSQL translation of store/sqlite/migrations/00003_volumes.sql.

-- +goose Up
CREATE TABLE volumes (
    tenant     TEXT COLLATE "C" NOT NULL,
    name       TEXT COLLATE "C" NOT NULL,
    agent_id   TEXT COLLATE "C" NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (tenant, name)
);

-- +goose Down
DROP TABLE volumes;

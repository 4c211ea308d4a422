-- Berth schema, version 11: per-agent credentials (issue 15, point 1; TRUST-1). An agent joins
-- with the fleet's join (node) token and gets a credential bound to its agent_id; only the hex
-- SHA-256 of the secret is kept. revoked_by is 'rejoin' or 'admin'. Kept in step between
-- store/sqlite/migrations and store/postgres/migrations.

-- +goose Up
CREATE TABLE agent_credentials (
    hash       TEXT NOT NULL PRIMARY KEY,
    agent_id   TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    revoked_at BIGINT,
    revoked_by TEXT NOT NULL DEFAULT ''
);
CREATE INDEX agent_credentials_agent ON agent_credentials (agent_id, created_at);

-- +goose Down
DROP TABLE agent_credentials;

-- Berth schema, version 1.
--
-- Portability rules (a PostgreSQL port is a line-by-line translation):
--   * timestamps are INTEGER unix milliseconds UTC (BIGINT in PostgreSQL); NULL means "unset";
--   * booleans are INTEGER 0/1 (SMALLINT or BOOLEAN in PostgreSQL);
--   * lists and maps are JSON text (JSONB in PostgreSQL);
--   * REAL becomes DOUBLE PRECISION, INTEGER PRIMARY KEY AUTOINCREMENT becomes BIGSERIAL.

-- +goose Up

-- agents holds the latest heartbeat of every agent (AGT-1) plus what the server adds:
-- last_seen (server clock), the operator drain and the status the agent itself reported.
CREATE TABLE agents (
    id                     TEXT    NOT NULL PRIMARY KEY,
    address                TEXT    NOT NULL DEFAULT '',
    region                 TEXT    NOT NULL DEFAULT '',
    pool                   TEXT    NOT NULL DEFAULT '',
    preemptible            INTEGER NOT NULL DEFAULT 0,
    heartbeat_at           INTEGER,
    status                 TEXT    NOT NULL,
    reported_status        TEXT    NOT NULL DEFAULT '',
    cpu_total              REAL    NOT NULL DEFAULT 0,
    cpu_used               REAL    NOT NULL DEFAULT 0,
    memory_mb_total        INTEGER NOT NULL DEFAULT 0,
    memory_mb_used         INTEGER NOT NULL DEFAULT 0,
    memory_mb_committed    INTEGER NOT NULL DEFAULT 0,
    memory_admission       TEXT    NOT NULL DEFAULT '',
    memory_mb_admittable   INTEGER NOT NULL DEFAULT 0,
    intake_open            INTEGER NOT NULL DEFAULT 0,
    memory_pressure        REAL    NOT NULL DEFAULT 0,
    starts_in_flight       INTEGER NOT NULL DEFAULT 0,
    natid_free             INTEGER NOT NULL DEFAULT 0,
    stream_restore_enabled INTEGER NOT NULL DEFAULT 0,
    sandboxes              TEXT    NOT NULL DEFAULT '[]',
    ended                  TEXT    NOT NULL DEFAULT '[]',
    version                TEXT    NOT NULL DEFAULT '',
    boot_id                TEXT    NOT NULL DEFAULT '',
    measurement_errors     INTEGER NOT NULL DEFAULT 0,
    last_seen              INTEGER NOT NULL,
    drain_reason           TEXT    NOT NULL DEFAULT ''
);

CREATE TABLE templates (
    name      TEXT    NOT NULL PRIMARY KEY,
    memory_mb INTEGER NOT NULL,
    vcpus     INTEGER NOT NULL
);

CREATE TABLE sandboxes (
    id              TEXT    NOT NULL PRIMARY KEY,
    template        TEXT    NOT NULL DEFAULT '',
    tenant          TEXT    NOT NULL DEFAULT '',
    agent_id        TEXT    NOT NULL DEFAULT '',
    state           TEXT    NOT NULL,
    memory_mb       INTEGER NOT NULL DEFAULT 0,
    vcpus           INTEGER NOT NULL DEFAULT 0,
    stateful        INTEGER NOT NULL DEFAULT 0,
    created_at      INTEGER NOT NULL,
    expires_at      INTEGER,
    metadata        TEXT,
    reason          TEXT    NOT NULL DEFAULT '',
    idempotency_key TEXT
);

-- API-4: one sandbox per (tenant, Idempotency-Key); a failed create sets its key to NULL.
CREATE UNIQUE INDEX sandboxes_tenant_idempotency_key
    ON sandboxes (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX sandboxes_state ON sandboxes (state);
CREATE INDEX sandboxes_agent_id ON sandboxes (agent_id);
CREATE INDEX sandboxes_tenant_created_at ON sandboxes (tenant, created_at);

-- reservations is the ledger (LED-1…4); mib is MiB charged against agent_id.
CREATE TABLE reservations (
    id         TEXT    NOT NULL PRIMARY KEY,
    agent_id   TEXT    NOT NULL,
    sandbox_id TEXT    NOT NULL DEFAULT '',
    mib        INTEGER NOT NULL,
    owner      TEXT    NOT NULL DEFAULT '',
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);

CREATE INDEX reservations_agent_id ON reservations (agent_id);
CREATE INDEX reservations_sandbox_id ON reservations (sandbox_id);

-- events is the append-only log of every transition (LIF-3).
CREATE TABLE events (
    id         INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    at         INTEGER NOT NULL,
    entity     TEXT    NOT NULL,
    from_state TEXT    NOT NULL DEFAULT '',
    to_state   TEXT    NOT NULL DEFAULT '',
    reason     TEXT    NOT NULL DEFAULT '',
    actor      TEXT    NOT NULL DEFAULT ''
);

CREATE INDEX events_entity ON events (entity);
CREATE INDEX events_at ON events (at);

CREATE TABLE tenants (
    name       TEXT    NOT NULL PRIMARY KEY,
    created_at INTEGER
);

-- api_keys keeps only the hex SHA-256 of each secret (API-1).
CREATE TABLE api_keys (
    id         TEXT    NOT NULL PRIMARY KEY,
    tenant     TEXT    NOT NULL REFERENCES tenants (name),
    role       TEXT    NOT NULL,
    hash       TEXT    NOT NULL UNIQUE,
    created_at INTEGER
);

-- +goose Down
DROP TABLE api_keys;
DROP TABLE tenants;
DROP TABLE events;
DROP TABLE reservations;
DROP TABLE sandboxes;
DROP TABLE templates;
DROP TABLE agents;

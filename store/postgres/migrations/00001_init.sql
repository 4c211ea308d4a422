-- Berth schema, version 1: the PostgreSQL translation of store/sqlite/migrations/00001_init.sql.
-- Same tables, columns and meaning; TestSchemaInStepWithSQLite compares the two.
--
-- Translation rules:
--   * timestamps are BIGINT unix milliseconds UTC, as in SQLite; NULL means "unset";
--   * booleans are BOOLEAN (SQLite: INTEGER 0/1);
--   * lists and maps are JSONB (SQLite: JSON text);
--   * REAL is DOUBLE PRECISION, every INTEGER is BIGINT (SQLite integers are 64-bit);
--   * ids, names and entities are COLLATE "C", so ordering and the event prefix range compare
--     bytes exactly as SQLite's BINARY collation does, whatever the database's default.

-- +goose Up

-- agents holds the latest heartbeat of every agent (AGT-1) plus what the server adds:
-- last_seen (server clock), the operator drain and the status the agent itself reported.
CREATE TABLE agents (
    id                     TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    address                TEXT             NOT NULL DEFAULT '',
    region                 TEXT             NOT NULL DEFAULT '',
    pool                   TEXT             NOT NULL DEFAULT '',
    preemptible            BOOLEAN          NOT NULL DEFAULT FALSE,
    heartbeat_at           BIGINT,
    status                 TEXT             NOT NULL,
    reported_status        TEXT             NOT NULL DEFAULT '',
    cpu_total              DOUBLE PRECISION NOT NULL DEFAULT 0,
    cpu_used               DOUBLE PRECISION NOT NULL DEFAULT 0,
    memory_mb_total        BIGINT           NOT NULL DEFAULT 0,
    memory_mb_used         BIGINT           NOT NULL DEFAULT 0,
    memory_mb_committed    BIGINT           NOT NULL DEFAULT 0,
    memory_admission       TEXT             NOT NULL DEFAULT '',
    memory_mb_admittable   BIGINT           NOT NULL DEFAULT 0,
    intake_open            BOOLEAN          NOT NULL DEFAULT FALSE,
    memory_pressure        DOUBLE PRECISION NOT NULL DEFAULT 0,
    starts_in_flight       BIGINT           NOT NULL DEFAULT 0,
    natid_free             BIGINT           NOT NULL DEFAULT 0,
    stream_restore_enabled BOOLEAN          NOT NULL DEFAULT FALSE,
    sandboxes              JSONB            NOT NULL DEFAULT '[]',
    ended                  JSONB            NOT NULL DEFAULT '[]',
    version                TEXT             NOT NULL DEFAULT '',
    boot_id                TEXT             NOT NULL DEFAULT '',
    measurement_errors     BIGINT           NOT NULL DEFAULT 0,
    last_seen              BIGINT           NOT NULL,
    drain_reason           TEXT             NOT NULL DEFAULT ''
);

CREATE TABLE templates (
    name      TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    memory_mb BIGINT           NOT NULL,
    vcpus     BIGINT           NOT NULL
);

CREATE TABLE sandboxes (
    id              TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    template        TEXT             NOT NULL DEFAULT '',
    tenant          TEXT COLLATE "C" NOT NULL DEFAULT '',
    agent_id        TEXT COLLATE "C" NOT NULL DEFAULT '',
    state           TEXT             NOT NULL,
    memory_mb       BIGINT           NOT NULL DEFAULT 0,
    vcpus           BIGINT           NOT NULL DEFAULT 0,
    stateful        BOOLEAN          NOT NULL DEFAULT FALSE,
    created_at      BIGINT           NOT NULL,
    expires_at      BIGINT,
    metadata        JSONB,
    reason          TEXT             NOT NULL DEFAULT '',
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
    id         TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    agent_id   TEXT COLLATE "C" NOT NULL,
    sandbox_id TEXT COLLATE "C" NOT NULL DEFAULT '',
    mib        BIGINT           NOT NULL,
    owner      TEXT             NOT NULL DEFAULT '',
    created_at BIGINT           NOT NULL,
    expires_at BIGINT           NOT NULL
);

CREATE INDEX reservations_agent_id ON reservations (agent_id);
CREATE INDEX reservations_sandbox_id ON reservations (sandbox_id);

-- events is the append-only log of every transition (LIF-3).
CREATE TABLE events (
    id         BIGSERIAL        NOT NULL PRIMARY KEY,
    at         BIGINT           NOT NULL,
    entity     TEXT COLLATE "C" NOT NULL,
    from_state TEXT             NOT NULL DEFAULT '',
    to_state   TEXT             NOT NULL DEFAULT '',
    reason     TEXT             NOT NULL DEFAULT '',
    actor      TEXT             NOT NULL DEFAULT ''
);

CREATE INDEX events_entity ON events (entity);
CREATE INDEX events_at ON events (at);

CREATE TABLE tenants (
    name       TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    created_at BIGINT
);

-- api_keys keeps only the hex SHA-256 of each secret (API-1).
CREATE TABLE api_keys (
    id         TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    tenant     TEXT COLLATE "C" NOT NULL REFERENCES tenants (name),
    role       TEXT             NOT NULL,
    hash       TEXT             NOT NULL UNIQUE,
    created_at BIGINT
);

-- +goose Down
DROP TABLE api_keys;
DROP TABLE tenants;
DROP TABLE events;
DROP TABLE reservations;
DROP TABLE sandboxes;
DROP TABLE templates;
DROP TABLE agents;

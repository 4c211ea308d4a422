-- Berth schema, version 7: the PostgreSQL translation of store/sqlite/migrations/00007_idempotency.sql
-- (API-4, C26). sandboxes.request_hash binds an Idempotency-Key to its create ('' = from before
-- this version); idempotent_calls holds each keyed call's request hash and, once answered, its
-- status and JSON body (status 0 = in flight); created_at is unix ms.

-- +goose Up
ALTER TABLE sandboxes ADD COLUMN request_hash TEXT NOT NULL DEFAULT '';
CREATE TABLE idempotent_calls (
    scope        TEXT COLLATE "C" NOT NULL,
    key          TEXT COLLATE "C" NOT NULL,
    request_hash TEXT             NOT NULL,
    status       INTEGER          NOT NULL,
    answer       BYTEA,
    created_at   BIGINT           NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX idempotent_calls_created_at ON idempotent_calls (created_at);

-- +goose Down
DROP TABLE idempotent_calls;
ALTER TABLE sandboxes DROP COLUMN request_hash;

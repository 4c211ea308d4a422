-- Berth schema, version 7: an Idempotency-Key binds to its request and its answer (API-4, C26).
-- sandboxes.request_hash is the hash of the create that holds the row's idempotency_key ('' for
-- rows from before this version, which are then not compared).
-- idempotent_calls: one row per (scope, key) of a call made with an Idempotency-Key; status 0
-- while the call is in flight, else the HTTP status of the answer whose JSON body is answer.
-- created_at is unix ms; rows older than a day are forgotten by the sweeper.

-- +goose Up
ALTER TABLE sandboxes ADD COLUMN request_hash TEXT NOT NULL DEFAULT '';
CREATE TABLE idempotent_calls (
    scope        TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    request_hash TEXT    NOT NULL,
    status       INTEGER NOT NULL,
    answer       BLOB,
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX idempotent_calls_created_at ON idempotent_calls (created_at);

-- +goose Down
DROP TABLE idempotent_calls;
ALTER TABLE sandboxes DROP COLUMN request_hash;

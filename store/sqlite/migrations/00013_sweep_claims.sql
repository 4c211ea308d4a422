-- Berth schema, version 13: fleet-wide sweeps that one replica does for all (issue 16, goal 2).
-- One row per such sweep: when a replica last claimed it (unix ms). A replica runs the sweep
-- only if its conditional upsert of this row succeeds (Store.ClaimSweep), so N replicas run
-- it once per period, not N times. Kept in step between store/sqlite/migrations and
-- store/postgres/migrations.

-- +goose Up
CREATE TABLE sweep_claims (
    name       TEXT NOT NULL PRIMARY KEY,
    claimed_at INTEGER NOT NULL
);

-- +goose Down
DROP TABLE sweep_claims;

-- Berth schema, version 14: what a refusal's Retry-After estimate reads (API-3; issue 16,
-- goal 6), without reading every running sandbox or held row (half a million each at 10,000
-- hosts). sandboxes_state_expiry orders the running sandboxes by expiry, so "which expires
-- first on an open host" reads its first entries; it replaces the index on state alone, which
-- it serves as well, so a create maintains no more indexes than before. agent_held_unmeasured
-- holds only the guests not yet measured (a second or so after each starts): a guest enters
-- it once and leaves it once. Kept in step between store/sqlite/migrations and
-- store/postgres/migrations.

-- +goose Up
CREATE INDEX sandboxes_state_expiry ON sandboxes (state, expires_at, id);
DROP INDEX sandboxes_state;
CREATE INDEX agent_held_unmeasured ON agent_held (agent_id, sandbox_id) WHERE NOT measured;

-- +goose Down
DROP INDEX agent_held_unmeasured;
CREATE INDEX sandboxes_state ON sandboxes (state);
DROP INDEX sandboxes_state_expiry;

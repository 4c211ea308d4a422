// Package postgres is the shared store of Berth: every root store interface (berth.Store) and
// berth.AgentWatcher on one PostgreSQL database through pgx/v5, for any number of server
// replicas (issue 3; SPEC LED-1…4, PLC-5, API-4). store/storetest pins that it behaves exactly
// as store/sqlite does; the schema is the same, translated (migrations/00001_init.sql).
//
// The queries are store/internal/sqlstore's, shared with store/sqlite, run on pgx natively
// over one pgxpool (pgdb.go adapts pgx to sqlstore's query interface); this package holds
// PostgreSQL's dialect (placeholders, row locks, NOTIFY, array arguments, retried aborts),
// the migrations under an advisory lock (goose through pgx's database/sql driver), and
// WatchAgents on a dedicated pgx connection (LISTEN).
//
// Concurrency: every write is one READ COMMITTED transaction whose event rows are written in
// it (LIF-3). Where a read decides a write, the row read is locked first (SELECT … FOR UPDATE),
// so replicas serialise on it; a transaction that PostgreSQL aborts as a deadlock or
// serialisation victim is retried a few times. Errors from an unreachable server come back as
// ordinary wrapped errors; the pool reconnects by itself once the server is back.
package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/store/internal/sqlstore"
)

//go:embed migrations/*.sql
var migrations embed.FS

const (
	// connectTimeout bounds opening one connection when the URL sets no connect_timeout, so
	// a server that does not answer fails calls instead of hanging them.
	connectTimeout = 5 * time.Second
	// pingTimeout bounds Ping (for /readyz) and the watcher's liveness probe.
	pingTimeout = 2 * time.Second
	// migrateLockID keys the session advisory lock held while migrating, so replicas starting
	// together apply each migration once (crc32 of "berth.migrate"). Advisory locks are per
	// database, so it does not collide with other databases of the cluster.
	migrateLockID = 0x93a1_9748
)

// Store is the PostgreSQL implementation of berth.Store and berth.AgentWatcher. It is safe for
// concurrent use, and any number of Stores (replicas) may share one database.
type Store struct {
	*sqlstore.Store // the shared queries, with the PostgreSQL dialect
	pool            *pgxpool.Pool
	conn            *pgx.ConnConfig // for the dedicated connections of migrations and WatchAgents
}

// dialect is PostgreSQL's part of the shared store: $n placeholders, SELECT … FOR UPDATE row
// locks (replicas serialise on the rows a write reads, LED-1), GREATEST, agent changes as
// NOTIFY in the transaction (PLC-5), change cursors from transaction ids (a read of the agents
// changed since the last one, issue 16 goal 2), and deadlock (40P01) or serialisation (40001) victims
// retried.
func dialect() sqlstore.Dialect {
	return sqlstore.Dialect{
		Name:      "postgres",
		Rebind:    sqlstore.DollarRebind,
		ForUpdate: " FOR UPDATE",
		ArrayArgs: true,
		Pipelines: true,
		LazyBegin: true,
		WriteCTE:  true,
		Greatest:  "GREATEST",
		// A 64-bit hash of the name: a collision only makes two names wait for each other.
		LockNameSQL:       `SELECT pg_advisory_xact_lock(hashtextextended(?, 0))`,
		LockNameSharedSQL: `SELECT pg_advisory_xact_lock_shared(hashtextextended(?, 0))`,
		// A read's cursor is the xmin of a snapshot taken just before it: every transaction
		// numbered below it had ended, so the read saw what it committed. A row's xmin is the
		// transaction that last wrote it; age() compares two 32-bit ids modulo wraparound
		// (a cursor is seconds old, a frozen row's age is the largest there is). The
		// identity is the server's start time and the database's oid: transaction ids mean
		// nothing on another server (a switchover) or in a database created again (a dump
		// restored), and a restarted server costs one whole read.
		ChangeCursorSQL: `SELECT pg_postmaster_start_time()::text || ' ' || d.oid::text,
			pg_snapshot_xmin(pg_current_snapshot())::text FROM pg_database d WHERE d.datname = current_database()`,
		ChangedSinceSQL: `age(xmin) <= age(CAST(CAST(? AS text) AS xid8)::xid)`,
		NotifyAgent: func(ctx context.Context, tx *sqlstore.Tx, id string) error {
			if err := tx.Exec(ctx, `SELECT pg_notify(?, ?)`, AgentsChannel, id); err != nil {
				return fmt.Errorf("postgres: notify agent %q: %w", id, err)
			}
			return nil
		},
		Retryable: func(err error) bool {
			var pgErr *pgconn.PgError
			return errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001")
		},
	}
}

var (
	_ berth.Store        = (*Store)(nil)
	_ berth.AgentWatcher = (*Store)(nil)
	_ berth.ConnStater   = (*Store)(nil)
)

// ConnStats implements berth.ConnStater from pgxpool's statistics (pool_max_conns, default
// max(4, CPUs), bounds the pool). WatchAgents' and migrations' own connections are not in it.
func (s *Store) ConnStats() berth.ConnStats {
	st := s.pool.Stat()
	return berth.ConnStats{Max: int(st.MaxConns()), InUse: int(st.AcquiredConns()),
		Waits: st.EmptyAcquireCount(), Waited: st.EmptyAcquireWaitTime()}
}

// Open connects to the database at url (a postgres:// URL or key=value DSN, as libpq takes;
// pool_max_conns and the other pgxpool parameters apply) and applies every pending migration.
// Replicas may Open the same database at once: migrations run under a session advisory lock.
// A URL without connect_timeout gets 5 s.
func Open(ctx context.Context, url string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("postgres: parse url: %w", err)
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = connectTimeout
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: open: %w", err)
	}
	s := &Store{Store: sqlstore.New(pgDB{pool}, dialect()), pool: pool, conn: cfg.ConnConfig}
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

// migrate applies the embedded migrations the database has not seen yet. A connection of its
// own holds pg_advisory_lock for the whole run (others block until it is done, then find
// nothing to do); closing that connection ends the session and so frees the lock even when a
// migration fails or ctx ends.
func (s *Store) migrate(ctx context.Context) error {
	lockConn, err := pgx.ConnectConfig(ctx, s.conn.Copy())
	if err != nil {
		return fmt.Errorf("postgres: migrate: %w", err)
	}
	defer closeConn(lockConn)
	if _, err := lockConn.Exec(ctx, `SELECT pg_advisory_lock($1)`, int64(migrateLockID)); err != nil {
		return fmt.Errorf("postgres: migrate: lock: %w", err)
	}
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return fmt.Errorf("postgres: migrations: %w", err)
	}
	db := stdlib.OpenDBFromPool(s.pool)
	defer db.Close()
	return sqlstore.Migrate(ctx, "postgres", db, goose.DialectPostgres, sub)
}

// closeConn closes a dedicated connection, giving the goodbye at most a second.
func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
}

// Close closes every pooled connection. Running WatchAgents calls hold their own connection
// and end with their context.
func (s *Store) Close() error { return s.Store.Close() }

// Package postgres is the shared store of Berth: every root store interface (berth.Store) and
// berth.AgentWatcher on one PostgreSQL database through pgx/v5, for any number of server
// replicas (issue 3; SPEC LED-1…4, PLC-5, API-4). store/storetest pins that it behaves exactly
// as store/sqlite does; the schema is the same, translated (migrations/00001_init.sql).
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
	"github.com/berth-dev/berth/store/internal/evlog"
)

//go:embed migrations/*.sql
var migrations embed.FS

const (
	// connectTimeout bounds opening one connection when the URL sets no connect_timeout, so
	// a server that does not answer fails calls instead of hanging them.
	connectTimeout = 5 * time.Second
	// pingTimeout bounds Ping (for /readyz) and the watcher's liveness probe.
	pingTimeout = 2 * time.Second
	// txAttempts is how many times a transaction aborted by a deadlock or a serialisation
	// failure is run in all.
	txAttempts = 5
	// migrateLockID keys the session advisory lock held while migrating, so replicas starting
	// together apply each migration once (crc32 of "berth.migrate"). Advisory locks are per
	// database, so it does not collide with other databases of the cluster.
	migrateLockID = 0x93a1_9748
)

// Store is the PostgreSQL implementation of berth.Store and berth.AgentWatcher. It is safe for
// concurrent use, and any number of Stores (replicas) may share one database.
type Store struct {
	pool   *pgxpool.Pool
	conn   *pgx.ConnConfig // for the dedicated connections of migrations and WatchAgents
	events evlog.Hook      // LogEvents
}

// LogEvents implements berth.EventLogger: fn sees every event after its commit.
func (s *Store) LogEvents(fn func(berth.Event)) { s.events.Set(fn) }

var (
	_ berth.Store        = (*Store)(nil)
	_ berth.AgentWatcher = (*Store)(nil)
)

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
	s := &Store{pool: pool, conn: cfg.ConnConfig}
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
	p, err := goose.NewProvider(goose.DialectPostgres, db, sub, goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return fmt.Errorf("postgres: migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("postgres: migrate: %w", err)
	}
	return nil
}

// closeConn closes a dedicated connection, giving the goodbye at most a second.
func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
}

// Ping checks that the database answers a query (for /readyz). It gives up after 2 s, or
// sooner if ctx ends, so a down server fails it fast.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	var one int
	if err := s.pool.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		return fmt.Errorf("postgres: ping: %w", err)
	}
	return nil
}

// Close closes every pooled connection. Running WatchAgents calls hold their own connection
// and end with their context.
func (s *Store) Close() error {
	s.pool.Close()
	return nil
}

// inTx runs fn in one READ COMMITTED transaction, committing when fn returns nil. A
// transaction aborted as a deadlock victim or by a serialisation failure is run again, up to
// txAttempts times in all, so fn must set its results afresh on every run.
func (s *Store) inTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	for attempt := 1; ; attempt++ {
		err := s.tryTx(ctx, fn)
		var pgErr *pgconn.PgError
		if err == nil || attempt == txAttempts || !errors.As(err, &pgErr) ||
			(pgErr.Code != "40P01" && pgErr.Code != "40001") {
			return err
		}
	}
}

// tryTx is one run of inTx.
func (s *Store) tryTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("postgres: begin: %w", err)
	}
	done := s.events.Begin(tx) // per attempt: a retried transaction logs once
	if err := fn(tx); err != nil {
		_ = tx.Rollback(ctx)
		done(false)
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		done(false)
		return fmt.Errorf("postgres: commit: %w", err)
	}
	done(true)
	return nil
}

// insertEvent appends e to the event log inside tx (LIF-3).
func insertEvent(ctx context.Context, tx pgx.Tx, e berth.Event) error {
	_, err := tx.Exec(ctx,
		`INSERT INTO events (at, entity, from_state, to_state, reason, actor) VALUES ($1, $2, $3, $4, $5, $6)`,
		ms(e.At), e.Entity, e.From, e.To, e.Reason, e.Actor)
	if err != nil {
		return fmt.Errorf("postgres: event %s: %w", e.Entity, err)
	}
	evlog.Add(tx, e)
	return nil
}

// scanner is what pgx.Row and pgx.Rows have in common.
type scanner interface{ Scan(dest ...any) error }

// ms is t as unix milliseconds.
func ms(t time.Time) int64 { return t.UnixMilli() }

// nullMS is t as unix milliseconds, or NULL for the zero time.
func nullMS(t time.Time) *int64 {
	if t.IsZero() {
		return nil
	}
	v := t.UnixMilli()
	return &v
}

// fromMS turns unix milliseconds into a UTC time.
func fromMS(v int64) time.Time { return time.UnixMilli(v).UTC() }

// fromNullMS turns nullable unix milliseconds into a UTC time; NULL is the zero time.
func fromNullMS(v *int64) time.Time {
	if v == nil {
		return time.Time{}
	}
	return fromMS(*v)
}

// limitOr returns n, or def when n is not positive.
func limitOr(n, def int) int {
	if n <= 0 {
		return def
	}
	return n
}

// defaultLimit is the row limit of list calls whose filter leaves Limit at 0.
const defaultLimit = 1000

// terminalStates lists the terminal sandbox states (LIF-1) for "= ANY($n)".
var terminalStates = func() []string {
	var out []string
	for _, st := range berth.SandboxStates {
		if st.Terminal() {
			out = append(out, string(st))
		}
	}
	return out
}()

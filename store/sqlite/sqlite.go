// Package sqlite is the embedded store of Berth: every root store interface (berth.Store) on
// one SQLite database through the pure-Go driver modernc.org/sqlite. It is the default of
// `berth dev` and of a single server replica (SPEC §0); store/storetest pins its behaviour.
//
// Schema conventions keep a PostgreSQL port a translation: timestamps are INTEGER unix
// milliseconds UTC (so every time read back is UTC with millisecond precision), booleans are
// INTEGER 0/1, lists and maps are JSON text.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/pressly/goose/v3"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/store/internal/evlog"
)

//go:embed migrations/*.sql
var migrations embed.FS

// busyTimeoutMS is how long, in milliseconds, a connection waits for another writer's lock
// before failing with SQLITE_BUSY.
const busyTimeoutMS = 5000

// Store is the SQLite implementation of berth.Store. It is safe for concurrent use; write
// transactions begin IMMEDIATE so concurrent writers queue on the database lock instead of
// failing when they upgrade from read to write.
type Store struct {
	db     *sql.DB
	watch  watchers   // WatchAgents subscribers
	events evlog.Hook // LogEvents
}

// LogEvents implements berth.EventLogger: fn sees every event after its commit.
func (s *Store) LogEvents(fn func(berth.Event)) { s.events.Set(fn) }

var _ berth.Store = (*Store)(nil)

// Open opens (creating if needed) the database at dsn and applies every pending migration.
// dsn is a file path or ":memory:"; a memory database lives as long as the Store and is
// private to it (one connection, so every statement sees the same database). A file database
// runs in WAL mode with foreign keys on and a 5 s busy timeout.
func Open(ctx context.Context, dsn string) (*Store, error) {
	if dsn == "" {
		return nil, errors.New("sqlite: empty dsn")
	}
	memory := dsn == ":memory:"
	if !memory && strings.ContainsRune(dsn, '?') {
		// The driver treats everything after '?' as its own parameters.
		return nil, fmt.Errorf("sqlite: path %q must not contain '?'", dsn)
	}
	params := fmt.Sprintf("?_pragma=busy_timeout(%d)&_pragma=foreign_keys(1)&_txlock=immediate", busyTimeoutMS)
	if !memory {
		params += "&_pragma=journal_mode(WAL)"
	}
	db, err := sql.Open("sqlite", dsn+params)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %q: %w", dsn, err)
	}
	if memory {
		// Each connection to ":memory:" is its own database: keep exactly one, forever.
		db.SetMaxOpenConns(1)
		db.SetMaxIdleConns(1)
		db.SetConnMaxLifetime(0)
		db.SetConnMaxIdleTime(0)
	}
	s := &Store{db: db}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// migrate applies the embedded migrations that the database has not seen yet.
func (s *Store) migrate(ctx context.Context) error {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return fmt.Errorf("sqlite: migrations: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectSQLite3, s.db, sub, goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return fmt.Errorf("sqlite: migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("sqlite: migrate: %w", err)
	}
	return nil
}

// Ping checks that the database answers a query (for /readyz).
func (s *Store) Ping(ctx context.Context) error {
	var one int
	if err := s.db.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
		return fmt.Errorf("sqlite: ping: %w", err)
	}
	return nil
}

// Close closes the database; a memory database is gone afterwards.
func (s *Store) Close() error {
	return s.db.Close()
}

// inTx runs fn in one write transaction, committing when fn returns nil.
func (s *Store) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlite: begin: %w", err)
	}
	done := s.events.Begin(tx)
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		done(false)
		return err
	}
	if err := tx.Commit(); err != nil {
		done(false)
		return fmt.Errorf("sqlite: commit: %w", err)
	}
	done(true)
	return nil
}

// insertEvent appends e to the event log inside tx (LIF-3).
func insertEvent(ctx context.Context, tx *sql.Tx, e berth.Event) error {
	_, err := tx.ExecContext(ctx,
		`INSERT INTO events (at, entity, from_state, to_state, reason, actor) VALUES (?, ?, ?, ?, ?, ?)`,
		ms(e.At), e.Entity, e.From, e.To, e.Reason, e.Actor)
	if err != nil {
		return fmt.Errorf("sqlite: event %s: %w", e.Entity, err)
	}
	evlog.Add(tx, e)
	return nil
}

// ms is t as unix milliseconds.
func ms(t time.Time) int64 { return t.UnixMilli() }

// nullMS is t as unix milliseconds, or NULL for the zero time.
func nullMS(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixMilli()
}

// fromMS turns unix milliseconds into a UTC time.
func fromMS(v int64) time.Time { return time.UnixMilli(v).UTC() }

// fromNullMS turns nullable unix milliseconds into a UTC time; NULL is the zero time.
func fromNullMS(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return fromMS(v.Int64)
}

// b2i is a boolean as the INTEGER 0/1 the schema stores.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// jsonText marshals v for a JSON text column.
func jsonText(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("sqlite: encode json: %w", err)
	}
	return string(b), nil
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

// placeholders returns "?, ?, …" with n marks.
func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

// terminalStates lists the terminal sandbox states (LIF-1) for SQL IN clauses.
var terminalStates = func() []any {
	var out []any
	for _, st := range berth.SandboxStates {
		if st.Terminal() {
			out = append(out, string(st))
		}
	}
	return out
}()

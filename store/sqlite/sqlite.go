// Package sqlite is the embedded store of Berth: every root store interface (berth.Store) on
// one SQLite database through the pure-Go driver modernc.org/sqlite. It is the default of
// `berth dev` and of a single server replica (SPEC §0); store/storetest pins its behaviour.
//
// The queries are store/internal/sqlstore's, shared with store/postgres; this package holds
// SQLite's dialect (no row locks, MAX, the in-process agent watch of watch.go) and its
// migrations. Schema conventions keep the two schemas a translation: timestamps are INTEGER
// unix milliseconds UTC (so every time read back is UTC with millisecond precision), booleans
// are INTEGER 0/1, lists and maps are JSON text.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/pressly/goose/v3"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/store/internal/sqlstore"
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
	*sqlstore.Store          // the shared queries, with the SQLite dialect
	db              *sql.DB  // migrations, and the tests' PRAGMA checks
	watch           watchers // WatchAgents subscribers
}

// dialect is SQLite's part of the shared store: '?' placeholders as written, no row locks (a
// write transaction begins IMMEDIATE and so holds the database), MAX for the larger of two
// values, and agent changes fanned out in process after the commit (PLC-5).
func (s *Store) dialect() sqlstore.Dialect {
	return sqlstore.Dialect{
		Name:     "sqlite",
		Greatest: "MAX",
		NotifyAgent: func(_ context.Context, tx *sqlstore.Tx, id string) error {
			tx.AfterCommit(func() { s.watch.notify(id) })
			return nil
		},
	}
}

var (
	_ berth.Store      = (*Store)(nil)
	_ berth.ConnStater = (*Store)(nil)
)

// ConnStats implements berth.ConnStater from database/sql's statistics: a file database has
// no connection limit (Max 0; SQLite's own lock serializes writers, waiting up to its busy
// timeout, which is not counted here); an in-memory one has exactly one connection.
func (s *Store) ConnStats() berth.ConnStats {
	st := s.db.Stats()
	return berth.ConnStats{Max: st.MaxOpenConnections, InUse: st.InUse, Waits: st.WaitCount, Waited: st.WaitDuration}
}

// Open opens (creating if needed) the database at dsn and applies every pending migration.
// dsn is a file path or ":memory:"; a memory database lives as long as the Store and is
// private to it (one connection, so every statement sees the same database) and gone once
// the Store is closed. A file database runs in WAL mode with foreign keys on and a 5 s busy
// timeout.
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
	s.Store = sqlstore.New(sqlstore.SQLDB(db), s.dialect())
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
	return sqlstore.Migrate(ctx, "sqlite", s.db, goose.DialectSQLite3, sub)
}

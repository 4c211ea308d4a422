// Package sqlstore is the one implementation of berth.Store's query logic, shared by
// store/sqlite (modernc SQLite through database/sql, SQLDB) and store/postgres (pgx natively,
// through its own adapter). The shared code runs on a tiny query interface (Querier: Exec,
// Query, QueryRow; DB adds Begin) and a Dialect for what really differs between the two
// databases: placeholders, row locks, GREATEST/MAX, array arguments, the agent-change
// notification (PostgreSQL NOTIFY in the transaction, SQLite an in-process fan-out after the
// commit), retryable aborts and the ping timeout. store/storetest pins the behaviour on both.
//
// Queries are written once with '?' placeholders; the dialect rebinds them ('$1', '$2', … for
// PostgreSQL, cached per query text). Shared schema conventions: timestamps are BIGINT/INTEGER
// unix milliseconds UTC (NULL = unset), booleans are bound as Go bools (SQLite stores 0/1),
// lists and maps are JSON text (JSONB in PostgreSQL).
package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/store/internal/evlog"
	"github.com/pressly/goose/v3"
)

// Dialect is what differs between the SQL databases behind a Store.
type Dialect struct {
	// Name prefixes error messages ("sqlite", "postgres").
	Name string
	// Rebind turns a query written with '?' placeholders into the database's own; nil keeps
	// the query as written.
	Rebind func(query string) string
	// ForUpdate is appended to a SELECT whose rows a transaction is about to change (" FOR
	// UPDATE" in PostgreSQL, so replicas serialise on the row, LED-1; "" where a write
	// transaction already holds the whole database, as in SQLite).
	ForUpdate string
	// ArrayArgs says the driver takes a Go slice as one array argument, so "col = ANY(?)"
	// matches a list of any length with one query text (PostgreSQL: one prepared statement,
	// not one per list length); without it lists are expanded into "col IN (?, ?, …)".
	ArrayArgs bool
	// Pipelines says a transaction's statements can go to the database in one round trip
	// (its TxConn is a Batcher: PostgreSQL). RecordHeartbeat's one-batch path for the usual
	// delta runs only then: on SQLite, which has no network, its longer statements cost
	// more to parse than the round trips it saves (docs/PERFORMANCE.md).
	Pipelines bool
	// LazyBegin says a transaction's BEGIN travels with its first statement rather than on
	// a round trip of its own (PostgreSQL, pgx's Batch.BeginTx): RoundTrips does not count it.
	LazyBegin bool
	// WriteCTE says a WITH clause may hold an UPDATE whose rows the statement then uses
	// (PostgreSQL): a conditional transition and its event become one statement.
	WriteCTE bool
	// Greatest is the SQL function of the larger of two values ("GREATEST" or "MAX").
	Greatest string
	// NotifyAgent announces that agent id changed (PLC-5) from inside tx: it is delivered
	// after tx commits and never if it rolls back.
	NotifyAgent func(ctx context.Context, tx *Tx, id string) error
	// LockNameSQL takes a lock on its one argument, a name, held until the transaction ends,
	// so transactions about one name run one at a time even where they touch no common row
	// (PostgreSQL: a transaction-scoped advisory lock). Empty where write transactions are
	// serialized anyway (SQLite).
	LockNameSQL string
	// LockNameSharedSQL takes LockNameSQL's lock in shared mode: any number of transactions
	// hold it at once, none while one holds it through LockNameSQL (PostgreSQL: the shared
	// form of the advisory lock). Empty where LockNameSQL is.
	LockNameSharedSQL string
	// ChangeCursorSQL is a query of one row and two text columns: the identity of the
	// database (another server, another database, or the same server restarted reads
	// differently) and a position, a positive decimal integer, such that every transaction
	// the read that follows might not see is numbered at or after it (PostgreSQL: the oldest
	// transaction still running, its snapshot's xmin). It is taken before that read of the
	// agent table (Store.AgentsChangedSince). Empty: every read is whole (SQLite, one replica
	// on one file, whose whole reads are cheap).
	ChangeCursorSQL string
	// ChangedSinceSQL is the WHERE condition, with one ? for a position of ChangeCursorSQL,
	// that selects the agent rows last written by a transaction numbered at or after it.
	ChangedSinceSQL string
	// PingTimeout bounds Ping, so a server that does not answer fails it fast; 0: none.
	PingTimeout time.Duration
	// Retryable reports whether a transaction that failed with err may be run again
	// (deadlock or serialisation victims); nil: never.
	Retryable func(err error) bool
}

// txAttempts is how many times a transaction aborted with a Retryable error is run in all.
const txAttempts = 5

// Querier is the tiny query interface the shared code runs on, implemented by a database and
// by a transaction of it. Queries come already rebound to the database's placeholders.
// QueryRow's Scan must return sql.ErrNoRows (or an error wrapping it) when no row matched.
type Querier interface {
	Exec(ctx context.Context, query string, args ...any) (sql.Result, error)
	Query(ctx context.Context, query string, args ...any) (Rows, error)
	QueryRow(ctx context.Context, query string, args ...any) Row
}

// Rows is a result set being read.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// Row is the result of QueryRow.
type Row interface{ Scan(dest ...any) error }

// DB is a database: queries, transactions, and its closing.
type DB interface {
	Querier
	Begin(ctx context.Context) (TxConn, error)
	Close() error
}

// TxConn is one open transaction of a DB.
type TxConn interface {
	Querier
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// Store implements berth.Store (except what a backend adds, such as WatchAgents) on a DB. It
// is safe for concurrent use.
type Store struct {
	db     DB
	d      Dialect
	events evlog.Hook // LogEvents
	// trips counts the requests sent to the database (RoundTrips).
	trips atomic.Int64
}

// RoundTrips returns how many requests this Store has sent to its database: every
// statement, and every BEGIN, COMMIT and ROLLBACK (each one round trip to PostgreSQL; SQLite
// has no network, but the count is the same work). The server exports it as
// berth_store_round_trips_total, so `berth bench create` can report round trips per create
// (issue 16, goal 1).
func (s *Store) RoundTrips() int64 { return s.trips.Load() }

// New returns the Store over db speaking dialect d. The caller migrates db; Close closes it.
func New(db DB, d Dialect) *Store {
	if d.Rebind == nil {
		d.Rebind = func(q string) string { return q }
	}
	if d.NotifyAgent == nil {
		d.NotifyAgent = func(context.Context, *Tx, string) error { return nil }
	}
	return &Store{db: db, d: d}
}

// Lock modes of a named lock (Dialect.LockNameSQL, LockNameSharedSQL).
const (
	exclusive = false
	shared    = true
)

// lockSQL is the dialect's statement taking a named lock in mode shared or exclusive; ""
// where the dialect has none.
func (s *Store) lockSQL(shared bool) string {
	if shared {
		return s.d.LockNameSharedSQL
	}
	return s.d.LockNameSQL
}

// lockName takes the named lock in tx (nothing where the dialect has none).
func (s *Store) lockName(ctx context.Context, tx *Tx, name string, shared bool) error {
	q := s.lockSQL(shared)
	if q == "" {
		return nil
	}
	return tx.Exec(ctx, q, name)
}

// queueLockName queues the named lock in b where the dialect has one, and returns how many
// statements it queued (0 or 1), whose answers the reader skips.
func (s *Store) queueLockName(b *batch, name string, shared bool) int {
	q := s.lockSQL(shared)
	if q == "" {
		return 0
	}
	b.queue(q, name)
	return 1
}

// LogEvents implements berth.EventLogger: fn sees every event after its commit.
func (s *Store) LogEvents(fn func(berth.Event)) { s.events.Set(fn) }

// errorf is fmt.Errorf with the dialect's name in front.
func (s *Store) errorf(format string, args ...any) error {
	return fmt.Errorf(s.d.Name+": "+format, args...)
}

// conn runs '?' queries on a database or a transaction, rebinding them for the dialect and
// counting them in trips.
type conn struct {
	q      Querier
	rebind func(string) string
	trips  *atomic.Int64
}

func (c conn) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	c.trips.Add(1)
	return c.q.Exec(ctx, c.rebind(query), args...)
}

func (c conn) query(ctx context.Context, query string, args ...any) (Rows, error) {
	c.trips.Add(1)
	return c.q.Query(ctx, c.rebind(query), args...)
}

func (c conn) queryRow(ctx context.Context, query string, args ...any) Row {
	c.trips.Add(1)
	return c.q.QueryRow(ctx, c.rebind(query), args...)
}

// pool is the Store's database as a conn.
func (s *Store) pool() conn { return conn{q: s.db, rebind: s.d.Rebind, trips: &s.trips} }

// Tx is one write transaction of a Store.
type Tx struct {
	conn
	after []func() // run in order after the commit
}

// Exec runs a '?' statement in the transaction (for dialects).
func (t *Tx) Exec(ctx context.Context, query string, args ...any) error {
	_, err := t.exec(ctx, query, args...)
	return err
}

// AfterCommit queues fn to run once the transaction has committed (never after a rollback).
func (t *Tx) AfterCommit(fn func()) { t.after = append(t.after, fn) }

// inTx runs fn in one write transaction, committing when fn returns nil. A transaction the
// dialect calls Retryable is run again, up to txAttempts times in all, so fn must set its
// results afresh on every run.
func (s *Store) inTx(ctx context.Context, fn func(tx *Tx) error) error {
	for attempt := 1; ; attempt++ {
		err := s.tryTx(ctx, fn)
		if err == nil || attempt == txAttempts || s.d.Retryable == nil || !s.d.Retryable(err) {
			return err
		}
	}
}

// tryTx is one run of inTx.
func (s *Store) tryTx(ctx context.Context, fn func(tx *Tx) error) error {
	if !s.d.LazyBegin {
		s.trips.Add(1)
	}
	dbTx, err := s.db.Begin(ctx)
	if err != nil {
		return s.errorf("begin: %w", err)
	}
	tx := &Tx{conn: conn{q: dbTx, rebind: s.d.Rebind, trips: &s.trips}}
	done := s.events.Begin(tx) // per attempt: a retried transaction logs once
	if err := fn(tx); err != nil {
		s.trips.Add(1)
		_ = dbTx.Rollback(ctx)
		done(false)
		return err
	}
	s.trips.Add(1)
	if err := dbTx.Commit(ctx); err != nil {
		done(false)
		return s.errorf("commit: %w", err)
	}
	done(true)
	for _, f := range tx.after {
		f()
	}
	return nil
}

// insertEvent appends e to the event log inside tx (LIF-3).
func (s *Store) insertEvent(ctx context.Context, tx *Tx, e berth.Event) error {
	return s.insertEvents(ctx, tx, e)
}

// insertEvents appends evs to the event log inside tx, in order, with one statement (LIF-3).
func (s *Store) insertEvents(ctx context.Context, tx *Tx, evs ...berth.Event) error {
	if len(evs) == 0 {
		return nil
	}
	q, args := eventsInsert(evs)
	if _, err := tx.exec(ctx, q, args...); err != nil {
		return s.errorf("event %s: %w", evs[0].Entity, err)
	}
	for _, e := range evs {
		evlog.Add(tx, e)
	}
	return nil
}

// queueEvents queues insertEvents' statement in b (the batch's answers must then be read and
// its transaction committed for the events to be logged, as insertEvents').
func (s *Store) queueEvents(tx *Tx, b *batch, evs ...berth.Event) {
	q, args := eventsInsert(evs)
	b.queue(q, args...)
	for _, e := range evs {
		evlog.Add(tx, e)
	}
}

// eventsInsert is the one statement inserting evs (at least one).
func eventsInsert(evs []berth.Event) (string, []any) {
	q := `INSERT INTO events (at, entity, from_state, to_state, reason, actor) VALUES (?, ?, ?, ?, ?, ?)` +
		strings.Repeat(`, (?, ?, ?, ?, ?, ?)`, len(evs)-1)
	args := make([]any, 0, 6*len(evs))
	for _, e := range evs {
		args = append(args, ms(e.At), e.Entity, e.From, e.To, e.Reason, e.Actor)
	}
	return q, args
}

// scanner is what Row and Rows have in common.
type scanner interface{ Scan(dest ...any) error }

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

// jsonText marshals v for a JSON column.
func (s *Store) jsonText(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", s.errorf("encode json: %w", err)
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

// in returns the condition "col is one of vals" and its arguments, in the dialect's form
// (see Dialect.ArrayArgs). vals must not be empty.
func (s *Store) in(col string, vals []string) (string, []any) {
	if s.d.ArrayArgs {
		return col + " = ANY(?)", []any{vals}
	}
	args := make([]any, len(vals))
	for i, v := range vals {
		args[i] = v
	}
	return col + " IN (" + placeholders(len(vals)) + ")", args
}

// inChunk is how many values one "col IN (…)" condition carries (queryIn, queueHeld): a long
// list goes in several statements.
const inChunk = 500

// queryIn runs head + "col is one of vals" + tail, with args before the list's own, once per
// inChunk values, and hands every row to scan. what names the read in errors.
func (s *Store) queryIn(ctx context.Context, what, head string, args []any, col string, vals []string, tail string, scan func(Rows) error) error {
	for start := 0; start < len(vals); start += inChunk {
		cond, inArgs := s.in(col, vals[start:min(start+inChunk, len(vals))])
		rows, err := s.pool().query(ctx, head+cond+tail, append(slices.Clone(args), inArgs...)...)
		if err != nil {
			return s.errorf("%s: %w", what, err)
		}
		for rows.Next() {
			if err := scan(rows); err != nil {
				rows.Close()
				return s.errorf("%s: %w", what, err)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return s.errorf("%s: %w", what, err)
		}
	}
	return nil
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

// inTerminal is "(?, ?, …)" with one mark per terminal state, to follow "state IN" or
// "state NOT IN".
var inTerminal = "(" + placeholders(len(terminalStates)) + ")"

// Migrate applies the migrations in dir (goose SQL files, in the given goose dialect) that
// db has not seen yet; name prefixes errors.
func Migrate(ctx context.Context, name string, db *sql.DB, dialect goose.Dialect, dir fs.FS) error {
	p, err := goose.NewProvider(dialect, db, dir, goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return fmt.Errorf("%s: migrations: %w", name, err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("%s: migrate: %w", name, err)
	}
	return nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// Ping checks that the database answers and accepts a write (for /readyz, issue 15): a write
// transaction running an UPDATE that matches no row, rolled back, so nothing changes (SQLite
// takes its write lock; PostgreSQL refuses it on a read-only standby). It gives up after the
// dialect's PingTimeout (0: only when ctx ends).
func (s *Store) Ping(ctx context.Context) error {
	if s.d.PingTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.d.PingTimeout)
		defer cancel()
	}
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return s.errorf("ping: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "UPDATE templates SET name = name WHERE 1 = 0"); err != nil {
		return s.errorf("ping: write probe: %w", err)
	}
	return nil
}

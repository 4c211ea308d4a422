package berth_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "modernc.org/sqlite"
)

// refusedAddr returns a 127.0.0.1 address nothing listens on (a port just closed).
func refusedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// realErrors makes the failures Transient judges, from the real things that produce them.
func realErrors(t *testing.T) map[string]error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	errs := map[string]error{}
	addr := refusedAddr(t)

	_, errs["dial refused"] = net.Dial("tcp", addr)
	_, errs["pgconn connect refused"] = pgconn.Connect(ctx, "postgres://u@"+addr+"/db?sslmode=disable&connect_timeout=2")

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(-time.Second))
	_, errs["read timeout"] = c.Read(make([]byte, 1))

	dctx, dcancel := context.WithTimeout(ctx, 0)
	defer dcancel()
	<-dctx.Done()
	errs["context deadline"] = fmt.Errorf("postgres: sandboxes: %w", dctx.Err())

	errs["pg serialization failure"] = fmt.Errorf("postgres: %w", &pgconn.PgError{Code: "40001"})
	errs["pg deadlock"] = fmt.Errorf("postgres: %w", &pgconn.PgError{Code: "40P01"})
	errs["pg cannot connect now"] = &pgconn.PgError{Code: "57P03"}
	errs["pg unique violation"] = &pgconn.PgError{Code: "23505"}
	errs["pg syntax error"] = &pgconn.PgError{Code: "42601"}

	pool, err := pgxpool.New(ctx, "postgres://u@"+addr+"/db?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	pool.Close()
	_, errs["pgx closed pool"] = pool.Exec(ctx, "SELECT 1")

	path := filepath.Join(t.TempDir(), "busy.db")
	a, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(0)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(0)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := a.Exec("CREATE TABLE t (x INTEGER)"); err != nil {
		t.Fatal(err)
	}
	holder, err := a.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	_, errs["sqlite busy"] = b.ExecContext(ctx, "INSERT INTO t VALUES (1)")

	closed, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	_, errs["sql database is closed"] = closed.QueryContext(ctx, "SELECT 1")
	var n int
	errs["sqlite scan error"] = a.QueryRowContext(ctx, "SELECT 'x'").Scan(&n)
	_, errs["sqlite bad query"] = a.ExecContext(ctx, "SELEC 1")
	return errs
}

// TestTransient pins the one classification of store and network failures (issue 15):
// connection refused, timeouts, deadlines, PostgreSQL serialization failures, deadlocks and
// "cannot connect now", and SQLite busy are transient; a closed database or pool, a bad
// query, a scan error and a constraint violation are not.
func TestTransient(t *testing.T) {
	want := map[string]bool{
		"dial refused":             true,
		"pgconn connect refused":   true,
		"read timeout":             true,
		"context deadline":         true,
		"pg serialization failure": true,
		"pg deadlock":              true,
		"pg cannot connect now":    true,
		"sqlite busy":              true,
		"pg unique violation":      false,
		"pg syntax error":          false,
		"pgx closed pool":          false,
		"sql database is closed":   false,
		"sqlite scan error":        false,
		"sqlite bad query":         false,
	}
	for name, err := range realErrors(t) {
		if err == nil {
			t.Errorf("%s: the real thing did not fail", name)
			continue
		}
		if got := berth.Transient(err); got != want[name] {
			t.Errorf("Transient(%s: %v) = %v, want %v", name, err, got, want[name])
		}
	}
}

// TestFault pins what Fault makes of a cause: a transient one is unavailable (retryable,
// Retry-After), an *Error keeps its code, anything else is internal; the cause is always
// reachable with errors.Is and never part of the message.
func TestFault(t *testing.T) {
	refused := fmt.Errorf("postgres: %w", &pgconn.PgError{Code: "40001"})
	for _, tc := range []struct {
		cause      error
		code, msg  string
		retryAfter time.Duration
	}{
		{refused, berth.EUnavailable, "list sandboxes", berth.FaultRetryAfter},
		{sql.ErrConnDone, berth.EInternal, "list sandboxes", 0},
		{berth.Errorf(berth.ESandboxNotFound, "no sandbox x"), berth.ESandboxNotFound, "list sandboxes: no sandbox x", 0},
	} {
		e := berth.Fault(tc.cause, "list %s", "sandboxes")
		if e.Code != tc.code || e.Message != tc.msg || e.RetryAfter != tc.retryAfter {
			t.Errorf("Fault(%v) = {%s %q %v}, want {%s %q %v}", tc.cause, e.Code, e.Message, e.RetryAfter, tc.code, tc.msg, tc.retryAfter)
		}
		if !errors.Is(e, tc.cause) {
			t.Errorf("Fault(%v): errors.Is cannot reach the cause", tc.cause)
		}
	}
}

package pgtest

import (
	"context"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { Main(m) }

// connect opens a connection to dbURL, closed when t ends.
func connect(t *testing.T, dbURL string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatalf("connect %s: %v", dbURL, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// TestNewDatabase pins that each database is fresh, separate and dropped when its test ends.
func TestNewDatabase(t *testing.T) {
	c := Start(t)
	var name string
	t.Run("use", func(t *testing.T) {
		a, b := c.NewDatabase(t), c.NewDatabase(t)
		if a == b {
			t.Fatalf("two databases share the URL %s", a)
		}
		ca := connect(t, a)
		if _, err := ca.Exec(t.Context(), "CREATE TABLE x (id int)"); err != nil {
			t.Fatalf("create table: %v", err)
		}
		var n int
		err := connect(t, b).QueryRow(t.Context(), "SELECT count(*) FROM pg_tables WHERE tablename = 'x'").Scan(&n)
		if err != nil || n != 0 {
			t.Errorf("second database sees %d tables named x (%v), want 0", n, err)
		}
		u, _ := url.Parse(a)
		name = u.Path[1:]
	})
	var n int
	err := connect(t, c.admin.String()).QueryRow(t.Context(), "SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n)
	if err != nil || n != 0 {
		t.Errorf("database %s: %d rows in pg_database after its test (%v), want 0", name, n, err)
	}
}

// TestStopStart pins the outage helpers: a stopped cluster refuses connections and comes back
// on the same port with its data.
func TestStopStart(t *testing.T) {
	c := StartPrivate(t)
	db := c.NewDatabase(t)
	if _, err := connect(t, db).Exec(t.Context(), "CREATE TABLE kept (id int)"); err != nil {
		t.Fatalf("create table: %v", err)
	}
	c.Stop(t)
	if conn, err := pgx.Connect(t.Context(), db); err == nil {
		conn.Close(t.Context())
		t.Fatalf("connected to a stopped cluster")
	}
	c.Start(t)
	var n int
	if err := connect(t, db).QueryRow(t.Context(), "SELECT count(*) FROM pg_tables WHERE tablename = 'kept'").Scan(&n); err != nil || n != 1 {
		t.Errorf("after restart: %d tables named kept (%v), want 1", n, err)
	}
}

// TestSharedClusterCannotStop pins that a test cannot take the shared cluster away from the others.
func TestSharedClusterCannotStop(t *testing.T) {
	c := Start(t)
	if c.srv == nil {
		t.Skipf("%s is set: there is no shared throwaway cluster", EnvURL)
	}
	ft := &fatalRecorder{TB: t}
	func() {
		defer func() { _ = recover() }()
		c.own(ft)
	}()
	if !ft.failed {
		t.Errorf("own(shared cluster) did not fail the test")
	}
}

// TestUnavailable pins what a test does without PostgreSQL: skip on a developer machine, fail
// in CI (so CI cannot pass with the PostgreSQL tests silently skipped), fail on any other error.
func TestUnavailable(t *testing.T) {
	tests := []struct {
		name, ci string
		err      error
		want     string
	}{
		{"no binaries outside CI", "", errNoBinaries, "skip"},
		{"no binaries in CI", "true", errNoBinaries, "fail"},
		{"other failure outside CI", "", errPortBusy, "fail"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("CI", tc.ci)
			ft := &fatalRecorder{TB: t}
			func() {
				defer func() { _ = recover() }()
				unavailable(ft, tc.err)
			}()
			got := "nothing"
			switch {
			case ft.failed:
				got = "fail"
			case ft.skipped:
				got = "skip"
			}
			if got != tc.want {
				t.Errorf("unavailable(%v) with CI=%q: %s, want %s", tc.err, tc.ci, got, tc.want)
			}
		})
	}
}

// fatalRecorder records Fatalf and Skipf instead of ending the test; both panic to stop the
// caller, as the real ones stop its goroutine.
type fatalRecorder struct {
	testing.TB
	failed, skipped bool
}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.failed = true
	panic("fatal")
}

func (f *fatalRecorder) Skipf(format string, args ...any) {
	f.skipped = true
	panic("skip")
}

func (f *fatalRecorder) Helper() {}

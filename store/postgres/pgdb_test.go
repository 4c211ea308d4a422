package postgres

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berth-dev/berth/internal/pgtest"
	"github.com/berth-dev/berth/store/internal/sqlstore"
)

// beginTracer records the statements pgx sends on their own (not in a batch).
type beginTracer struct {
	mu     sync.Mutex
	alone  []string
	batchd int
}

func (b *beginTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.alone = append(b.alone, strings.ToLower(strings.TrimSpace(d.SQL)))
	return ctx
}

func (b *beginTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (b *beginTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.batchd++
	return ctx
}

func (b *beginTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (b *beginTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// lazyDB is a pgDB on a one-connection pool over a fresh database with a table t(x int
// primary key), and the tracer of its connection.
func lazyDB(t *testing.T) (pgDB, *beginTracer) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.Start(t).NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	tr := &beginTracer{}
	cfg.ConnConfig.Tracer = tr
	cfg.MaxConns = 1 // a connection a transaction failed to hand back would hang the next Begin
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(t.Context(), `CREATE TABLE t (x int PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	return pgDB{pool}, tr
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// exec drops an Exec's result, for must.
func exec[R any](_ R, err error) error { return err }

func countT(t *testing.T, db pgDB) int {
	t.Helper()
	var n int
	if err := db.QueryRow(t.Context(), `SELECT count(*) FROM t`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLazyBegin pins the transaction whose BEGIN rides with its first statement (issue 16,
// goal 1): no BEGIN is ever sent alone, whichever call comes first; what was sent commits or
// rolls back as a whole; a failed first statement fails the commit; and every transaction
// hands its connection back (the pool has one: a leak hangs the next Begin).
func TestLazyBegin(t *testing.T) {
	db, tr := lazyDB(t)
	ctx := t.Context()
	begin := func() sqlstore.TxConn {
		t.Helper()
		tx, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return tx
	}

	t.Run("nothing sent", func(t *testing.T) {
		must(t, begin().Commit(ctx))
		must(t, begin().Rollback(ctx))
	})
	t.Run("exec first, then more, commit", func(t *testing.T) {
		tx := begin()
		must(t, exec(tx.Exec(ctx, `INSERT INTO t VALUES (1)`)))
		must(t, exec(tx.Exec(ctx, `INSERT INTO t VALUES (2)`)))
		must(t, tx.Commit(ctx))
		if n := countT(t, db); n != 2 {
			t.Fatalf("rows after commit: %d, want 2", n)
		}
	})
	t.Run("query first, rollback", func(t *testing.T) {
		tx := begin()
		rows, err := tx.Query(ctx, `INSERT INTO t VALUES (3), (4) RETURNING x`)
		if err != nil {
			t.Fatal(err)
		}
		var got []int
		for rows.Next() {
			var x int
			if err := rows.Scan(&x); err != nil {
				t.Fatal(err)
			}
			got = append(got, x)
		}
		rows.Close()
		if err := rows.Err(); err != nil || len(got) != 2 {
			t.Fatalf("rows %v, err %v", got, err)
		}
		must(t, tx.Rollback(ctx))
		if n := countT(t, db); n != 2 {
			t.Fatalf("rows after rollback: %d, want 2", n)
		}
	})
	t.Run("query row first sees the transaction's own writes", func(t *testing.T) {
		tx := begin()
		var x int
		if err := tx.QueryRow(ctx, `INSERT INTO t VALUES (5) RETURNING x`).Scan(&x); err != nil || x != 5 {
			t.Fatalf("x %d, err %v", x, err)
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil || n != 3 {
			t.Fatalf("count inside: %d, err %v", n, err)
		}
		if err := tx.QueryRow(ctx, `SELECT x FROM t WHERE x = 99`).Scan(&x); !errors.Is(err, sql.ErrNoRows) {
			t.Fatalf("no row: %v, want sql.ErrNoRows", err)
		}
		must(t, tx.Rollback(ctx))
		tx = begin()
		if err := tx.QueryRow(ctx, `SELECT x FROM t WHERE x = 99`).Scan(&x); !errors.Is(err, sql.ErrNoRows) {
			t.Fatalf("no row as the first statement: %v, want sql.ErrNoRows", err)
		}
		must(t, tx.Commit(ctx))
	})
	t.Run("batch first", func(t *testing.T) {
		tx := begin()
		res := tx.(sqlstore.Batcher).SendBatch(ctx, []string{`INSERT INTO t VALUES (6)`, `SELECT count(*) FROM t`},
			[][]any{nil, nil})
		must(t, exec(res.Exec()))
		var n int
		if err := res.QueryRow().Scan(&n); err != nil || n != 3 {
			t.Fatalf("count in batch: %d, err %v", n, err)
		}
		must(t, res.Close())
		must(t, tx.Commit(ctx))
		if n := countT(t, db); n != 3 {
			t.Fatalf("rows after batch commit: %d, want 3", n)
		}
	})
	t.Run("failed first statement fails the commit", func(t *testing.T) {
		tx := begin()
		if _, err := tx.Exec(ctx, `INSERT INTO t VALUES (1)`); err == nil {
			t.Fatal("duplicate key accepted")
		}
		if err := tx.Commit(ctx); err == nil {
			t.Fatal("commit of a failed transaction succeeded")
		}
		tx = begin()
		res := tx.(sqlstore.Batcher).SendBatch(ctx, []string{`INSERT INTO t VALUES (7)`, `INSERT INTO t VALUES (1)`},
			[][]any{nil, nil})
		must(t, exec(res.Exec()))
		if _, err := res.Exec(); err == nil {
			t.Fatal("duplicate key in a batch accepted")
		}
		_ = res.Close()
		must(t, tx.Rollback(ctx))
		if n := countT(t, db); n != 3 {
			t.Fatalf("rows after failed transactions: %d, want 3", n)
		}
	})
	t.Run("connection killed under the transaction", func(t *testing.T) {
		before := countT(t, db)
		tx := begin()
		must(t, exec(tx.Exec(ctx, `INSERT INTO t VALUES (100)`)))
		var pid int
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		killer, err := pgx.Connect(ctx, db.pool.Config().ConnConfig.ConnString())
		if err != nil {
			t.Fatal(err)
		}
		defer killer.Close(ctx)
		if _, err := killer.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO t VALUES (101)`); err == nil {
			t.Error("a statement on a killed connection succeeded")
		}
		if err := tx.Commit(ctx); err == nil {
			t.Fatal("commit on a killed connection succeeded")
		}
		// The pool dropped the dead connection: the next transaction gets a live one, and
		// nothing of the killed transaction was kept.
		if n := countT(t, db); n != before {
			t.Fatalf("rows after the killed transaction: %d, want %d", n, before)
		}
	})

	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, q := range tr.alone {
		if strings.HasPrefix(q, "begin") {
			t.Errorf("a BEGIN went on a round trip of its own (statements sent alone: %q)", tr.alone)
			break
		}
	}
	if tr.batchd == 0 {
		t.Error("no pipeline was sent: the tracer saw nothing")
	}
}

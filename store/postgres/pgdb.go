package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/berth-dev/berth/store/internal/sqlstore"
)

// pgDB runs the shared queries on pgx natively (no database/sql in between): the pool, its
// transactions, and pgx.ErrNoRows reported as sql.ErrNoRows, as sqlstore expects.
type pgDB struct{ pool *pgxpool.Pool }

func (d pgDB) Exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	tag, err := d.pool.Exec(ctx, query, args...)
	return driver.RowsAffected(tag.RowsAffected()), err
}

func (d pgDB) Query(ctx context.Context, query string, args ...any) (sqlstore.Rows, error) {
	return d.pool.Query(ctx, query, args...)
}

func (d pgDB) QueryRow(ctx context.Context, query string, args ...any) sqlstore.Row {
	return pgRow{d.pool.QueryRow(ctx, query, args...)}
}

// Begin implements sqlstore.DB: it takes a pooled connection and sends nothing yet. The
// transaction's BEGIN goes to PostgreSQL in one pipeline with its first statement (or
// batch), which saves a round trip on every transaction (issue 16, goal 1; the dialect's
// LazyBegin tells the round-trip count).
func (d pgDB) Begin(ctx context.Context) (sqlstore.TxConn, error) {
	c, err := d.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return &pgTx{c: c}, nil
}

// SendBatch implements sqlstore.Batcher on the pool, outside any transaction of the store's:
// pgx sends the statements in one pipeline closed by a single Sync, so PostgreSQL runs them
// as one implicit transaction — committed at the Sync, or rolled back whole when one fails —
// and a row lock one of them takes is held until then.
//
// Once sent, the pipeline is not cancelled with ctx: its commit is implied, so a cancel could
// no longer undo it, only leave the caller told "failed" about writes that committed (found
// by an attack on the one-trip reserve: a create cancelled while it waited for the agent's
// row committed after the call returned its error). ctx bounds the wait for a pooled
// connection; after that the pipeline is bounded by PostgreSQL's lock_timeout
// (poolBatchLockTimeout, set for this transaction only: a lock it cannot get fails it whole,
// SQLSTATE 55P03, nothing written) and by poolBatchBound for a server that stops answering.
// The pooled connection goes back when the results are closed.
func (d pgDB) SendBatch(ctx context.Context, queries []string, args [][]any) sqlstore.BatchResults {
	c, err := d.pool.Acquire(ctx)
	if err != nil {
		return unsentBatch{err}
	}
	b := &pgx.Batch{}
	b.Queue(`SELECT set_config('lock_timeout', $1, true)`, poolBatchLockTimeout)
	for i, q := range queries {
		b.Queue(q, args[i]...)
	}
	sent, cancel := context.WithTimeout(context.WithoutCancel(ctx), poolBatchBound)
	br := c.SendBatch(sent, b)
	pb := &poolBatch{pgBatch: pgBatch{br}, release: func() { cancel(); c.Release() }}
	if _, err := br.Exec(); err != nil { // set_config's answer
		return failedPoolBatch{pb, err}
	}
	return pb
}

// A pool batch's bounds once sent (SendBatch): how long it may wait for a row lock, and for
// its answers in all.
var (
	poolBatchLockTimeout = "5s"
	poolBatchBound       = 30 * time.Second
)

// poolBatch is a pipeline on a connection of its own; Close reads it to its end, then hands
// the connection back.
type poolBatch struct {
	pgBatch
	release func()
}

func (b *poolBatch) Close() error {
	err := b.pgBatch.Close()
	b.release()
	return err
}

// failedPoolBatch is a sent pool batch whose first answer was an error: every answer is it.
type failedPoolBatch struct {
	pb  *poolBatch
	err error
}

func (f failedPoolBatch) Exec() (sql.Result, error)     { return nil, f.err }
func (f failedPoolBatch) QueryRow() sqlstore.Row        { return errRow{f.err} }
func (f failedPoolBatch) Query() (sqlstore.Rows, error) { return nil, f.err }
func (f failedPoolBatch) Close() error                  { _ = f.pb.Close(); return f.err }

// unsentBatch is a batch that never left: no connection could be had. Every answer is err.
type unsentBatch struct{ err error }

func (u unsentBatch) Exec() (sql.Result, error)     { return nil, u.err }
func (u unsentBatch) QueryRow() sqlstore.Row        { return errRow{u.err} }
func (u unsentBatch) Query() (sqlstore.Rows, error) { return nil, u.err }
func (u unsentBatch) Close() error                  { return u.err }

func (d pgDB) Close() error {
	d.pool.Close()
	return nil
}

// pgTx is one transaction on a pooled connection. Until its first statement it has sent
// nothing (tx nil); that statement goes in one pipeline behind BEGIN (pgx's Batch.BeginTx),
// and the transaction pgx began then carries the rest, its commit and its rollback.
type pgTx struct {
	c  *pgxpool.Conn
	tx pgx.Tx
}

// first sends b, whose first query is its BEGIN (Batch.BeginTx), and reads BEGIN's answer;
// the statements' answers are left to read.
func (t *pgTx) first(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	br := t.c.SendBatch(ctx, b)
	t.tx = br.Tx()
	if _, err := br.Exec(); err != nil {
		return failedBatch{BatchResults: br, err: err}
	}
	return br
}

// beginWith is a batch of BEGIN then query.
func beginWith(query string, args []any) *pgx.Batch {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(query, args...)
	return b
}

func (t *pgTx) Exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if t.tx != nil {
		tag, err := t.tx.Exec(ctx, query, args...)
		return driver.RowsAffected(tag.RowsAffected()), err
	}
	br := t.first(ctx, beginWith(query, args))
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return driver.RowsAffected(tag.RowsAffected()), err
}

func (t *pgTx) Query(ctx context.Context, query string, args ...any) (sqlstore.Rows, error) {
	if t.tx != nil {
		return t.tx.Query(ctx, query, args...)
	}
	br := t.first(ctx, beginWith(query, args))
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return batchRows{Rows: rows, br: br}, nil
}

func (t *pgTx) QueryRow(ctx context.Context, query string, args ...any) sqlstore.Row {
	if t.tx != nil {
		return pgRow{t.tx.QueryRow(ctx, query, args...)}
	}
	br := t.first(ctx, beginWith(query, args))
	return batchRow{row: br.QueryRow(), br: br}
}

// Commit commits what was sent (nothing to do when nothing was) and hands the connection
// back to the pool, which discards it if the commit left it broken.
func (t *pgTx) Commit(ctx context.Context) error {
	defer t.c.Release()
	if t.tx == nil {
		return nil
	}
	return t.tx.Commit(ctx)
}

// Rollback rolls back what was sent and hands the connection back, as Commit.
func (t *pgTx) Rollback(ctx context.Context) error {
	defer t.c.Release()
	if t.tx == nil {
		return nil
	}
	return t.tx.Rollback(ctx)
}

// batchRows are a pipeline's rows; closing them also reads the pipeline to its end.
type batchRows struct {
	pgx.Rows
	br pgx.BatchResults
}

func (r batchRows) Close() {
	r.Rows.Close()
	_ = r.br.Close()
}

// batchRow is a pipeline's single row; scanning it also reads the pipeline to its end.
type batchRow struct {
	row pgx.Row
	br  pgx.BatchResults
}

func (r batchRow) Scan(dest ...any) error {
	err := pgRow{r.row}.Scan(dest...)
	if cerr := r.br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	return err
}

// failedBatch is a pipeline whose BEGIN failed: every answer is that failure.
type failedBatch struct {
	pgx.BatchResults
	err error
}

func (f failedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, f.err }
func (f failedBatch) Query() (pgx.Rows, error)         { return nil, f.err }
func (f failedBatch) QueryRow() pgx.Row                { return errRow{f.err} }
func (f failedBatch) Close() error {
	_ = f.BatchResults.Close()
	return f.err
}

// errRow is a row whose Scan fails with err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// pgRow is a pgx.Row whose "no rows" is sql.ErrNoRows.
type pgRow struct{ row pgx.Row }

func (r pgRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return sql.ErrNoRows
	}
	return err
}

// SendBatch implements sqlstore.Batcher with pgx's pipeline: the statements go in one round
// trip (behind BEGIN when they are the transaction's first) and run in order in the
// transaction.
func (t *pgTx) SendBatch(ctx context.Context, queries []string, args [][]any) sqlstore.BatchResults {
	b := &pgx.Batch{}
	if t.tx == nil {
		b.BeginTx(pgx.TxOptions{})
	}
	for i, q := range queries {
		b.Queue(q, args[i]...)
	}
	if t.tx == nil {
		return pgBatch{t.first(ctx, b)}
	}
	return pgBatch{t.tx.SendBatch(ctx, b)}
}

// pgBatch is pgx.BatchResults as sqlstore.BatchResults.
type pgBatch struct{ br pgx.BatchResults }

func (b pgBatch) Exec() (sql.Result, error) {
	tag, err := b.br.Exec()
	return driver.RowsAffected(tag.RowsAffected()), err
}

func (b pgBatch) QueryRow() sqlstore.Row { return pgRow{b.br.QueryRow()} }
func (b pgBatch) Close() error           { return b.br.Close() }

func (b pgBatch) Query() (sqlstore.Rows, error) {
	rows, err := b.br.Query()
	if err != nil {
		return nil, err
	}
	return rows, nil
}

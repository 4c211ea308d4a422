package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"

	"github.com/jackc/pgx/v5"
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

func (d pgDB) Begin(ctx context.Context) (sqlstore.TxConn, error) {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return pgTx{tx}, nil
}

func (d pgDB) Close() error {
	d.pool.Close()
	return nil
}

type pgTx struct{ tx pgx.Tx }

func (t pgTx) Exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	tag, err := t.tx.Exec(ctx, query, args...)
	return driver.RowsAffected(tag.RowsAffected()), err
}

func (t pgTx) Query(ctx context.Context, query string, args ...any) (sqlstore.Rows, error) {
	return t.tx.Query(ctx, query, args...)
}

func (t pgTx) QueryRow(ctx context.Context, query string, args ...any) sqlstore.Row {
	return pgRow{t.tx.QueryRow(ctx, query, args...)}
}

func (t pgTx) Commit(ctx context.Context) error   { return t.tx.Commit(ctx) }
func (t pgTx) Rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

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
// trip and run in order in the transaction.
func (t pgTx) SendBatch(ctx context.Context, queries []string, args [][]any) sqlstore.BatchResults {
	b := &pgx.Batch{}
	for i, q := range queries {
		b.Queue(q, args[i]...)
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

package sqlstore

import (
	"context"
	"database/sql"
)

// Batcher is a TxConn that can send several statements in one round trip (PostgreSQL's
// pipeline: pgx.Batch). The database runs them in order, each as its own statement (under
// READ COMMITTED each takes its snapshot when it starts, after the ones before it ended).
// A TxConn without it runs a batch's statements one after another (SQLite: no network).
type Batcher interface {
	SendBatch(ctx context.Context, queries []string, args [][]any) BatchResults
}

// BatchResults are a sent batch's results, read in the order the statements were queued,
// each exactly once; Close reads (and so runs) whatever was not read, and must be called
// before the transaction is used again.
type BatchResults interface {
	Exec() (sql.Result, error)
	QueryRow() Row
	// Query answers a statement of any number of rows; they must be read (or closed)
	// before the next result.
	Query() (Rows, error)
	Close() error
}

// batch queues '?' statements of a transaction to send together (Tx.send).
type batch struct {
	queries []string
	args    [][]any
}

func (b *batch) queue(query string, args ...any) {
	b.queries = append(b.queries, query)
	b.args = append(b.args, args)
}

// send sends b in one round trip where the database allows it, and returns its results. On
// a transaction (Tx.send) the statements run in it; on the pool (Store.pool) only a Batcher
// is atomic — its one pipeline is one implicit transaction — so callers check for one first.
func (c conn) send(ctx context.Context, b *batch) BatchResults {
	queries := make([]string, len(b.queries))
	for i, q := range b.queries {
		queries[i] = c.rebind(q)
	}
	if bt, ok := c.q.(Batcher); ok {
		c.trips.Add(1)
		return bt.SendBatch(ctx, queries, b.args)
	}
	c.trips.Add(int64(len(queries)))
	return &seqResults{ctx: ctx, q: c.q, queries: queries, args: b.args}
}

// seqResults runs a batch on a Querier one statement at a time, each when its result is read.
type seqResults struct {
	ctx     context.Context
	q       Querier
	queries []string
	args    [][]any
	next    int
}

func (r *seqResults) Exec() (sql.Result, error) {
	i := r.next
	r.next++
	return r.q.Exec(r.ctx, r.queries[i], r.args[i]...)
}

func (r *seqResults) QueryRow() Row {
	i := r.next
	r.next++
	return r.q.QueryRow(r.ctx, r.queries[i], r.args[i]...)
}

func (r *seqResults) Query() (Rows, error) {
	i := r.next
	r.next++
	return r.q.Query(r.ctx, r.queries[i], r.args[i]...)
}

func (r *seqResults) Close() error {
	for r.next < len(r.queries) {
		if _, err := r.Exec(); err != nil {
			return err
		}
	}
	return nil
}

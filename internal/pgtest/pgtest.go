// Package pgtest gives tests a throwaway PostgreSQL (issue 3, "Many replicas, one truth").
//
// Start returns a cluster shared by every test of the test binary: it is started on first use
// from the installed server binaries (the directory of initdb in $PATH, else the newest
// /usr/lib/postgresql/<version>/bin), listens on a free port of 127.0.0.1 only, trusts local
// connections and trades durability for speed (fsync=off). NewDatabase hands each test a fresh
// empty database that is dropped when the test ends. StartPrivate starts a cluster of the
// test's own, which it may Stop and Start again (same port, same data) to test outages.
//
// Set BERTH_TEST_POSTGRES_URL to use an existing server instead (tests then create and drop
// databases on it; outage tests skip). Without binaries and without that variable the tests
// skip, unless $CI is "true": in CI a missing PostgreSQL fails the test.
//
// Cleanup: call Main from TestMain so the shared cluster stops and its directory goes when the
// tests end, pass or fail. Every postmaster is a child of the test process, stopped by its PID;
// if the test process dies anyway the kernel sends the postmaster SIGQUIT (Pdeathsig), and the
// next Start removes directories such dead runs left behind.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvURL names the environment variable holding the URL of an existing PostgreSQL server the
// tests may create and drop databases on (its user needs CREATEDB).
const EnvURL = "BERTH_TEST_POSTGRES_URL"

// adminTimeout bounds one administrative statement (CREATE or DROP DATABASE).
const adminTimeout = 30 * time.Second

// Cluster is a PostgreSQL server tests create databases on.
type Cluster struct {
	admin   *url.URL // URL of the maintenance database; a database URL swaps its path
	private bool     // started by StartPrivate: its test may Stop and Start it

	mu  sync.Mutex
	srv *server // nil for the external server of EnvURL
}

var shared struct {
	mu  sync.Mutex
	c   *Cluster
	err error // the first start's failure, repeated to every later caller
}

// dbSeq numbers the databases of this process.
var dbSeq atomic.Int64

// Start returns the cluster shared by the tests of this binary, starting it on first use. It
// skips tb when no PostgreSQL is available, or fails it when $CI is "true" (see the package
// doc).
func Start(tb testing.TB) *Cluster {
	tb.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.c == nil && shared.err == nil {
		shared.c, shared.err = open()
	}
	if shared.err != nil {
		unavailable(tb, shared.err)
	}
	return shared.c
}

// StartPrivate starts a cluster for tb alone, removed when tb ends; tb may Stop and Start it.
// With BERTH_TEST_POSTGRES_URL set it skips tb, since an outside server is not ours to stop.
func StartPrivate(tb testing.TB) *Cluster {
	tb.Helper()
	if os.Getenv(EnvURL) != "" {
		tb.Skipf("pgtest: %s is set; this test stops and starts PostgreSQL, which needs a throwaway cluster (unset %s to run it)", EnvURL, EnvURL)
	}
	srv, err := newServer()
	if err != nil {
		unavailable(tb, err)
	}
	c := &Cluster{admin: mustParse(srv.url("postgres")), private: true, srv: srv}
	tb.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if err := srv.remove(); err != nil {
			tb.Errorf("pgtest: %v", err)
		}
	})
	return c
}

// Main runs the tests of m, stops the shared cluster and exits with the tests' code. Call it
// from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if err := Shutdown(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// Shutdown stops the shared cluster, if one was started, and removes its directory.
func Shutdown() error {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	c := shared.c
	shared.c, shared.err = nil, errors.New("pgtest: shared cluster already shut down")
	if c == nil || c.srv == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.srv.remove()
}

// open starts the shared cluster, or connects to the server of EnvURL.
func open() (*Cluster, error) {
	if raw := os.Getenv(EnvURL); raw != "" {
		u, err := url.Parse(raw)
		if err != nil {
			return nil, fmt.Errorf("pgtest: %s: %w", EnvURL, err)
		}
		c := &Cluster{admin: u}
		ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
		defer cancel()
		conn, err := pgx.Connect(ctx, raw)
		if err != nil {
			return nil, fmt.Errorf("pgtest: %s: %w", EnvURL, err)
		}
		conn.Close(ctx)
		return c, nil
	}
	srv, err := newServer()
	if err != nil {
		return nil, err
	}
	return &Cluster{admin: mustParse(srv.url("postgres")), srv: srv}, nil
}

// unavailable ends tb because no server could be had: a skip when PostgreSQL is simply not
// installed (outside CI), a failure otherwise.
func unavailable(tb testing.TB, err error) {
	tb.Helper()
	if errors.Is(err, errNoBinaries) && os.Getenv("CI") != "true" {
		tb.Skipf("pgtest: %v", err)
	}
	tb.Fatalf("pgtest: %v", err)
}

// NewDatabase creates a fresh empty database and returns its URL; the database is dropped
// (forcibly, closing leftover connections) when tb ends.
func (c *Cluster) NewDatabase(tb testing.TB) string {
	tb.Helper()
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	name := fmt.Sprintf("berth_test_%d_%d_%s", os.Getpid(), dbSeq.Add(1), hex.EncodeToString(rnd[:]))
	if err := c.exec("CREATE DATABASE " + pgx.Identifier{name}.Sanitize()); err != nil {
		tb.Fatalf("pgtest: create database: %v", err)
	}
	tb.Cleanup(func() {
		c.mu.Lock()
		down := c.srv != nil && c.srv.cmd == nil
		c.mu.Unlock()
		if down {
			return // a private cluster left stopped: its directory goes with it
		}
		if err := c.exec("DROP DATABASE IF EXISTS " + pgx.Identifier{name}.Sanitize() + " WITH (FORCE)"); err != nil {
			tb.Errorf("pgtest: drop database: %v", err)
		}
	})
	u := *c.admin
	u.Path = "/" + name
	return u.String()
}

// exec runs one statement on the maintenance database.
func (c *Cluster) exec(sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.admin.String())
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// Stop shuts the server down (fast shutdown) and waits until it is gone; connections break and
// new ones are refused. Only a cluster from StartPrivate may be stopped.
func (c *Cluster) Stop(tb testing.TB) {
	tb.Helper()
	srv := c.own(tb)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := srv.stop(); err != nil {
		tb.Fatalf("pgtest: stop: %v", err)
	}
}

// Start starts a stopped server again on the same port with the same data and waits until it
// accepts connections. Starting a running server does nothing.
func (c *Cluster) Start(tb testing.TB) {
	tb.Helper()
	srv := c.own(tb)
	c.mu.Lock()
	defer c.mu.Unlock()
	if srv.cmd != nil {
		return
	}
	if err := srv.start(); err != nil {
		tb.Fatalf("pgtest: restart: %v", err)
	}
}

// own returns the server of a private cluster or ends tb.
func (c *Cluster) own(tb testing.TB) *server {
	tb.Helper()
	switch {
	case c.srv == nil:
		tb.Skipf("pgtest: the server of %s is not ours to stop", EnvURL)
	case !c.private:
		tb.Fatalf("pgtest: the shared cluster cannot be stopped; use StartPrivate")
	}
	return c.srv
}

func mustParse(raw string) *url.URL {
	u, err := url.Parse(raw)
	if err != nil {
		panic(err)
	}
	return u
}

// Package httpbound bounds what one client can hold of an HTTP server (issue 15, point 3):
// how long headers and bodies may take, how long a connection may sit idle, how big headers
// may be, and how many connections a listener keeps open at once. `berth server`, `berth dev`
// and the agent's internal API build their http.Server with it.
//
// Request bodies get a minimum-rate deadline instead of a flat ReadTimeout, so a large file
// upload on a slow link is not cut while a body trickled at one byte per few seconds is: the
// read deadline starts at BodyTimeout after the headers and moves BodyMinRate-worth of time
// later for every byte that arrives (deadline = start + BodyTimeout + bytes/BodyMinRate).
// Once the body is read to its end the deadline is cleared, so a long answer (an exec stream,
// an app's event stream) is not cut by it. There is no global WriteTimeout: a write deadline
// of WriteTimeout is set per request only for requests the caller's longLived predicate does
// not name (exec streams, app proxying, file reads); hijacked connections (WebSocket
// upgrades) have their deadlines cleared by net/http.
package httpbound

import (
	"container/list"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/berth-dev/berth/internal/conf"
)

// Limits are the bounds of one listener and its server. Zero fields take the defaults of
// [DefaultLimits] through [Limits.WithDefaults]; a negative MaxConns means no cap.
type Limits struct {
	// MaxConns caps the connections the listener holds open at once. When it is reached, the
	// connection idle the longest (accepted but silent, or a keep-alive between requests) is
	// closed to make room; when none is idle, Accept waits for one to end.
	MaxConns int
	// ReadHeaderTimeout bounds reading a request's headers.
	ReadHeaderTimeout time.Duration
	// BodyTimeout is the time a request body has before BodyMinRate (bytes per second) of
	// arriving data extends it.
	BodyTimeout time.Duration
	BodyMinRate int64
	// IdleTimeout closes a keep-alive connection with no request for this long.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's header block.
	MaxHeaderBytes int
	// WriteTimeout bounds writing the answer of a request that is not long-lived, counted
	// from the end of its headers.
	WriteTimeout time.Duration
}

// DefaultLimits are the server's defaults: 4096 connections, 10 s for headers, 30 s for a
// body plus one second per 4 KiB received, 120 s idle, 1 MiB of headers, 5 min per answer.
func DefaultLimits() Limits {
	return Limits{
		MaxConns:          4096,
		ReadHeaderTimeout: 10 * time.Second,
		BodyTimeout:       30 * time.Second,
		BodyMinRate:       4 << 10,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    1 << 20,
		WriteTimeout:      5 * time.Minute,
	}
}

// WithDefaults returns l with every zero field set from [DefaultLimits].
func (l Limits) WithDefaults() Limits {
	d := DefaultLimits()
	if l.MaxConns == 0 {
		l.MaxConns = d.MaxConns
	}
	l.ReadHeaderTimeout = conf.Or(l.ReadHeaderTimeout, d.ReadHeaderTimeout)
	l.BodyTimeout = conf.Or(l.BodyTimeout, d.BodyTimeout)
	l.BodyMinRate = conf.Or(l.BodyMinRate, d.BodyMinRate)
	l.IdleTimeout = conf.Or(l.IdleTimeout, d.IdleTimeout)
	l.MaxHeaderBytes = conf.Or(l.MaxHeaderBytes, d.MaxHeaderBytes)
	l.WriteTimeout = conf.Or(l.WriteTimeout, d.WriteTimeout)
	return l
}

// Serve serves h on ln under l until the returned server is shut down: it returns the server
// (for Shutdown) and the listener to pass to its Serve. longLived names the requests that get
// no write deadline; nil means none.
func (l Limits) Serve(ln net.Listener, h http.Handler, longLived func(*http.Request) bool) (*http.Server, net.Listener) {
	l = l.WithDefaults()
	srv := &http.Server{
		Handler:           l.handler(h, longLived),
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
	}
	if l.MaxConns < 0 {
		return srv, ln
	}
	cl := newConnLimiter(ln, l.MaxConns)
	srv.ConnState = cl.state
	return srv, cl
}

// handler sets the per-request deadlines described in the package doc.
func (l Limits) handler(next http.Handler, longLived func(*http.Request) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		now := time.Now()
		if longLived == nil || !longLived(r) {
			_ = rc.SetWriteDeadline(now.Add(l.WriteTimeout))
		}
		if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
			b := &rateBody{ReadCloser: r.Body, rc: rc, start: now, base: l.BodyTimeout, rate: l.BodyMinRate}
			_ = rc.SetReadDeadline(b.deadline())
			r.Body = b
		}
		next.ServeHTTP(w, r)
	})
}

// rateBody moves the connection's read deadline later as body bytes arrive and clears it at
// the end of the body.
type rateBody struct {
	io.ReadCloser
	rc    *http.ResponseController
	start time.Time
	base  time.Duration
	rate  int64
	n     int64
	done  bool
}

func (b *rateBody) deadline() time.Time {
	return b.start.Add(b.base + time.Duration(float64(b.n)/float64(b.rate)*float64(time.Second)))
}

func (b *rateBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n += int64(n)
	switch {
	case b.done:
	case err == io.EOF:
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	case n > 0:
		_ = b.rc.SetReadDeadline(b.deadline())
	}
	return n, err
}

// connLimiter is a listener holding at most max connections open; at the cap it closes the
// connection idle the longest, or waits for one to end.
type connLimiter struct {
	net.Listener
	max   int
	mu    sync.Mutex
	cond  *sync.Cond
	open  int
	shut  bool
	idle  *list.List // of *limitedConn, longest idle first
	elems map[*limitedConn]*list.Element
}

func newConnLimiter(ln net.Listener, max int) *connLimiter {
	c := &connLimiter{Listener: ln, max: max, idle: list.New(), elems: map[*limitedConn]*list.Element{}}
	c.cond = sync.NewCond(&c.mu)
	return c
}

// Accept waits for a free slot (closing the longest-idle connection when there is none),
// then accepts.
func (c *connLimiter) Accept() (net.Conn, error) {
	c.mu.Lock()
	for c.open >= c.max && !c.shut {
		if e := c.idle.Front(); e != nil {
			victim := e.Value.(*limitedConn)
			c.removeIdleLocked(victim)
			c.mu.Unlock()
			_ = victim.Close() // releases its slot
			c.mu.Lock()
			continue
		}
		c.cond.Wait()
	}
	c.open++
	c.mu.Unlock()
	conn, err := c.Listener.Accept()
	if err != nil {
		c.release()
		return nil, err
	}
	return &limitedConn{Conn: conn, l: c}, nil
}

// Close closes the listener and wakes an Accept waiting for a slot.
func (c *connLimiter) Close() error {
	c.mu.Lock()
	c.shut = true
	c.mu.Unlock()
	c.cond.Broadcast()
	return c.Listener.Close()
}

func (c *connLimiter) release() {
	c.mu.Lock()
	c.open--
	c.mu.Unlock()
	c.cond.Signal()
}

func (c *connLimiter) removeIdleLocked(lc *limitedConn) {
	if e, ok := c.elems[lc]; ok {
		c.idle.Remove(e)
		delete(c.elems, lc)
	}
}

// state is the server's ConnState hook: new and idle connections may be evicted, active and
// hijacked ones may not. Over TLS the server reports the *tls.Conn around the accepted one.
func (c *connLimiter) state(conn net.Conn, s http.ConnState) {
	if tc, ok := conn.(*tls.Conn); ok {
		conn = tc.NetConn()
	}
	lc, ok := conn.(*limitedConn)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removeIdleLocked(lc)
	if (s == http.StateNew || s == http.StateIdle) && !lc.closed {
		c.elems[lc] = c.idle.PushBack(lc)
	}
}

// Open reports how many connections the listener holds (for tests and metrics).
func (c *connLimiter) Open() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.open
}

type limitedConn struct {
	net.Conn
	l      *connLimiter
	once   sync.Once
	closed bool // under l.mu
}

func (lc *limitedConn) Close() error {
	err := lc.Conn.Close()
	lc.once.Do(func() {
		lc.l.mu.Lock()
		lc.closed = true
		lc.l.removeIdleLocked(lc)
		lc.l.open--
		lc.l.mu.Unlock()
		lc.l.cond.Signal()
	})
	return err
}
